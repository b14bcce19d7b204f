package tenancy

import (
	"errors"

	"github.com/vancetope/lease-operator/internal/lease"
)

// ErrNotSynced is the cause of LEASE_UNAVAILABLE while a Map that syncs has not: the
// manager's namespace informer has not listed every namespace, or an agent has not reached its
// manager yet.
var ErrNotSynced = errors.New("the tenant map has not synced yet")

// NonPodPolicy is what a caller that is no pod (an address the pod informer and the API
// server do not know) may do on the admission API. Pods are always bound to the tenant of
// their namespace; this policy only decides for callers outside the cluster's pods.
type NonPodPolicy int

const (
	// NonPodRefused refuses callers that are not pods (TENANT_FORBIDDEN). The default, and the
	// only sound setting where tenants share a cluster.
	NonPodRefused NonPodPolicy = iota
	// NonPodAnyTenant lets callers that are not pods name any tenant. For development only
	// (make run, a developer's curl on the host): such a caller is trusted with every tenant.
	NonPodAnyTenant
)

// Caller is who sent an admission request, as the serving process identified it.
type Caller struct {
	// Pod is the calling pod: the agent's own pod, or the pod the manager found by source
	// address. Zero when the caller is no pod.
	Pod lease.PodRef
	// Addr is the caller's source address, for the message of a refusal.
	Addr string
}

// BindTenant decides which tenant a request of caller acts for (docs/tenancy.md, "Who may
// acquire for a tenant"): a pod acts for the tenant its namespace is labelled with
// (TenantLabel), whether the request names that tenant or none; a request naming another
// tenant, and any request of a pod whose namespace has no tenant, is refused with a
// *lease.TenantForbiddenError. A caller that is no pod is refused under NonPodRefused and
// acts for the tenant it names under NonPodAnyTenant (an empty one is left to the request's
// validation). Nothing may be written for a refused request.
func BindTenant(caller Caller, requested string, m Map, nonPod NonPodPolicy) (string, error) {
	if caller.Pod.Name == "" {
		if nonPod == NonPodAnyTenant {
			return requested, nil
		}
		return "", &lease.TenantForbiddenError{Addr: caller.Addr, Label: TenantLabel, Requested: requested}
	}
	owner, ok := m.TenantOf(caller.Pod.Namespace)
	if !ok || (requested != "" && requested != owner) {
		return "", &lease.TenantForbiddenError{Pod: caller.Pod, NamespaceTenant: owner, Label: TenantLabel, Requested: requested}
	}
	return owner, nil
}

// Binder is BindTenant over a live Map: until a map that syncs (Informed) has listed every
// namespace, it answers LEASE_UNAVAILABLE rather than refuse a pod on a partial view.
type Binder struct {
	Map    Map
	NonPod NonPodPolicy
}

// Bind implements the decision for one request; see BindTenant.
func (b Binder) Bind(caller Caller, requested string) (string, error) {
	if s, ok := b.Map.(interface{ HasSynced() bool }); ok && caller.Pod.Name != "" && !s.HasSynced() {
		return "", lease.Unavailable("deciding the tenant of "+caller.Pod.String(), ErrNotSynced)
	}
	return BindTenant(caller, requested, b.Map, b.NonPod)
}
