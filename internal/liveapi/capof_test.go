package liveapi

import (
	"context"
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

func TestCapOf(t *testing.T) {
	ref := func(name, project string) lease.DefinitionRef {
		return lease.DefinitionRef{Name: name, Tenant: "acme", Project: project}
	}
	def := func(resource string, caps definition.Caps) resolution {
		return resolution{def: definition.Definition{Resource: resource, Caps: caps}}
	}
	res := map[lease.DefinitionRef]resolution{
		ref("a", "p1"): def("r", definition.Caps{Global: 9, Tenant: 3, Project: 2}),
		ref("b", "p1"): def("r", definition.Caps{Global: 9, Tenant: 5, Project: 2}),
		ref("a", "p2"): def("r", definition.Caps{Global: 9, Tenant: 3, Project: 1}),
		ref("c", "p1"): def("other", definition.Caps{Tenant: 3}),
		ref("d", "p1"): {err: errors.New("layer conflict")},
	}
	for i := range 6 {
		res[ref("many", string(rune('a'+i)))] = def("r", definition.Caps{Tenant: i + 1})
	}
	counter := func(level lease.Level, refs ...lease.DefinitionRef) lease.Counter {
		return lease.Counter{Resource: "r", Level: level, BookedBy: refs}
	}
	cases := map[string]struct {
		c    lease.Counter
		want counterCap
	}{
		"one definition": {counter(lease.LevelTenant, ref("a", "p1")), counterCap{Cap: 3}},
		"definitions agree": {counter(lease.LevelGlobal, ref("a", "p1"), ref("b", "p1"), ref("a", "p2")),
			counterCap{Cap: 9}},
		"definitions disagree": {counter(lease.LevelTenant, ref("a", "p1"), ref("a", "p2"), ref("b", "p1")), counterCap{
			Reason: livev1alpha1.CapReasonAmbiguous,
			Note:   "ambiguous: lease a in acme/p1, lease a in acme/p2 (cap 3); lease b in acme/p1 (cap 5) share this counter"}},
		"one of them uncapped": {counter(lease.LevelUser, ref("a", "p1")), counterCap{
			Reason: livev1alpha1.CapReasonUncapped, Note: "the current definition of lease a in acme/p1 does not cap the user level"}},
		"not booked": {counter(lease.LevelTenant), counterCap{Reason: livev1alpha1.CapReasonNotBooked, Note: "no holder books this counter"}},
		"resolver error wins over agreement": {counter(lease.LevelTenant, ref("a", "p1"), ref("d", "p1")), counterCap{
			Reason: livev1alpha1.CapReasonUnresolved, Note: "the definition of lease d in acme/p1 could not be resolved: layer conflict"}},
		"definition moved to another resource": {counter(lease.LevelTenant, ref("c", "p1")), counterCap{
			Reason: livev1alpha1.CapReasonUnresolved, Note: `the definition of lease c in acme/p1 could not be resolved: it now books resource "other"`}},
		"never resolved": {counter(lease.LevelTenant, ref("z", "p1")), counterCap{
			Reason: livev1alpha1.CapReasonUnresolved, Note: "the definition of lease z in acme/p1 could not be resolved: not resolved"}},
		"a long note is bounded": {counter(lease.LevelTenant, ref("many", "a"), ref("many", "b"), ref("many", "c"),
			ref("many", "d"), ref("many", "e"), ref("many", "f")), counterCap{
			Reason: livev1alpha1.CapReasonAmbiguous,
			Note: "ambiguous: lease many in acme/a (cap 1); lease many in acme/b (cap 2); lease many in acme/c (cap 3); " +
				"lease many in acme/d (cap 4) and 2 more share this counter"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if d := cmp.Diff(tc.want, capOf(tc.c, res)); d != "" {
				t.Errorf("capOf (-want +got):\n%s", d)
			}
		})
	}
}

// countingResolver counts the resolutions it is asked for.
type countingResolver struct{ calls map[lease.DefinitionRef]int }

func (r *countingResolver) Resolve(_ context.Context, tenant, project, name string) (definition.Definition, error) {
	r.calls[lease.DefinitionRef{Name: name, Tenant: tenant, Project: project}]++
	return definition.Definition{Name: name, Resource: "r"}, nil
}

// TestResolveBookersOnce: a reference shared by several counters is resolved once.
func TestResolveBookersOnce(t *testing.T) {
	a, b := lease.DefinitionRef{Name: "a", Tenant: "acme", Project: "p1"}, lease.DefinitionRef{Name: "b", Tenant: "acme", Project: "p1"}
	r := &countingResolver{calls: map[lease.DefinitionRef]int{}}
	resolveBookers(context.Background(), r, []lease.Counter{
		{Level: lease.LevelTenant, BookedBy: []lease.DefinitionRef{a, b}},
		{Level: lease.LevelProject, BookedBy: []lease.DefinitionRef{a, b}},
		{Level: lease.LevelUser, BookedBy: []lease.DefinitionRef{a}},
	})
	if d := cmp.Diff(map[lease.DefinitionRef]int{a: 1, b: 1}, r.calls); d != "" {
		t.Errorf("resolutions (-want +got):\n%s", d)
	}
}
