package tenancy

import (
	"cmp"
	"context"
	"errors"
	"time"

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

// Binder is BindTenant over a live Map. Until a map that syncs (Informed, an agent's view of
// its manager) has listed every namespace, a pod's request waits for it, at most SyncWait and
// never past the request's context: a process that has just started (an agent restarted
// next to its pod) answers once it knows, not LEASE_UNAVAILABLE at once. Past that it answers
// LEASE_UNAVAILABLE rather than refuse a pod on a partial view.
type Binder struct {
	Map    Map
	NonPod NonPodPolicy
	// SyncWait bounds the wait for the map's sync; zero means DefaultSyncWait.
	SyncWait time.Duration
}

// DefaultSyncWait is how long a request waits at most for the tenant map to sync: long enough
// for an agent to reach its manager after a restart, as long as a store command may take.
const DefaultSyncWait = 5 * time.Second

// syncPoll is how often a waiting request looks at the map again.
const syncPoll = 10 * time.Millisecond

// Bind implements the decision for one request; see BindTenant.
func (b Binder) Bind(ctx context.Context, caller Caller, requested string) (string, error) {
	if s, ok := b.Map.(interface{ HasSynced() bool }); ok && caller.Pod.Name != "" && !s.HasSynced() {
		if err := waitSynced(ctx, s.HasSynced, cmp.Or(b.SyncWait, DefaultSyncWait)); err != nil {
			return "", lease.Unavailable("deciding the tenant of "+caller.Pod.String(), err)
		}
	}
	return BindTenant(caller, requested, b.Map, b.NonPod)
}

// waitSynced waits until synced, at most max and not past ctx; ErrNotSynced when it gives up.
func waitSynced(ctx context.Context, synced func() bool, max time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, max)
	defer cancel()
	tick := time.NewTicker(syncPoll)
	defer tick.Stop()
	for !synced() {
		select {
		case <-ctx.Done():
			return ErrNotSynced
		case <-tick.C:
		}
	}
	return nil
}
