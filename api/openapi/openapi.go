// Package openapi holds the OpenAPI 3 document of the lease admission API
// (lease-api.yaml), embedded so that the API serves it (GET /openapi.json) and its
// conformance test (internal/httpapi) checks the handlers against it.
package openapi

import (
	_ "embed"
	"fmt"

	"sigs.k8s.io/yaml"
)

// YAML is the document as written.
//
//go:embed lease-api.yaml
var YAML []byte

// JSON returns the document as JSON.
func JSON() ([]byte, error) {
	b, err := yaml.YAMLToJSON(YAML)
	if err != nil {
		return nil, fmt.Errorf("converting the OpenAPI document to JSON: %w", err)
	}
	return b, nil
}
