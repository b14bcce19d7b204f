package k8ssource

import (
	"context"
	"fmt"

	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
)

// Invalidator drops cached definitions; *definition.Resolver implements it.
type Invalidator interface {
	Invalidate(key definition.LayerKey)
}

var _ Invalidator = (*definition.Resolver)(nil)

// InvalidationHandler returns an informer event handler that invalidates the keys of every
// added, deleted or spec-changed LeaseDefinition. Status-only updates (same generation) are
// skipped: the merge never reads status.
func InvalidationHandler(inv Invalidator) toolscache.ResourceEventHandler {
	invalidate := func(obj any) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		if ld, ok := obj.(*leasev1alpha1.LeaseDefinition); ok {
			inv.Invalidate(KeyOf(ld))
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: invalidate,
		UpdateFunc: func(oldObj, newObj any) {
			o, okOld := oldObj.(*leasev1alpha1.LeaseDefinition)
			n, okNew := newObj.(*leasev1alpha1.LeaseDefinition)
			if okOld && okNew && o.Generation == n.Generation && KeyOf(o) == KeyOf(n) {
				return
			}
			invalidate(oldObj)
			invalidate(newObj)
		},
		DeleteFunc: invalidate,
	}
}

// RegisterInvalidation adds InvalidationHandler(inv) to the LeaseDefinition informer of the
// cache. Call it before the manager starts, so that no change is missed between the cache's
// first list and the handler's registration. The cache's informers run on every replica,
// leader or not, so every replica keeps its own Resolver current.
func RegisterInvalidation(ctx context.Context, informers cache.Informers, inv Invalidator) error {
	informer, err := informers.GetInformer(ctx, &leasev1alpha1.LeaseDefinition{}, cache.BlockUntilSynced(false))
	if err != nil {
		return fmt.Errorf("getting the LeaseDefinition informer: %w", err)
	}
	if _, err := informer.AddEventHandler(InvalidationHandler(inv)); err != nil {
		return fmt.Errorf("adding the LeaseDefinition invalidation handler: %w", err)
	}
	return nil
}

// AllInvalidator drops every cached definition; *definition.Resolver implements it.
type AllInvalidator interface {
	InvalidateAll()
}

var _ AllInvalidator = (*definition.Resolver)(nil)

// RegisterTenancyInvalidation drops every cached definition when a namespace's tenant changes:
// the documents in it may gain or lose their place in the merge (docs/tenancy.md). Relabels
// are rare, so dropping everything is cheaper to get right than finding the affected keys.
func RegisterTenancyInvalidation(tenants *k8stenancy.Informed, inv AllInvalidator) {
	tenants.OnChange(func(string) { inv.InvalidateAll() })
}
