// Package controller holds the operator's thin reconcilers: they fetch, delegate the
// decisions to pure functions in their own packages, and write status.
package controller

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/handler"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
)

// Explainer merges the definition of a lease in a scope without caching;
// *definition.Resolver implements it.
type Explainer interface {
	Explain(ctx context.Context, tenant, project, name string) (definition.Result, error)
}

var _ Explainer = (*definition.Resolver)(nil)

// LeaseDefinitionReconciler writes the status of LeaseDefinition objects: whether the object
// is valid and alone at its key, which of its fields its layer ignores, and the merged
// definition at its scope. It decides nothing itself (see definition.CheckLayer and
// definition.Merge; k8stenancy.Permits for whether its namespace may hold its layer) and never touches the resolver's cache: that is invalidated from the
// informer on every replica (k8ssource.RegisterInvalidation), while this controller runs on
// the leader only, so that one writer owns the status.
type LeaseDefinitionReconciler struct {
	client    client.Client
	layers    definition.LayerSource
	explainer Explainer
	tenants   tenancy.Map
	clock     clock.PassiveClock
}

// NewLeaseDefinitionReconciler returns a reconciler that reads objects and writes status
// through c, reads the documents at an object's key from layers, merges with explainer and
// decides with tenants whether an object's namespace may hold its layer.
func NewLeaseDefinitionReconciler(c client.Client, layers definition.LayerSource, explainer Explainer, tenants tenancy.Map, clk clock.PassiveClock) *LeaseDefinitionReconciler {
	return &LeaseDefinitionReconciler{client: c, layers: layers, explainer: explainer, tenants: tenants, clock: clk}
}

// SetupLeaseDefinitions wires lease definitions into mgr: the field indexes, the resolver's
// cache invalidation (informer handlers on LeaseDefinitions and on namespace relabels, active
// on every replica) and the status controller (leader only). Call it before mgr.Start;
// resolver must read from mgr's cache (k8ssource.New(mgr.GetCache(), tenants)), and tenants
// must follow mgr's cache (k8stenancy.NewInformed(ctx, mgr.GetCache(), ...)).
func SetupLeaseDefinitions(ctx context.Context, mgr ctrl.Manager, resolver *definition.Resolver, tenants *k8stenancy.Informed) error {
	if err := k8ssource.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	if err := k8ssource.RegisterInvalidation(ctx, mgr.GetCache(), resolver); err != nil {
		return err
	}
	k8ssource.RegisterTenancyInvalidation(tenants, resolver)
	r := NewLeaseDefinitionReconciler(mgr.GetClient(), k8ssource.New(mgr.GetCache(), tenants), resolver, tenants, clock.RealClock{})
	if err := r.SetupWithManager(mgr); err != nil {
		return fmt.Errorf("setting up the LeaseDefinition controller: %w", err)
	}
	return nil
}

// +kubebuilder:rbac:groups=lease.vancetope.io,resources=leasedefinitions,verbs=get;list;watch
// +kubebuilder:rbac:groups=lease.vancetope.io,resources=leasedefinitions/status,verbs=get;update;patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Reconcile computes and writes the status of one LeaseDefinition.
func (r *LeaseDefinitionReconciler) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	var ld leasev1alpha1.LeaseDefinition
	if err := r.client.Get(ctx, req.NamespacedName, &ld); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	key := k8ssource.KeyOf(&ld)
	// Read first: it also fails while the namespaces' tenants are not known yet.
	sameKey, err := r.layers.Layers(ctx, key)
	if err != nil {
		return ctrl.Result{}, fmt.Errorf("reading the definitions of %s: %w", key, err)
	}
	v := verdict{source: k8ssource.SourceName(&ld)}
	if _, msg, ok := k8ssource.Permitted(&ld, r.tenants); !ok {
		// The object takes part in nothing (k8ssource.Source leaves it out), so neither a
		// conflict nor a merge is reported for it.
		v.notPermitted = msg
		v.ignored = definition.IgnoredFields(k8ssource.LayerFrom(&ld))
	} else {
		v.ignored, v.layerErr = definition.CheckLayer(k8ssource.LayerFrom(&ld), sameKey)
	}
	if v.notPermitted == "" && v.layerErr == nil {
		v.result, v.resolveErr = r.explainer.Explain(ctx, ld.Spec.Tenant, ld.Spec.Project, ld.Spec.LeaseName)
		if errors.Is(v.resolveErr, definition.ErrLayerRead) {
			return ctrl.Result{}, fmt.Errorf("merging the definition at %s: %w", key, v.resolveErr)
		}
	}

	status := buildStatus(ld.Generation, ld.Status, v, r.clock.Now())
	if equality.Semantic.DeepEqual(ld.Status, status) {
		return ctrl.Result{}, nil
	}
	// The copy read from the cache can lag behind this controller's own last write. A patch
	// computed against it would leave out every field the stale copy happens to share with
	// the new status, and the server's value of it would stay; the optimistic lock refuses
	// such a patch instead (a conflict, retried once the cache has caught up).
	patch := client.MergeFromWithOptions(ld.DeepCopy(), client.MergeFromWithOptimisticLock{})
	ld.Status = status
	if err := r.client.Status().Patch(ctx, &ld, patch); err != nil {
		return ctrl.Result{}, fmt.Errorf("patching the status of %s: %w", req.NamespacedName, err)
	}
	ready := readyCondition(status)
	ctrl.LoggerFrom(ctx).V(1).Info("Updated LeaseDefinition status",
		"leaseName", key.Name, "layer", key.Kind(), "ready", ready.Status, "reason", ready.Reason)
	return ctrl.Result{}, nil
}

// SetupWithManager registers the controller: an object is reconciled when it changes (its
// status included), when a document its scope depends on changes (definition.LayerKey.Affects),
// and when the tenant label of a namespace holding it or such a document changes. A status
// update of the object itself is let through on purpose: a reconcile that found the stale
// cached status equal to the one it computed wrote nothing, and the server may hold another
// one; the update that brings the cache up to date is what reconciles it again (and is a
// no-op when the status is right). Status updates of other objects are filtered out.
func (r *LeaseDefinitionReconciler) SetupWithManager(mgr ctrl.Manager) error {
	specChanged := builder.WithPredicates(predicate.GenerationChangedPredicate{})
	return ctrl.NewControllerManagedBy(mgr).
		Named("leasedefinition").
		For(&leasev1alpha1.LeaseDefinition{}).
		Watches(&leasev1alpha1.LeaseDefinition{}, handler.EnqueueRequestsFromMapFunc(r.dependents), specChanged).
		Watches(&corev1.Namespace{}, handler.EnqueueRequestsFromMapFunc(r.namespaceDocuments), builder.WithPredicates(tenantChanged())).
		Complete(r)
}

// tenantChanged passes the Namespace events that can change which documents count: a
// namespace created or deleted with the tenant label, or relabelled.
func tenantChanged() predicate.Predicate {
	tenant := func(o client.Object) string { return o.GetLabels()[tenancy.TenantLabel] }
	return predicate.Funcs{
		CreateFunc:  func(e event.CreateEvent) bool { return tenant(e.Object) != "" },
		UpdateFunc:  func(e event.UpdateEvent) bool { return tenant(e.ObjectOld) != tenant(e.ObjectNew) },
		DeleteFunc:  func(e event.DeleteEvent) bool { return tenant(e.Object) != "" },
		GenericFunc: func(event.GenericEvent) bool { return false },
	}
}

// namespaceDocuments maps a relabelled namespace to the documents in it and their dependents:
// each may have gained or lost its place in the merge.
func (r *LeaseDefinitionReconciler) namespaceDocuments(ctx context.Context, obj client.Object) []reconcile.Request {
	var list leasev1alpha1.LeaseDefinitionList
	if err := r.client.List(ctx, &list, client.InNamespace(obj.GetName())); err != nil {
		ctrl.LoggerFrom(ctx).Error(err, "Cannot list the LeaseDefinitions of a relabelled namespace", "namespace", obj.GetName())
		return nil
	}
	seen := map[types.NamespacedName]bool{}
	var reqs []reconcile.Request
	add := func(rs ...reconcile.Request) {
		for _, rq := range rs {
			if !seen[rq.NamespacedName] {
				seen[rq.NamespacedName] = true
				reqs = append(reqs, rq)
			}
		}
	}
	for i := range list.Items {
		item := &list.Items[i]
		add(reconcile.Request{NamespacedName: client.ObjectKeyFromObject(item)})
		add(r.dependents(ctx, item)...)
	}
	return reqs
}

// dependents maps a changed object to the other objects whose status it can change: the
// objects of the same lease name in the scopes it affects (peers at its own key included,
// for conflicts).
func (r *LeaseDefinitionReconciler) dependents(ctx context.Context, obj client.Object) []reconcile.Request {
	ld, ok := obj.(*leasev1alpha1.LeaseDefinition)
	if !ok {
		return nil
	}
	changed := k8ssource.KeyOf(ld)
	var list leasev1alpha1.LeaseDefinitionList
	if err := r.client.List(ctx, &list, client.MatchingFields{k8ssource.IndexLeaseName: ld.Spec.LeaseName}); err != nil {
		// A map function cannot return an error; the dependents are reconciled again on
		// their own next change.
		ctrl.LoggerFrom(ctx).Error(err, "Cannot list the LeaseDefinitions that depend on a changed one", "leaseName", ld.Spec.LeaseName)
		return nil
	}
	var reqs []reconcile.Request
	for i := range list.Items {
		item := &list.Items[i]
		if item.UID == ld.UID || !changed.Affects(k8ssource.KeyOf(item)) {
			continue
		}
		reqs = append(reqs, reconcile.Request{NamespacedName: types.NamespacedName{Namespace: item.Namespace, Name: item.Name}})
	}
	return reqs
}
