package liveapi

import (
	"context"
	"fmt"
	"slices"
	"strings"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

// CapResolver resolves a lease name in a tenant and project to its current definition
// (*definition.Resolver, the one acquisitions use).
type CapResolver interface {
	Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error)
}

var _ CapResolver = (*definition.Resolver)(nil)

// resolution is the current definition of one lease reference, or why there is none.
type resolution struct {
	def definition.Definition
	err error
}

// resolveBookers resolves every distinct lease reference of cs once: the holders of one
// lease in one project share a definition, however many they are. An error stays with its
// reference; it makes the caps of the counters that reference books unknown, never the list
// fail.
func resolveBookers(ctx context.Context, r CapResolver, cs []lease.Counter) map[lease.DefinitionRef]resolution {
	out := map[lease.DefinitionRef]resolution{}
	for _, c := range cs {
		for _, ref := range c.BookedBy {
			if _, ok := out[ref]; ok {
				continue
			}
			d, err := r.Resolve(ctx, ref.Tenant, ref.Project, ref.Name)
			out[ref] = resolution{def: d, err: err}
		}
	}
	return out
}

// counterCap is the cap a counter publishes (docs/live-api.md, "Caps"): the level's cap in
// the current definitions of the holders that book it when they agree; otherwise no cap,
// and a reason and a note saying why.
type counterCap struct {
	Cap    int64
	Reason string
	Note   string
}

// maxNoteEntries bounds how many definitions a note names.
const maxNoteEntries = 4

// capOf decides the cap of c from the resolutions of its bookers. A definition that now
// books another resource than the counter's (an inline lease, or a definition whose
// resource changed) does not say anything about this counter and counts as unresolved.
func capOf(c lease.Counter, res map[lease.DefinitionRef]resolution) counterCap {
	if len(c.BookedBy) == 0 {
		return counterCap{Reason: livev1alpha1.CapReasonNotBooked, Note: "no holder books this counter"}
	}
	byCap := map[int64][]string{}
	for _, ref := range c.BookedBy {
		r, ok := res[ref]
		switch {
		case !ok:
			return unresolved(ref, "not resolved")
		case r.err != nil:
			return unresolved(ref, r.err.Error())
		case r.def.Resource != c.Resource:
			return unresolved(ref, fmt.Sprintf("it now books resource %q", r.def.Resource))
		}
		n := int64(levelCap(r.def.Caps, c.Level))
		byCap[n] = append(byCap[n], describeRef(ref))
	}
	if len(byCap) > 1 {
		caps := make([]int64, 0, len(byCap))
		for n := range byCap {
			caps = append(caps, n)
		}
		slices.Sort(caps)
		var parts []string
		for _, n := range caps {
			parts = append(parts, fmt.Sprintf("%s (%s)", joinBounded(byCap[n], ", "), capText(n)))
		}
		return counterCap{Reason: livev1alpha1.CapReasonAmbiguous,
			Note: "ambiguous: " + joinBounded(parts, "; ") + " share this counter"}
	}
	for n, refs := range byCap {
		if n == 0 {
			return counterCap{Reason: livev1alpha1.CapReasonUncapped,
				Note: "the current definition of " + joinBounded(refs, ", ") + " does not cap the " + string(c.Level) + " level"}
		}
		return counterCap{Cap: n}
	}
	return counterCap{}
}

func unresolved(ref lease.DefinitionRef, why string) counterCap {
	return counterCap{Reason: livev1alpha1.CapReasonUnresolved,
		Note: "the definition of " + describeRef(ref) + " could not be resolved: " + why}
}

func levelCap(c definition.Caps, l lease.Level) int {
	switch l {
	case lease.LevelGlobal:
		return c.Global
	case lease.LevelTenant:
		return c.Tenant
	case lease.LevelProject:
		return c.Project
	case lease.LevelUser:
		return c.User
	}
	return 0
}

func describeRef(r lease.DefinitionRef) string {
	return fmt.Sprintf("lease %s in %s/%s", r.Name, r.Tenant, r.Project)
}

func capText(n int64) string {
	if n == 0 {
		return "uncapped"
	}
	return fmt.Sprintf("cap %d", n)
}

// joinBounded joins at most maxNoteEntries items with sep and counts the rest, so that a
// global counter booked from many projects keeps a short note.
func joinBounded(items []string, sep string) string {
	if len(items) <= maxNoteEntries {
		return strings.Join(items, sep)
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:maxNoteEntries], sep), len(items)-maxNoteEntries)
}
