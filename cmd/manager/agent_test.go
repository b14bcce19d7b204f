package main

import (
	"strings"
	"testing"
)

// The agent asks the manager for everything it resolves: without the manager's URL or a key
// to sign with it could never answer, so it does not start.
func TestAgentFlagsCheck(t *testing.T) {
	cases := map[string]struct {
		flags   agentFlags
		key     string
		wantErr []string
	}{
		"manager and key": {flags: agentFlags{managerURL: "http://manager:8082"}, key: "k"},
		"no manager":      {key: "k", wantErr: []string{"--manager-url"}},
		"no key":          {flags: agentFlags{managerURL: "http://manager:8082"}, wantErr: []string{"no agent key"}},
		"a defaults dir": {flags: agentFlags{managerURL: "http://manager:8082", store: storeFlags{defaultsDir: "/etc/lease"}}, key: "k",
			wantErr: []string{"--defaults-dir is the manager's"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := tc.flags.check(tc.key)
			if len(tc.wantErr) == 0 && err != nil {
				t.Errorf("check() = %v, want nil", err)
			}
			for _, want := range tc.wantErr {
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("check() = %v, want %q", err, want)
				}
			}
		})
	}
}

// The webhook gives agents the manager's URL; a manager that injects without one refuses to
// start rather than inject agents that can never resolve.
func TestManagerValidateAgentManagerURL(t *testing.T) {
	base := managerFlags{reconcileSafety: 10 * 60e9}
	f := base
	f.agentImage = "example.com/lease-operator:dev"
	if err := f.validate(); err == nil || !strings.Contains(err.Error(), "--agent-manager-url") {
		t.Errorf("validate() with --agent-image only = %v, want an error about --agent-manager-url", err)
	}
	f.agentManagerURL = "http://lease-operator-admission.lease-operator-system.svc:8082"
	if err := f.validate(); err != nil {
		t.Errorf("validate() = %v", err)
	}
}
