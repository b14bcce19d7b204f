package liveapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/go-logr/logr"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// Store is the part of the lease store the live API uses (*leasestore.Store).
type Store interface {
	GetHolderByID(ctx context.Context, id string) (lease.Holder, error)
	ListHoldersPage(ctx context.Context, f leasestore.HolderFilter, after string, limit int) ([]lease.Holder, string, error)
	ListCounters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error)
	ListWaiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error)
	RevokeByID(ctx context.Context, id, tenant string) (lease.Holder, bool, error)
	RevokePod(ctx context.Context, namespace, name string) ([]lease.Holder, error)
	Reconcile(ctx context.Context) (leasestore.ReconcileResult, error)
}

// Listener receives revoked holders (the revocation dispatcher). It must not block.
type Listener interface {
	Revoked(ctx context.Context, reason string, holders []lease.Holder)
}

// Sweeper runs one reaper round now (*sweeper.Sweeper).
type Sweeper interface {
	Sweep(ctx context.Context) (sweeper.Result, error)
}

// PodStatus reports whether a holder's pod is alive (*podwatch.Watcher).
type PodStatus interface {
	Status(pod lease.PodRef) (reason string, alive bool)
}

var (
	_ Store    = (*leasestore.Store)(nil)
	_ Listener = (*revocation.Dispatcher)(nil)
	_ Sweeper  = (*sweeper.Sweeper)(nil)
)

// ReasonRevoke is the reason revoked holders go to the listener with (the reap metric's
// reason label), as for every other revocation path.
const ReasonRevoke = metrics.ReapRevoke

// scopeKind says what a request namespace shows.
type scopeKind int

const (
	// scopeNone: a namespace that is neither a tenant's nor the system namespace; it shows
	// nothing.
	scopeNone scopeKind = iota
	// scopeAll: no namespace (kubectl get -A): everything, each object in its namespaces.
	scopeAll
	// scopeTenant: a tenant's namespace: that tenant's holders and counters.
	scopeTenant
	// scopeSystem: the system namespace: holders and counters of tenants without a
	// namespace, and the global level.
	scopeSystem
)

// scope is what one request namespace shows.
type scope struct {
	kind      scopeKind
	namespace string
	tenant    string
}

// views applies the tenancy rules of docs/live-api.md.
type views struct {
	tenants tenancy.Map
}

func newViews(d Deps) *views { return &views{tenants: d.Tenants} }

// scopeOf decides what namespace ns shows. A tenant label wins over being the system
// namespace, so that a tenant's namespace never shows another tenant's leases.
func (v *views) scopeOf(ns string) scope {
	if ns == "" {
		return scope{kind: scopeAll}
	}
	if t, ok := v.tenants.TenantOf(ns); ok {
		return scope{kind: scopeTenant, namespace: ns, tenant: t}
	}
	if ns == v.tenants.SystemNamespace() {
		return scope{kind: scopeSystem, namespace: ns}
	}
	return scope{kind: scopeNone, namespace: ns}
}

// namespacesOfTenant returns the namespaces in which the objects of tenant appear: its
// own, or the system namespace when it has none.
func (v *views) namespacesOfTenant(tenant string) []string {
	ns := v.tenants.NamespacesOf(tenant)
	if len(ns) == 0 {
		return []string{v.tenants.SystemNamespace()}
	}
	ns = slices.Clone(ns)
	slices.Sort(ns)
	return ns
}

// counterNamespaces returns the namespaces a counter appears in: the global level only in
// the system namespace (it belongs to no tenant), the others like their tenant's holders.
func (v *views) counterNamespaces(c lease.Counter) []string {
	if c.Level == lease.LevelGlobal {
		return []string{v.tenants.SystemNamespace()}
	}
	return v.namespacesOfTenant(counterTenant(c))
}

// in returns the namespaces of candidates that the scope shows.
func (s scope) in(candidates []string) []string {
	switch s.kind {
	case scopeAll:
		return candidates
	case scopeNone:
		return nil
	}
	if slices.Contains(candidates, s.namespace) {
		return []string{s.namespace}
	}
	return nil
}

func counterTenant(c lease.Counter) string {
	if c.Level == lease.LevelGlobal {
		return ""
	}
	t, _, _ := strings.Cut(c.Scope, "/")
	return t
}

// storeError turns a failed call of the store (or of the definitions behind a review) into
// the API's answer without internal detail: 503 when it is unavailable, 500 otherwise. The
// cause (store host names, topology, a definition's documents) goes to log under a
// correlation id the answer names (docs/security.md, "Errors without internal detail").
func storeError(log logr.Logger, op string, err error) error {
	id := lease.CorrelationID()
	log.Error(err, "Live API request failed", "op", op, "correlationId", id)
	suffix := " (correlation id " + id + " in the manager's log)"
	var ue *definition.UnavailableError
	switch {
	case errors.As(err, &ue):
		return apierrors.NewServiceUnavailable(fmt.Sprintf("%s: the definition of lease %q is unavailable%s", op, ue.Name, suffix))
	case errors.Is(err, lease.ErrUnavailable):
		return apierrors.NewServiceUnavailable(op + ": the lease store is unavailable" + suffix)
	default:
		return apierrors.NewInternalError(errors.New(op + " failed" + suffix))
	}
}
