// Package tenantview is the tenant's web view of the lease system (kubectl lease ui): the
// holders, waiters and the tenant, project and user counters of one namespace, with drift and
// occupancy made visible, and revocation of a holder. It decides nothing about
// authorization: every read and every revocation is a call to the live Kubernetes API
// (live.lease.vancetope.io) with the user's own credentials, so RBAC alone decides what a
// person sees and may revoke. See docs/tenant-view.md.
package tenantview

import "context"

// Source is what the view needs from the live API, in one namespace. Errors are the
// Kubernetes API's (k8s.io/apimachinery/pkg/api/errors): a 403 is shown as "not allowed for
// this tenant", a 404 on revoke as "already gone".
type Source interface {
	// ListHolders lists the holders (leaseholders) of namespace.
	ListHolders(ctx context.Context, namespace string) ([]Holder, error)
	// ListCounters lists the counters (leasecounters) of namespace.
	ListCounters(ctx context.Context, namespace string) ([]Counter, error)
	// ListWaiters lists the acquisitions waiting for a slot (leasewaiters) of namespace.
	ListWaiters(ctx context.Context, namespace string) ([]Waiter, error)
	// RevokeHolder deletes the leaseholder name of namespace: a revocation.
	RevokeHolder(ctx context.Context, namespace, name string) error
	// CanRevoke asks the API (SelfSubjectAccessReview) whether the user may delete
	// leaseholders in namespace. It only decides whether a revoke button is shown; the
	// revocation itself is authorized by the API again.
	CanRevoke(ctx context.Context, namespace string) (bool, error)
}

// Changes is what a source offers when it can follow the live API (its watches): the view then
// updates itself (GET /events, server-sent events) instead of waiting for a reload.
type Changes interface {
	// Changes sends on the returned channel when the holders, waiters or counters of
	// namespace change; it closes when ctx ends.
	Changes(ctx context.Context, namespace string) (<-chan struct{}, error)
}
