package main

import (
	"context"
	"errors"
	"flag"
	"strings"
	"testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
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

// The manager refuses callers that are no pod unless the development flag is given: the
// deployed manifests (config/manager) do not give it.
func TestManagerBinderNonPodCallers(t *testing.T) {
	tenants := tenancy.Static{System: "lease-system", Tenants: map[string]string{"acme": "acme"}}
	host := tenancy.Caller{Addr: "10.0.0.9"}
	for _, tc := range []struct {
		args    []string
		wantErr bool
	}{
		{args: nil, wantErr: true},
		{args: []string{"--allow-non-pod-callers"}, wantErr: false},
	} {
		var f managerFlags
		fs := flag.NewFlagSet("manager", flag.ContinueOnError)
		f.bind(fs)
		if err := fs.Parse(tc.args); err != nil {
			t.Fatal(err)
		}
		_, err := managerBinder(tenants, f.allowNonPod)(context.Background(), host, "acme")
		if got := errors.Is(err, lease.ErrTenantForbidden); got != tc.wantErr {
			t.Errorf("args %v: non-pod caller for acme = %v, want refused %v", tc.args, err, tc.wantErr)
		}
		// A pod is bound either way.
		if _, err := managerBinder(tenants, f.allowNonPod)(context.Background(), tenancy.Caller{Pod: lease.PodRef{Namespace: "acme", Name: "app"}}, "globex"); !errors.Is(err, lease.ErrTenantForbidden) {
			t.Errorf("args %v: acme pod for globex = %v, want TENANT_FORBIDDEN", tc.args, err)
		}
	}
}
