package liveapi

import (
	"cmp"
	"context"
	"slices"
	"time"

	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/livefeed"
)

var waitersResource = livev1alpha1.Resource(livev1alpha1.ResourceWaiters)

// waiterStorage serves leasewaiters: get and list. A waiter appears where its tenant's
// holders do (docs/live-api.md); its position counts the waiters of every tenant ahead of it
// in the line without naming them. Lines are short-lived and few, so a list is one answer
// without pages.
type waiterStorage struct {
	views *views
	deps  Deps
}

var (
	_ rest.Storage              = (*waiterStorage)(nil)
	_ rest.Scoper               = (*waiterStorage)(nil)
	_ rest.Getter               = (*waiterStorage)(nil)
	_ rest.Lister               = (*waiterStorage)(nil)
	_ rest.Watcher              = (*waiterStorage)(nil)
	_ rest.ShortNamesProvider   = (*waiterStorage)(nil)
	_ rest.SingularNameProvider = (*waiterStorage)(nil)
	_ rest.CategoriesProvider   = (*waiterStorage)(nil)
)

func (s *waiterStorage) New() runtime.Object     { return &livev1alpha1.LeaseWaiter{} }
func (s *waiterStorage) NewList() runtime.Object { return &livev1alpha1.LeaseWaiterList{} }
func (s *waiterStorage) Destroy()                {}
func (s *waiterStorage) NamespaceScoped() bool   { return true }
func (s *waiterStorage) ShortNames() []string    { return []string{livev1alpha1.ShortWaiters} }
func (s *waiterStorage) GetSingularName() string { return "leasewaiter" }
func (s *waiterStorage) Categories() []string    { return []string{categoryLease} }

// waiters reads the waiters the namespace of ctx shows, narrowed by sel.
func (s *waiterStorage) waiters(ctx context.Context, sel listSelection) ([]livev1alpha1.LeaseWaiter, error) {
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	out := []livev1alpha1.LeaseWaiter{}
	switch sc.kind {
	case scopeNone:
		return out, nil
	case scopeTenant:
		if sel.filter.Tenant != "" && sel.filter.Tenant != sc.tenant {
			return out, nil // another tenant's waiters never appear here
		}
		sel.filter.Tenant = sc.tenant
	case scopeSystem:
		namespaced := s.views.tenants.NamespacedTenants()
		if slices.Contains(namespaced, sel.filter.Tenant) {
			return out, nil
		}
		sel.filter.ExcludeTenants = namespaced
	}
	ws, err := s.deps.Store.ListWaiters(ctx, sel.filter)
	if err != nil {
		return nil, storeError(s.deps.Log, "listing waiters", err)
	}
	seen(s.deps, nil, ws, nil)
	for _, w := range ws {
		for _, ns := range sc.in(s.views.namespacesOfTenant(w.Holder.Tenant)) {
			obj := waiterObject(w, ns)
			if sel.matchesWaiter(&obj) {
				out = append(out, obj)
			}
		}
	}
	return out, nil
}

// Get reads one waiter by its public holder ID; one that does not wait, or does not appear
// in the request's namespace, is NotFound.
func (s *waiterStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	if !lease.ValidHolderID(name) {
		return nil, notFound(waitersResource, name)
	}
	rv := listVersion(s.deps)
	sel := listSelection{labels: labels.Everything(), fields: fields.Everything()}
	sel.filter.ID = name
	ws, err := s.waiters(ctx, sel)
	if err != nil {
		return nil, err
	}
	if len(ws) == 0 {
		return nil, notFound(waitersResource, name)
	}
	ws[0].ResourceVersion = rv
	return &ws[0], nil
}

// List reads the waiters the namespace shows, with the selectors of leaseholders.
func (s *waiterStorage) List(ctx context.Context, o *metainternalversion.ListOptions) (runtime.Object, error) {
	sel, err := holderSelection(o)
	if err != nil {
		return nil, err
	}
	rv := listVersion(s.deps) // before the read: a watch from it misses nothing
	ws, err := s.waiters(ctx, sel)
	if err != nil {
		return nil, err
	}
	setVersion(ws, rv)
	return &livev1alpha1.LeaseWaiterList{ListMeta: metav1.ListMeta{ResourceVersion: rv}, Items: ws}, nil
}

// Watch follows the waiters the request's namespace and selectors show, from the feed.
func (s *waiterStorage) Watch(ctx context.Context, o *metainternalversion.ListOptions) (watch.Interface, error) {
	sel, err := holderSelection(o)
	if err != nil {
		return nil, err
	}
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	return serveWatch(ctx, s.deps, livev1alpha1.ResourceWaiters, o, livefeed.KindWaiter, s.showWaiter(sc, sel), s.New)
}

// matchesWaiter: the waiter passes the selectors (those of leaseholders).
func (s listSelection) matchesWaiter(w *livev1alpha1.LeaseWaiter) bool {
	return s.matchesSpec(w.Labels, waiterFields(w), w.Spec.Parts)
}

func (s *waiterStorage) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	return waiterTable(obj, s.deps.Clock.Now())
}

// waiterObject renders a waiter as the LeaseWaiter it is in namespace ns.
func waiterObject(w lease.Waiter, ns string) livev1alpha1.LeaseWaiter {
	h := holderObject(w.Holder, ns, nil)
	obj := livev1alpha1.LeaseWaiter{
		TypeMeta: metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "LeaseWaiter"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              w.Holder.ID,
			Namespace:         ns,
			CreationTimestamp: metav1.NewTime(w.Since),
			Labels:            h.Labels,
		},
		Spec: h.Spec,
		Status: livev1alpha1.LeaseWaiterStatus{
			Resource:        cmp.Or(w.Resource, w.Holder.Resource),
			Lease:           cmp.Or(w.Lease, w.Holder.LeaseName),
			Level:           string(w.Level),
			Scope:           w.Scope,
			Key:             w.Key,
			Cap:             int64(w.Cap),
			Since:           metav1.NewTime(w.Since),
			Priority:        int64(w.Priority),
			Position:        int64(w.Position),
			EstimatedWaitMs: w.EstimatedWait.Milliseconds(),
			Lapsed:          w.Lapsed,
		},
	}
	return obj
}

func waiterFields(w *livev1alpha1.LeaseWaiter) fields.Set {
	return holderFields(&livev1alpha1.LeaseHolder{ObjectMeta: w.ObjectMeta, Spec: w.Spec})
}

// waitCell shows an estimated wait, or <unknown> without one.
func waitCell(ms int64) string {
	if ms <= 0 {
		return "<unknown>"
	}
	return (time.Duration(ms) * time.Millisecond).Round(time.Millisecond).String()
}
