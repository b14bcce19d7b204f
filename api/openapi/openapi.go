// Package openapi holds the OpenAPI 3 document of the lease admission API
// (lease-api.yaml), embedded so that the API serves it (GET /openapi.json) and its
// conformance test (internal/httpapi) checks the handlers against it.
package openapi

import (
	_ "embed"
)

//go:generate go run ../../hack/openapijson lease-api.yaml lease-api.json

// YAML is the document as written.
//
//go:embed lease-api.yaml
var YAML []byte

// jsonDoc is the document as the API serves it, converted from YAML by make generate: the
// binaries that serve it (the lease agent among them) link no YAML parser for it.
//
//go:embed lease-api.json
var jsonDoc []byte

// JSON returns the document as JSON.
func JSON() []byte { return jsonDoc }
