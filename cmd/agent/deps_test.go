package main

import (
	"os/exec"
	"strings"
	"testing"
)

// linkedNot are the packages the agent may not link: Kubernetes' client libraries, the API
// machinery and its scheme registrations, the aggregated API server and controller-runtime,
// whose logger shim alone (a logr delegate without dependencies) the admission library logs
// through. The agent reads no Kubernetes API; a pod should not pay for one in every sidecar.
var linkedNot = []string{
	"k8s.io/client-go/",
	"k8s.io/apiserver/",
	"k8s.io/api/",
	"k8s.io/apimachinery/",
	"k8s.io/kube-openapi/",
	"sigs.k8s.io/controller-runtime/",
	"github.com/vancetope/lease-operator/api/v1alpha1",
}

var linkedAnyway = map[string]bool{"sigs.k8s.io/controller-runtime/pkg/log": true}

func forbidden(deps []string) []string {
	var out []string
	for _, d := range deps {
		if linkedAnyway[d] {
			continue
		}
		for _, p := range linkedNot {
			if strings.HasPrefix(d+"/", p) || strings.HasPrefix(d, p) {
				out = append(out, d)
				break
			}
		}
	}
	return out
}

func deps(t *testing.T, pkg string) []string {
	t.Helper()
	out, err := exec.Command("go", "list", "-deps", pkg).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", pkg, err)
	}
	return strings.Fields(string(out))
}

// TestAgentLinksNoKubernetesClient reads the agent's dependency set as the linker sees it.
// The manager's, read the same way, must show what the agent's may not contain: the check
// finds what it looks for.
func TestAgentLinksNoKubernetesClient(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	if bad := forbidden(deps(t, "github.com/vancetope/lease-operator/cmd/agent")); len(bad) > 0 {
		t.Errorf("the agent links %d packages it may not, among them %v", len(bad), bad[:min(len(bad), 10)])
	}
	manager := forbidden(deps(t, "github.com/vancetope/lease-operator/cmd/manager"))
	for _, want := range []string{"sigs.k8s.io/controller-runtime/pkg/manager", "k8s.io/client-go/tools/cache", "k8s.io/apiserver/pkg/server"} {
		found := false
		for _, d := range manager {
			found = found || d == want
		}
		if !found {
			t.Errorf("the manager's dependency set, read the same way, has no %s: the check would miss it", want)
		}
	}
}
