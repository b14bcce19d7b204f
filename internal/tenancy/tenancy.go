// Package tenancy maps namespaces to tenants: the system namespace holds the system layer and
// the global view, and a namespace labelled TenantLabel=<tenant> belongs to that tenant. The
// definition resolver, the admission policy and the live-leases API all answer "who may speak
// for a tenant" with this one mapping; see docs/tenancy.md.
package tenancy

import (
	"fmt"
	"slices"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
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

// Permits decides whether a layer document of (tenant, project) stored in namespace counts:
// the system layer (tenant leasev1alpha1.SystemTenant, project leasev1alpha1.TenantProject)
// only in the system namespace, a tenant or project layer of tenant T only in a namespace of
// T. When it does not, reason is leasev1alpha1.ReasonNamespaceNotPermitted and message names
// the namespace and what it would need.
func Permits(namespace, tenant, project string, m Map) (reason, message string, ok bool) {
	system := m.SystemNamespace()
	if tenant == leasev1alpha1.SystemTenant {
		if namespace != "" && namespace == system {
			return "", "", true
		}
		return leasev1alpha1.ReasonNamespaceNotPermitted, fmt.Sprintf(
			"Namespace %q may not hold the system layer (tenant %s, project %s); only the system namespace %q may",
			namespace, leasev1alpha1.SystemTenant, project, system), false
	}
	owner, labelled := m.TenantOf(namespace)
	if labelled && owner == tenant {
		return "", "", true
	}
	layer := "tenant"
	if project != leasev1alpha1.TenantProject {
		layer = "project"
	}
	where := "is not labelled " + TenantLabel
	if labelled {
		where = fmt.Sprintf("is labelled %s=%s", TenantLabel, owner)
	}
	hint := fmt.Sprintf("a namespace labelled %s=%s", TenantLabel, tenant)
	if nss := m.NamespacesOf(tenant); len(nss) > 0 {
		hint += fmt.Sprintf(" (%s)", joinQuoted(nss))
	}
	return leasev1alpha1.ReasonNamespaceNotPermitted, fmt.Sprintf(
		"Namespace %q %s, so it may not hold a %s layer of tenant %q; it belongs in %s",
		namespace, where, layer, tenant, hint), false
}

func joinQuoted(ss []string) string {
	out := ""
	for i, s := range ss {
		if i > 0 {
			out += ", "
		}
		out += fmt.Sprintf("%q", s)
	}
	return out
}
