//go:build tools

// Package tools pins the versions of the linters that `make lint` builds into bin/. Its own
// module keeps their dependencies out of the operator's go.mod.
package tools

import (
	_ "sigs.k8s.io/kube-api-linter/cmd/golangci-lint-kube-api-linter"
)
