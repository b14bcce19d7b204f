// Command openapijson writes the lease admission API's OpenAPI document (api/openapi, written
// as YAML) as the JSON the API serves, so that the binaries that serve it link no YAML
// parser (make generate; api/openapi's test checks the two agree).
package main

import (
	"fmt"
	"os"

	"sigs.k8s.io/yaml"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: openapijson <in.yaml> <out.json>")
		os.Exit(2)
	}
	if err := convert(os.Args[1], os.Args[2]); err != nil {
		fmt.Fprintf(os.Stderr, "openapijson: %v\n", err)
		os.Exit(1)
	}
}

func convert(in, out string) error {
	src, err := os.ReadFile(in)
	if err != nil {
		return err
	}
	doc, err := yaml.YAMLToJSON(src)
	if err != nil {
		return fmt.Errorf("%s: %w", in, err)
	}
	return os.WriteFile(out, append(doc, '\n'), 0o644)
}
