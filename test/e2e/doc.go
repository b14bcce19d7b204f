// Package e2e holds the whole-system tests (docs/testing.md, "End to end"): the built
// manager binary and an agent process (cmd/agent), run as a user runs them, on a local control
// plane (envtest) and the test store (internal/testutil/mongotest), driven over HTTP.
//
// The suite runs in plain `go test ./...`; it skips when the control-plane binaries are
// missing (see internal/testutil/envtestbin).
package e2e
