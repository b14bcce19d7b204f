package openapi_test

import (
	"bytes"
	"testing"

	"github.com/vancetope/lease-operator/api/openapi"
	"sigs.k8s.io/yaml"
)

// TestJSONIsTheYAMLDocument: the JSON the API serves is the YAML as written, converted; an
// edit of the YAML without make generate fails here.
func TestJSONIsTheYAMLDocument(t *testing.T) {
	want, err := yaml.YAMLToJSON(openapi.YAML)
	if err != nil {
		t.Fatalf("lease-api.yaml: %v", err)
	}
	if got := bytes.TrimSpace(openapi.JSON()); !bytes.Equal(got, want) {
		t.Errorf("lease-api.json is not lease-api.yaml converted (%d bytes, want %d): run make generate", len(got), len(want))
	}
}
