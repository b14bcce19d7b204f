// Package tenancy maps namespaces to tenants: the system namespace holds the system layer and
// the global view, and a namespace labelled TenantLabel=<tenant> belongs to that tenant. The
// definition resolver, the admission policy and the live-leases API all answer "who may speak
// for a tenant" with this one mapping; see docs/tenancy.md.
package tenancy

import (
	"slices"
)

// TenantLabel is the namespace label that assigns a namespace to a tenant. Only cluster
// administrators should be able to set it (docs/tenancy.md says how to restrict that).
const TenantLabel = "lease.vancetope.io/tenant"

// Map answers which tenant a namespace belongs to.
type Map interface {
	// SystemNamespace is the namespace of the system layer and the global view.
	SystemNamespace() string
	// TenantOf returns the tenant a namespace belongs to; ok is false when the namespace is no
	// tenant's (unlabelled, unknown, or labelled with an empty value).
	TenantOf(namespace string) (tenant string, ok bool)
	// NamespacesOf returns the namespaces of a tenant, sorted; empty if none.
	NamespacesOf(tenant string) []string
	// NamespacedTenants returns the tenants that have at least one namespace, sorted.
	NamespacedTenants() []string
}

// Static is a fixed Map, for tests and for processes that do not watch namespaces.
type Static struct {
	// System is the system namespace.
	System string
	// Tenants maps a namespace to its tenant.
	Tenants map[string]string
}

var _ Map = Static{}

// SystemNamespace implements Map.
func (s Static) SystemNamespace() string { return s.System }

// TenantOf implements Map.
func (s Static) TenantOf(namespace string) (string, bool) {
	t, ok := s.Tenants[namespace]
	return t, ok && t != ""
}

// NamespacesOf implements Map.
func (s Static) NamespacesOf(tenant string) []string {
	var out []string
	for ns, t := range s.Tenants {
		if t == tenant && tenant != "" {
			out = append(out, ns)
		}
	}
	slices.Sort(out)
	return out
}

// NamespacedTenants implements Map.
func (s Static) NamespacedTenants() []string {
	var out []string
	for _, t := range s.Tenants {
		if t != "" && !slices.Contains(out, t) {
			out = append(out, t)
		}
	}
	slices.Sort(out)
	return out
}
