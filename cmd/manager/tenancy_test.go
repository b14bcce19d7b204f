package main

import (
	"strings"
	"testing"
)

func TestTenancyFlagsCheck(t *testing.T) {
	cases := map[string]struct {
		flags      tenancyFlags
		namespaces []string
		wantErr    string
	}{
		"system namespace, all namespaces":      {flags: tenancyFlags{systemNamespace: "lease-system"}},
		"system namespace among the namespaces": {flags: tenancyFlags{systemNamespace: "lease-system"}, namespaces: []string{"acme", "lease-system"}},
		"no system namespace":                   {wantErr: "--system-namespace is required"},
		"system namespace not read": {flags: tenancyFlags{systemNamespace: "lease-system"}, namespaces: []string{"acme"},
			wantErr: `must include the system namespace "lease-system"`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.flags.check(tc.namespaces)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Errorf("check() = %v, want %q", err, tc.wantErr)
			}
		})
	}
}

func TestAgentTenancyRefusesADefaultsDir(t *testing.T) {
	flags := tenancyFlags{systemNamespace: "lease-system", builtinConfigMap: "builtin"}
	got, err := agentTenancy(flags, []string{"lease-system", "acme"}, "")
	if err != nil || got.SystemNamespace != "lease-system" || got.BuiltinConfigMap != "builtin" || len(got.Namespaces) != 2 {
		t.Errorf("agentTenancy() = %+v, %v", got, err)
	}
	if _, err := agentTenancy(flags, nil, "/etc/lease/defaults"); err == nil || !strings.Contains(err.Error(), "--builtin-configmap") {
		t.Errorf("agentTenancy() with --defaults-dir = %v, want an error pointing to --builtin-configmap", err)
	}
}
