package main

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"

	"github.com/vancetope/lease-operator/internal/testutil/agentbuild"
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

// linkedNotAsShipped are symbol prefixes of which the agent's binary, built as the image
// builds it, may hold no more than a package's init and stubs (leanSlack): net/http's HTTP/2
// (agentbuild.Tags leaves it out) and a YAML parser (the OpenAPI document is embedded as
// JSON). Each was a quarter to half a MiB of the binary and of its resident memory
// (docs/figures.md, "Agent footprint").
var linkedNotAsShipped = []string{"net/http.http2", "net/http.(*http2", "go.yaml.in/yaml", "sigs.k8s.io/yaml"}

const leanSlack = 16 << 10

// TestTheShippedAgentIsLean builds the agent as agentbuild does and sums its symbols' sizes;
// the Dockerfile and the Makefile must build it with the same tags.
func TestTheShippedAgentIsLean(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent")
	}
	bin, err := agentbuild.Build("go", "../..", t.TempDir(), []string{"CGO_ENABLED=0"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "tool", "nm", "-size", bin).Output()
	if err != nil {
		t.Fatalf("go tool nm: %v", err)
	}
	size := map[string]int{}
	for _, line := range strings.Split(string(out), "\n") {
		f := strings.Fields(line) // address, size, kind, name
		if len(f) < 4 {
			continue
		}
		n, _ := strconv.Atoi(f[1])
		for _, p := range linkedNotAsShipped {
			if strings.HasPrefix(f[3], p) {
				size[p] += n
			}
		}
	}
	for p, n := range size {
		if n > leanSlack {
			t.Errorf("the agent as shipped links %d KiB of %s", n>>10, p)
		}
	}
	for _, file := range []string{"../../Dockerfile", "../../Makefile"} {
		raw, err := os.ReadFile(file)
		if err != nil {
			t.Fatal(err)
		}
		builds := 0
		for _, line := range strings.Split(string(raw), "\n") {
			if strings.Contains(line, "go build") && strings.Contains(line, "./cmd/agent") {
				builds++
				if !strings.Contains(line, "-tags "+agentbuild.Tags) {
					t.Errorf("%s builds the agent without -tags %s: %s", file, agentbuild.Tags, strings.TrimSpace(line))
				}
			}
		}
		if builds == 0 {
			t.Errorf("%s builds no ./cmd/agent", file)
		}
	}
}
