package liveapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/livefeed"
)

var holdersResource = livev1alpha1.Resource(livev1alpha1.ResourceHolders)

// notFound is NotFound for the holder or waiter name of resource. A name that is no holder
// ID is not echoed: it may be a token, a bearer secret (docs/security.md, "Tokens").
func notFound(resource schema.GroupResource, name string) error {
	if lease.ValidHolderID(name) {
		return apierrors.NewNotFound(resource, name)
	}
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure, Code: http.StatusNotFound, Reason: metav1.StatusReasonNotFound,
		// A name in the details, so that kubectl lease does not take the answer for a live
		// API that is not served (cli.liveClient.wrap).
		Details: &metav1.StatusDetails{Group: resource.Group, Kind: resource.Resource, Name: "(not a holder ID)"},
		Message: fmt.Sprintf("%s are named by holder ID (%s and 24 lowercase hex digits, as kubectl get %s shows them); the name given is none",
			resource, lease.HolderIDPrefix, resource.Resource),
	}}
}

// holderStorage serves leaseholders: get, list, delete (revoke).
type holderStorage struct {
	views *views
	deps  Deps
}

var (
	_ rest.Storage              = (*holderStorage)(nil)
	_ rest.Scoper               = (*holderStorage)(nil)
	_ rest.Getter               = (*holderStorage)(nil)
	_ rest.Lister               = (*holderStorage)(nil)
	_ rest.GracefulDeleter      = (*holderStorage)(nil)
	_ rest.Watcher              = (*holderStorage)(nil)
	_ rest.ShortNamesProvider   = (*holderStorage)(nil)
	_ rest.SingularNameProvider = (*holderStorage)(nil)
	_ rest.CategoriesProvider   = (*holderStorage)(nil)
)

func (s *holderStorage) New() runtime.Object     { return &livev1alpha1.LeaseHolder{} }
func (s *holderStorage) NewList() runtime.Object { return &livev1alpha1.LeaseHolderList{} }
func (s *holderStorage) Destroy()                {}
func (s *holderStorage) NamespaceScoped() bool   { return true }
func (s *holderStorage) ShortNames() []string    { return []string{livev1alpha1.ShortHolders} }
func (s *holderStorage) GetSingularName() string { return "leaseholder" }
func (s *holderStorage) Categories() []string    { return []string{categoryLease} }

// categoryLease groups the live resources: `kubectl get lease-live` lists holders and
// counters. (Not "lease": too close to the coordination Leases.)
const categoryLease = "lease-live"

// Get reads one holder by its public ID (never by token: docs/live-api.md, "Holder
// IDs"); a holder that does not appear in the request's namespace
// is NotFound, whoever asks.
func (s *holderStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	if !lease.ValidHolderID(name) {
		// Not an ID (a token, say): no holder has this name, and the store is not asked.
		return nil, notFound(holdersResource, name)
	}
	rv := listVersion(s.deps)
	h, err := s.deps.Store.GetHolderByID(ctx, name)
	switch {
	case errors.Is(err, lease.ErrLost):
		return nil, notFound(holdersResource, name)
	case err != nil:
		return nil, storeError(s.deps.Log, "reading holder "+name, err)
	}
	seen(s.deps, []lease.Holder{h}, nil, nil)
	nss := sc.in(s.views.namespacesOfTenant(h.Tenant))
	if len(nss) == 0 {
		return nil, notFound(holdersResource, name)
	}
	obj := holderObject(h, nss[0], s.deps.Pods)
	obj.ResourceVersion = rv
	return &obj, nil
}

// List reads one page of holders in the order of their IDs (limit/continue), narrowed by
// the request's namespace, label and field selectors. The store is asked only for holders
// the namespace shows, so that the continue token (the last ID of the page) never names a
// holder of another tenant.
func (s *holderStorage) List(ctx context.Context, o *metainternalversion.ListOptions) (runtime.Object, error) {
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	list := &livev1alpha1.LeaseHolderList{Items: []livev1alpha1.LeaseHolder{}}
	list.ResourceVersion = listVersion(s.deps) // before the read: a watch from it misses nothing
	if sc.kind == scopeNone {
		return list, nil
	}
	sel, err := holderSelection(o)
	if err != nil {
		return nil, err
	}
	switch sc.kind {
	case scopeTenant:
		if sel.filter.Tenant != "" && sel.filter.Tenant != sc.tenant {
			return list, nil // another tenant's holders never appear here
		}
		sel.filter.Tenant = sc.tenant
	case scopeSystem:
		namespaced := s.views.tenants.NamespacedTenants()
		if slices.Contains(namespaced, sel.filter.Tenant) {
			return list, nil // that tenant's holders appear in its own namespaces only
		}
		sel.filter.ExcludeTenants = namespaced
	}
	if o != nil && o.Continue != "" {
		if sel.after, err = decodeContinue(o.Continue, sc.namespace); err != nil {
			return nil, err
		}
	}
	limit := 0
	if o != nil && o.Limit > 0 {
		limit = int(o.Limit)
	}
	holders, next, err := s.deps.Store.ListHoldersPage(ctx, sel.filter, sel.after, limit)
	if err != nil {
		return nil, storeError(s.deps.Log, "listing holders", err)
	}
	seen(s.deps, holders, nil, nil)
	for _, h := range holders {
		for _, ns := range sc.in(s.views.namespacesOfTenant(h.Tenant)) {
			obj := holderObject(h, ns, s.deps.Pods)
			if sel.matches(&obj) {
				list.Items = append(list.Items, obj)
			}
		}
	}
	setVersion(list.Items, list.ResourceVersion)
	if next != "" {
		list.Continue = encodeContinue(next, sc.namespace)
	}
	return list, nil
}

// Delete revokes the holder: it is removed with the tenant bound in the store's delete
// filter, its levels are returned, and it goes to the revocation listener, which runs the
// type's handler and counts vance_lease_reap_total{reason="revoke"}.
func (s *holderStorage) Delete(ctx context.Context, name string, validate rest.ValidateObjectFunc, o *metav1.DeleteOptions) (runtime.Object, bool, error) {
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	tenant := sc.tenant
	if sc.kind != scopeTenant || (o != nil && len(o.DryRun) > 0) {
		// Outside a tenant's namespace the tenant comes from the holder itself, and a dry
		// run answers with the object: one read more, then the same bound delete. (This
		// server runs no admission plugins, so validate has nothing to say otherwise.)
		cur, err := s.Get(ctx, name, nil)
		if err != nil {
			return nil, false, err
		}
		if validate != nil {
			if err := validate(ctx, cur); err != nil {
				return nil, false, err
			}
		}
		if o != nil && len(o.DryRun) > 0 {
			return cur, true, nil
		}
		tenant = cur.(*livev1alpha1.LeaseHolder).Spec.Tenant
	}
	if sc.kind == scopeNone {
		return nil, false, notFound(holdersResource, name)
	}
	if !lease.ValidHolderID(name) {
		return nil, false, notFound(holdersResource, name)
	}
	h, ok, err := s.deps.Store.RevokeByID(ctx, name, tenant)
	if ok {
		// Deleted is revoked: the handler runs even if returning the levels failed.
		s.revoked(ctx, []lease.Holder{h})
	}
	switch {
	case err != nil:
		return nil, false, storeError(s.deps.Log, "revoking holder "+name, err)
	case !ok:
		return nil, false, notFound(holdersResource, name)
	}
	obj := holderObject(h, sc.namespace, s.deps.Pods)
	return &obj, true, nil
}

// revoked logs and hands revoked holders to the listener, detached from the request's
// cancellation: the handlers outlive the request.
func (s *holderStorage) revoked(ctx context.Context, holders []lease.Holder) {
	handOver(ctx, s.deps, holders)
}

func handOver(ctx context.Context, d Deps, holders []lease.Holder) {
	if len(holders) == 0 {
		return
	}
	log := d.Log
	if u, ok := genericapirequest.UserFrom(ctx); ok {
		log = log.WithValues("user", u.GetName())
	}
	for _, h := range holders {
		log.Info("Revoked a lease through the live API", "holder", h.ID, "tenant", h.Tenant,
			"resource", h.Resources(), "type", h.Type, "pod", h.Pod.String(), "podBound", h.PodBound)
	}
	if d.Listener == nil {
		log.Info("No revocation listener: handlers do not run", "holders", len(holders))
		return
	}
	d.Listener.Revoked(context.WithoutCancel(ctx), ReasonRevoke, holders)
}

// Watch follows the holders the request's namespace and selectors show, from the feed.
func (s *holderStorage) Watch(ctx context.Context, o *metainternalversion.ListOptions) (watch.Interface, error) {
	sel, err := holderSelection(o)
	if err != nil {
		return nil, err
	}
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	return serveWatch(ctx, s.deps, livev1alpha1.ResourceHolders, o, livefeed.KindHolder, s.showHolder(sc, sel), s.New)
}

func (s *holderStorage) ConvertToTable(ctx context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	return holderTable(obj, s.deps.Clock.Now())
}
