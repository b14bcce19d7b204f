// Package definition resolves lease definitions (docs/design.md): it validates layer
// documents, merges the built-in, system, tenant and project layers field by field under the
// field-ownership table, checks inline definitions, and caches the merged result per
// (tenant, project, name) in a Resolver.
//
// Everything except the Resolver's cache is a pure function of its arguments. The package has
// no Kubernetes dependency: LeaseDefinition objects reach it as Layer values through the
// LayerSource interface (see the k8ssource subpackage).
//
// Defaults when no layer sets a field: the resource is the lease name, the idle TTL is
// DefaultTTL (120 s) and the wait for a free slot is DefaultWait (10 s). A level that no
// layer caps is not capped; a definition without any cap is a NOOP.
package definition
