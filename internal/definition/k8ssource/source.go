// Package k8ssource adapts LeaseDefinition objects to the definition package: a LayerSource
// over the controller-runtime cache, the field indexes it needs, and the informer event
// handler that invalidates a Resolver's cache on every replica.
package k8ssource

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
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
	}
	if lv := ld.Spec.Levels; lv != nil {
		l.Levels = definition.Levels{Global: lv.Global, Tenant: lv.Tenant, Project: lv.Project, User: lv.User}
	}
	return l
}

// Source reads layer documents from LeaseDefinition objects in every namespace the reader
// sees. The reader must have the IndexScope index: in practice the manager's cache.
type Source struct {
	reader client.Reader
}

var _ definition.LayerSource = (*Source)(nil)

// New returns a Source over reader (the manager's cache, with SetupIndexes applied).
func New(reader client.Reader) *Source {
	return &Source{reader: reader}
}

// Layers returns the documents stored under key, sorted by source.
func (s *Source) Layers(ctx context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	var list leasev1alpha1.LeaseDefinitionList
	if err := s.reader.List(ctx, &list, client.MatchingFields{IndexScope: ScopeIndexValue(key)}); err != nil {
		return nil, fmt.Errorf("listing LeaseDefinitions of %s: %w", key, err)
	}
	out := make([]definition.Layer, 0, len(list.Items))
	for i := range list.Items {
		out = append(out, LayerFrom(&list.Items[i]))
	}
	slices.SortFunc(out, func(a, b definition.Layer) int { return strings.Compare(a.Source, b.Source) })
	return out, nil
}
