package main

import (
	"os"
	"strings"
	"testing"

	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// TestMain stops the development store the admission tests start.
func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
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
