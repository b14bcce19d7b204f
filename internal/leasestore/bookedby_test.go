package leasestore_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// TestCountersNameTheirBookers: a counter read lists, per counter, the distinct definitions
// (lease name, tenant, project) of the holders that book it, once each however many holders
// share one; a counter nobody books lists none; a tenant's read counts and names only its
// own holders, and the same for the global level read without a tenant.
func TestCountersNameTheirBookers(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := allCaps(5, 5, 5, 9)
	as := func(name, tenant, project, user string) leasestore.AcquireRequest {
		r := request("gpu", tenant, project, user, caps)
		r.LeaseName = name
		return r
	}
	mustAcquire(t, s, as("gpu-a", "acme", "p1", "ann"))
	mustAcquire(t, s, as("gpu-a", "acme", "p1", "bob"))
	mustAcquire(t, s, as("gpu-b", "acme", "p2", "ann"))
	mustAcquire(t, s, as("gpu-a", "globex", "p1", "cy"))
	gone := mustAcquire(t, s, as("gpu-a", "acme", "p3", "dan"))
	if _, err := s.Release(ctx, gone.Token); err != nil {
		t.Fatal(err)
	}

	ref := func(name, tenant, project string) lease.DefinitionRef {
		return lease.DefinitionRef{Name: name, Tenant: tenant, Project: project}
	}
	type booking struct {
		Booked int
		By     []lease.DefinitionRef
	}
	read := func(f leasestore.CounterFilter) map[string]booking {
		cs, err := s.ListCounters(ctx, f)
		if err != nil {
			t.Fatal(err)
		}
		out := map[string]booking{}
		for _, c := range cs {
			out[c.Key] = booking{c.Booked, c.BookedBy}
		}
		return out
	}
	a1, b2 := ref("gpu-a", "acme", "p1"), ref("gpu-b", "acme", "p2")
	acme := map[string]booking{
		"gpu|tenant|acme":     {3, []lease.DefinitionRef{a1, b2}},
		"gpu|project|acme/p1": {2, []lease.DefinitionRef{a1}},
		"gpu|project|acme/p2": {1, []lease.DefinitionRef{b2}},
		"gpu|project|acme/p3": {0, nil},
		"gpu|user|acme/ann":   {2, []lease.DefinitionRef{a1, b2}},
		"gpu|user|acme/bob":   {1, []lease.DefinitionRef{a1}},
		"gpu|user|acme/dan":   {0, nil},
	}
	if d := cmp.Diff(acme, read(leasestore.CounterFilter{Tenant: "acme"})); d != "" {
		t.Errorf("acme's counters (-want +got):\n%s", d)
	}
	global := map[string]booking{"gpu|global|*": {4, []lease.DefinitionRef{a1, ref("gpu-a", "globex", "p1"), b2}}}
	if d := cmp.Diff(global, read(leasestore.CounterFilter{Level: lease.LevelGlobal})); d != "" {
		t.Errorf("the global counter (-want +got):\n%s", d)
	}
}
