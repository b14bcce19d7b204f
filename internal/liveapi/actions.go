package liveapi

import (
	"context"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// The operator's actions that are not one holder are create-only resources in the system
// namespace: creating one runs it and answers with its result; nothing is kept. RBAC
// decides who may (verb create on podrevocations, sweeps, reconciles), instead of a
// shared secret. See docs/live-api.md.

// action is the part every action storage shares.
type action struct {
	views *views
	deps  Deps
}

// admit checks that the request is in the system namespace and names the object, and
// runs the validation; it returns the name to answer with.
func (a *action) admit(ctx context.Context, obj runtime.Object, validate rest.ValidateObjectFunc, resource string) (string, error) {
	ns := genericapirequest.NamespaceValue(ctx)
	if ns != a.views.tenants.SystemNamespace() {
		return "", apierrors.NewForbidden(livev1alpha1.Resource(resource), "",
			fmt.Errorf("%s are created in the system namespace %q only", resource, a.views.tenants.SystemNamespace()))
	}
	if validate != nil {
		if err := validate(ctx, obj); err != nil {
			return "", err
		}
	}
	m, err := metaOf(obj)
	if err != nil {
		return "", err
	}
	return generatedName(*m, a.deps), nil
}

// generatedName is the name an action answers with: its own, or its generateName followed
// by the time (nothing is stored, so no name can clash).
func generatedName(m metav1.ObjectMeta, d Deps) string {
	if m.Name != "" {
		return m.Name
	}
	return m.GenerateName + strings.ReplaceAll(d.Clock.Now().UTC().Format("20060102-150405.000"), ".", "-")
}

func metaOf(obj runtime.Object) (*metav1.ObjectMeta, error) {
	switch o := obj.(type) {
	case *livev1alpha1.PodRevocation:
		return &o.ObjectMeta, nil
	case *livev1alpha1.Sweep:
		return &o.ObjectMeta, nil
	case *livev1alpha1.Reconcile:
		return &o.ObjectMeta, nil
	}
	return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected object %T", obj))
}

func dryRun(o *metav1.CreateOptions) bool { return o != nil && len(o.DryRun) > 0 }

// podRevocationStorage revokes every holder of a pod (namespace/name, whatever its UID).
type podRevocationStorage action

var _ rest.Creater = (*podRevocationStorage)(nil) //nolint:misspell // the apiserver spells its interface so

func (s *podRevocationStorage) New() runtime.Object     { return &livev1alpha1.PodRevocation{} }
func (s *podRevocationStorage) Destroy()                {}
func (s *podRevocationStorage) NamespaceScoped() bool   { return true }
func (s *podRevocationStorage) GetSingularName() string { return "podrevocation" }

func (s *podRevocationStorage) Create(ctx context.Context, obj runtime.Object, validate rest.ValidateObjectFunc, o *metav1.CreateOptions) (runtime.Object, error) {
	a := (*action)(s)
	name, err := a.admit(ctx, obj, validate, livev1alpha1.ResourcePodRevocations)
	if err != nil {
		return nil, err
	}
	req := obj.(*livev1alpha1.PodRevocation).DeepCopy()
	req.Name, req.Namespace = name, genericapirequest.NamespaceValue(ctx)
	if errs := validation.IsDNS1123Label(req.PodNamespace); len(errs) > 0 {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("podNamespace %q: %s", req.PodNamespace, strings.Join(errs, "; ")))
	}
	if errs := validation.IsDNS1123Subdomain(req.PodName); len(errs) > 0 {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("podName %q: %s", req.PodName, strings.Join(errs, "; ")))
	}
	if dryRun(o) {
		return req, nil
	}
	holders, err := a.deps.Store.RevokePod(ctx, req.PodNamespace, req.PodName)
	// Revoked holders go to their handlers even when a later delete failed.
	handOver(ctx, a.deps, holders)
	for _, h := range holders {
		req.Revoked = append(req.Revoked, h.ID)
		req.Holders = append(req.Holders, holderObject(h, a.views.namespacesOfTenant(h.Tenant)[0], a.deps.Pods))
	}
	if err != nil {
		return nil, storeError(a.deps.Log, fmt.Sprintf("revoking the holders of pod %s/%s (revoked before the failure: %d)",
			req.PodNamespace, req.PodName, len(holders)), err)
	}
	return req, nil
}

// sweepStorage runs one reaper round now; the sweeper dispatches and counts what it reaps.
type sweepStorage action

var _ rest.Creater = (*sweepStorage)(nil) //nolint:misspell // the apiserver spells its interface so

func (s *sweepStorage) New() runtime.Object     { return &livev1alpha1.Sweep{} }
func (s *sweepStorage) Destroy()                {}
func (s *sweepStorage) NamespaceScoped() bool   { return true }
func (s *sweepStorage) GetSingularName() string { return "sweep" }

func (s *sweepStorage) Create(ctx context.Context, obj runtime.Object, validate rest.ValidateObjectFunc, o *metav1.CreateOptions) (runtime.Object, error) {
	a := (*action)(s)
	name, err := a.admit(ctx, obj, validate, livev1alpha1.ResourceSweeps)
	if err != nil {
		return nil, err
	}
	out := &livev1alpha1.Sweep{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: genericapirequest.NamespaceValue(ctx)}}
	if dryRun(o) {
		return out, nil
	}
	if a.deps.Sweeper == nil {
		return nil, apierrors.NewServiceUnavailable("this manager runs no sweeper")
	}
	res, err := a.deps.Sweeper.Sweep(ctx)
	out.Result = livev1alpha1.SweepResult{Idle: int64(res.Idle), Pod: int64(res.Pod), Reconcile: reconcileResult(res.Reconcile)}
	if err != nil {
		return nil, storeError(a.deps.Log, fmt.Sprintf("sweeping (idle %d, pod %d reaped before the failure)", res.Idle, res.Pod), err)
	}
	a.deps.Log.Info("Sweep through the live API", "idle", res.Idle, "pod", res.Pod)
	return out, nil
}

// reconcileStorage corrects counter drift now.
type reconcileStorage action

var _ rest.Creater = (*reconcileStorage)(nil) //nolint:misspell // the apiserver spells its interface so

func (s *reconcileStorage) New() runtime.Object     { return &livev1alpha1.Reconcile{} }
func (s *reconcileStorage) Destroy()                {}
func (s *reconcileStorage) NamespaceScoped() bool   { return true }
func (s *reconcileStorage) GetSingularName() string { return "reconcile" }

func (s *reconcileStorage) Create(ctx context.Context, obj runtime.Object, validate rest.ValidateObjectFunc, o *metav1.CreateOptions) (runtime.Object, error) {
	a := (*action)(s)
	name, err := a.admit(ctx, obj, validate, livev1alpha1.ResourceReconciles)
	if err != nil {
		return nil, err
	}
	out := &livev1alpha1.Reconcile{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: genericapirequest.NamespaceValue(ctx)}}
	if dryRun(o) {
		return out, nil
	}
	res, err := a.deps.Store.Reconcile(ctx)
	// Counted as the sweeper counts it: corrected and recreated counters both had a wrong count.
	if fixed := res.Corrected; fixed > 0 {
		a.deps.Metrics.Reconcile.WithLabelValues(metrics.ReconcileCorrected).Add(float64(fixed))
	}
	out.Result = reconcileResult(res)
	if err != nil {
		return nil, storeError(a.deps.Log, "reconciling", err)
	}
	a.deps.Log.Info("Reconcile through the live API", "corrected", res.Corrected, "repaired", res.Repaired, "deleted", res.Deleted)
	return out, nil
}

func reconcileResult(r leasestore.ReconcileResult) livev1alpha1.ReconcileResult {
	return livev1alpha1.ReconcileResult{Corrected: int64(r.Corrected), Deleted: int64(r.Deleted), Repaired: int64(r.Repaired),
		Skipped: int64(r.Skipped), Unmarked: int64(r.Unmarked)}
}
