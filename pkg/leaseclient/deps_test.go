package leaseclient_test

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportsOnlyTheStandardLibrary keeps the promise of the package documentation: an
// application that imports the client depends on nothing else of the operator.
func TestImportsOnlyTheStandardLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.ImportPath}}{{end}}", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	var other []string
	for _, p := range strings.Fields(string(out)) {
		if p != "github.com/vancetope/lease-operator/pkg/leaseclient" {
			other = append(other, p)
		}
	}
	if len(other) > 0 {
		t.Errorf("pkg/leaseclient depends on non-standard packages: %v", other)
	}
}
