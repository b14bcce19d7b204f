// Package robustness is the robustness suite (docs/robustness.md), after etcd's
// tests/robustness: the built manager binary and two agent processes (cmd/agent) with pod
// identities, on a local control plane (envtest) and the development store (bin/mongodev),
// under client traffic recorded as a history, with faults injected at moments chosen by a
// seeded random source: agents killed, the store stopped, callers' deadlines cut short, the
// manager restarted. Each history is checked against a model of the lease system with the
// porcupine linearizability checker, and each level's recovery time is measured.
//
// The model and the direct checks (model.go) are tested by plain `go test`; the suite itself
// is built only with the tag robustness and is run by `make test-robustness`.
package robustness
