// Package k8ssource adapts LeaseDefinition objects to the definition package: a LayerSource
// over the controller-runtime cache that only lets through the documents whose namespace owns
// their layer (docs/tenancy.md), the field indexes it needs, and the informer event handlers
// that invalidate a Resolver's cache on every replica.
package k8ssource

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
)

// Field indexes on LeaseDefinition objects, registered by SetupIndexes.
const (
	// IndexScope indexes an object by its layer key, leaseName/tenant/project (names and
	// scopes cannot contain '/').
	IndexScope = "lease.vancetope.io/scope"
	// IndexLeaseName indexes an object by spec.leaseName.
	IndexLeaseName = "lease.vancetope.io/leaseName"
)

// SetupIndexes registers the field indexes on LeaseDefinition objects. Call it before the
// cache starts.
func SetupIndexes(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &leasev1alpha1.LeaseDefinition{}, IndexScope, func(o client.Object) []string {
		ld, ok := o.(*leasev1alpha1.LeaseDefinition)
		if !ok {
			return nil
		}
		return []string{ScopeIndexValue(KeyOf(ld))}
	}); err != nil {
		return fmt.Errorf("indexing LeaseDefinitions by scope: %w", err)
	}
	if err := indexer.IndexField(ctx, &leasev1alpha1.LeaseDefinition{}, IndexLeaseName, func(o client.Object) []string {
		ld, ok := o.(*leasev1alpha1.LeaseDefinition)
		if !ok {
			return nil
		}
		return []string{ld.Spec.LeaseName}
	}); err != nil {
		return fmt.Errorf("indexing LeaseDefinitions by lease name: %w", err)
	}
	return nil
}

// ScopeIndexValue is the IndexScope value of a layer key.
func ScopeIndexValue(k definition.LayerKey) string {
	return k.Name + "/" + k.Tenant + "/" + k.Project
}

// KeyOf returns the layer key of an object.
func KeyOf(ld *leasev1alpha1.LeaseDefinition) definition.LayerKey {
	return definition.LayerKey{Name: ld.Spec.LeaseName, Tenant: ld.Spec.Tenant, Project: ld.Spec.Project}
}

// SourceName names an object in messages: "LeaseDefinition namespace/name".
func SourceName(ld *leasev1alpha1.LeaseDefinition) string {
	return "LeaseDefinition " + ld.Namespace + "/" + ld.Name
}

// LayerFrom converts an object to its layer document.
func LayerFrom(ld *leasev1alpha1.LeaseDefinition) definition.Layer {
	l := definition.Layer{
		Kind:       definition.KindOf(ld.Spec.Tenant, ld.Spec.Project),
		Source:     SourceName(ld),
		Name:       ld.Spec.LeaseName,
		Tenant:     ld.Spec.Tenant,
		Project:    ld.Spec.Project,
		Resource:   ld.Spec.Resource,
		TTLSeconds: ld.Spec.TTLSeconds,
		WaitMs:     ld.Spec.WaitMs,
		Fairness:   (*definition.Fairness)(ld.Spec.Fairness),

		MaxPriority:             ld.Spec.MaxPriority,
		PriorityAgeBoundSeconds: ld.Spec.PriorityAgeBoundSeconds,
	}
	if b := ld.Spec.Borrowing; b != nil {
		l.Borrowing = definition.BorrowingLayer{Enabled: b.Enabled, MaxBorrowed: b.MaxBorrowed, GraceSeconds: b.GraceSeconds}
	}
	if lv := ld.Spec.Levels; lv != nil {
		l.Levels = definition.Levels{Global: lv.Global, Tenant: lv.Tenant, Project: lv.Project, User: lv.User}
	}
	return l
}

// Permitted decides whether an object's namespace owns its layer (k8stenancy.Permits).
func Permitted(ld *leasev1alpha1.LeaseDefinition, tenants tenancy.Map) (reason, message string, ok bool) {
	return k8stenancy.Permits(ld.Namespace, ld.Spec.Tenant, ld.Spec.Project, tenants)
}

// syncer is implemented by a tenancy.Map that can still be filling (k8stenancy.Informed).
type syncer interface{ HasSynced() bool }

// Source reads layer documents from LeaseDefinition objects in every namespace the reader
// sees, keeping only those whose namespace owns their layer: a document in the wrong namespace
// takes part in no merge and no conflict. The reader must have the IndexScope index: in
// practice the manager's cache.
type Source struct {
	reader  client.Reader
	tenants tenancy.Map
}

var _ definition.LayerSource = (*Source)(nil)

// New returns a Source over reader (the manager's cache, with SetupIndexes applied) that
// decides with tenants which namespace may hold which layer.
func New(reader client.Reader, tenants tenancy.Map) *Source {
	return &Source{reader: reader, tenants: tenants}
}

// Layers returns the permitted documents stored under key, sorted by source. Until the
// namespaces are known it fails (a retryable read error): deciding on a partial view would
// drop a tenant's layers and fall back to wider caps.
func (s *Source) Layers(ctx context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	if sy, ok := s.tenants.(syncer); ok && !sy.HasSynced() {
		return nil, fmt.Errorf("listing LeaseDefinitions of %s: the namespaces' tenants are not known yet", key)
	}
	var list leasev1alpha1.LeaseDefinitionList
	if err := s.reader.List(ctx, &list, client.MatchingFields{IndexScope: ScopeIndexValue(key)}); err != nil {
		return nil, fmt.Errorf("listing LeaseDefinitions of %s: %w", key, err)
	}
	out := make([]definition.Layer, 0, len(list.Items))
	for i := range list.Items {
		if _, _, ok := Permitted(&list.Items[i], s.tenants); ok {
			out = append(out, LayerFrom(&list.Items[i]))
		}
	}
	slices.SortFunc(out, func(a, b definition.Layer) int { return strings.Compare(a.Source, b.Source) })
	return out, nil
}

// SystemLayers returns the permitted system-layer documents of every lease name, sorted by
// source: the documents in the system namespace whose scope is the system scope.
func (s *Source) SystemLayers(ctx context.Context) ([]definition.Layer, error) {
	if sy, ok := s.tenants.(syncer); ok && !sy.HasSynced() {
		return nil, fmt.Errorf("listing the system-layer LeaseDefinitions: the namespaces' tenants are not known yet")
	}
	var list leasev1alpha1.LeaseDefinitionList
	if err := s.reader.List(ctx, &list, client.InNamespace(s.tenants.SystemNamespace())); err != nil {
		return nil, fmt.Errorf("listing the system-layer LeaseDefinitions: %w", err)
	}
	return SystemLayersOf(list.Items, s.tenants), nil
}

// SystemLayersOf returns the permitted system-layer documents among items, sorted by source.
func SystemLayersOf(items []leasev1alpha1.LeaseDefinition, tenants tenancy.Map) []definition.Layer {
	var out []definition.Layer
	for i := range items {
		ld := &items[i]
		if definition.KindOf(ld.Spec.Tenant, ld.Spec.Project) != definition.KindSystem {
			continue
		}
		if _, _, ok := Permitted(ld, tenants); ok {
			out = append(out, LayerFrom(ld))
		}
	}
	slices.SortFunc(out, func(a, b definition.Layer) int { return strings.Compare(a.Source, b.Source) })
	return out
}
