package metrics

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// StateStore is the part of the lease store the state gauges read (*leasestore.Store).
type StateStore interface {
	ListHolders(ctx context.Context, f leasestore.HolderFilter) ([]lease.Holder, error)
	ListCounters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error)
	ServerTime(ctx context.Context) (time.Time, error)
}

// DefinitionResolver resolves a lease name to its merged definition (*definition.Resolver).
type DefinitionResolver interface {
	Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error)
}

var (
	_ StateStore         = (*leasestore.Store)(nil)
	_ DefinitionResolver = (*definition.Resolver)(nil)
)

// StoreState reads the state from the store: all holders, all counters (with the holders
// booking each) and the server time, three reads per refresh. A holder of several resources
// counts as a holder of each (perResource). The global cap of a resource
// comes from the definition of one of its holders (the global level is set only by the
// built-in and system layers, so any holder's scope gives the same cap; the resolver caches
// it); a definition that does not resolve leaves the cap out rather than failing the read.
func StoreState(store StateStore, resolver DefinitionResolver) StateReader {
	return func(ctx context.Context) (State, error) {
		holders, err := store.ListHolders(ctx, leasestore.HolderFilter{})
		if err != nil {
			return State{}, fmt.Errorf("reading holders: %w", err)
		}
		counters, err := store.ListCounters(ctx, leasestore.CounterFilter{})
		if err != nil {
			return State{}, fmt.Errorf("reading counters: %w", err)
		}
		now, err := store.ServerTime(ctx)
		if err != nil {
			return State{}, fmt.Errorf("reading the server time: %w", err)
		}
		holders = perResource(holders)
		caps := map[string]int{}
		if resolver != nil {
			tried := map[string]bool{}
			for _, h := range holders {
				if tried[h.Resource] || h.LeaseName == "" || strings.HasPrefix(h.Resource, definition.InlineResourcePrefix) {
					continue
				}
				tried[h.Resource] = true
				if d, err := resolver.Resolve(ctx, h.Tenant, h.Project, h.LeaseName); err == nil && d.Caps.Global > 0 {
					caps[h.Resource] = d.Caps.Global
				}
			}
		}
		return BuildState(now, holders, counters, caps), nil
	}
}

// perResource gives a holder of several resources once per part, with the part's resource
// and lease name: it holds a lease of each (the global counter of each counts it), and each
// part's own definition gives its resource's global cap.
func perResource(holders []lease.Holder) []lease.Holder {
	out := make([]lease.Holder, 0, len(holders))
	for _, h := range holders {
		if len(h.Parts) == 0 {
			out = append(out, h)
			continue
		}
		for _, p := range h.Parts {
			ph := h
			ph.LeaseName, ph.Resource, ph.Fence, ph.Parts = p.LeaseName, p.Resource, p.Fence, nil
			out = append(out, ph)
		}
	}
	return out
}
