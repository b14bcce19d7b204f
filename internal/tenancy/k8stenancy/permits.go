// Package k8stenancy is the Kubernetes side of tenancy: the namespace informer that keeps the
// tenant map (Informed) and the rule of which namespace may hold which layer of lease
// definitions (Permits). The map and the binding of callers to tenants are package tenancy's,
// which imports nothing of Kubernetes.
package k8stenancy

import (
	"fmt"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// Permits decides whether a layer document of (tenant, project) stored in namespace counts:
// the system layer (tenant leasev1alpha1.SystemTenant, project leasev1alpha1.TenantProject)
// only in the system namespace, a tenant or project layer of tenant T only in a namespace of
// T. When it does not, reason is leasev1alpha1.ReasonNamespaceNotPermitted and message names
// the namespace and what it would need.
func Permits(namespace, tenant, project string, m tenancy.Map) (reason, message string, ok bool) {
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
	where := "is not labelled " + tenancy.TenantLabel
	if labelled {
		where = fmt.Sprintf("is labelled %s=%s", tenancy.TenantLabel, owner)
	}
	hint := fmt.Sprintf("a namespace labelled %s=%s", tenancy.TenantLabel, tenant)
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
