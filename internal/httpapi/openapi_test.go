package httpapi_test

import (
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/testutil/openapitest"
)

// The OpenAPI conformance check: every request the tests of this package send through
// newEnv's server, and every answer, is validated against api/openapi/lease-api.yaml
// (openapitest.Conformance). TestMain then checks that every documented answer was produced
// by some test, so the document cannot describe answers the server never gives.

func TestOpenAPIRouteTable(t *testing.T) {
	doc, err := openapitest.Spec()
	if err != nil {
		t.Fatal(err)
	}
	var documented, served []string
	for path, item := range doc.Paths.Map() {
		for method := range item.Operations() {
			documented = append(documented, method+" "+path)
		}
	}
	for _, r := range httpapi.Routes() {
		served = append(served, r.Method+" "+r.Path)
	}
	slices.Sort(documented)
	slices.Sort(served)
	if diff := cmp.Diff(documented, served); diff != "" {
		t.Errorf("routes in the document (-) and in the route table (+):\n%s", diff)
	}
}

func TestOpenAPIServed(t *testing.T) {
	e := newEnv(t, nil, envOpts{})
	status, out := e.do(t, http.MethodGet, httpapi.PathOpenAPI, "")
	if status != http.StatusOK || out["openapi"] != "3.0.3" {
		t.Fatalf("GET %s = %d, openapi %v", httpapi.PathOpenAPI, status, out["openapi"])
	}
	paths, _ := out["paths"].(map[string]any)
	if _, ok := paths[httpapi.PathLeases]; !ok {
		t.Errorf("served document has no %s: %v", httpapi.PathLeases, strings.Join(keys(paths), ", "))
	}
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}
