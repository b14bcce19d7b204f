package main

import (
	"strings"
	"testing"

	"github.com/vancetope/lease-operator/internal/serving"
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
		"a defaults dir": {flags: agentFlags{managerURL: "http://manager:8082", store: serving.StoreFlags{DefaultsDir: "/etc/lease"}}, key: "k",
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
