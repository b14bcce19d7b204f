package leasing_test

import (
	"sync"
	"testing"

	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// TestFencesIncreaseAcrossProcessesAndCounterRecreation: holders in three processes take
// turns on a resource capped at one, most of them handed the slot by a release in another
// process. Each records its fence while it holds the slot, so the records are in the order
// of the grants: they strictly increase, and a check answers the fence of the acquisition.
// Between two rounds reconcile deletes the unused counter; the grants after it, on a new
// counter, go on above the last fence (docs/fencing.md).
func TestFencesIncreaseAcrossProcessesAndCounterRecreation(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	ps := newProcessesAt(t, uri, db, 3, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000}}, processOpts{})
	const holders, rounds = 6, 4
	var (
		mu     sync.Mutex
		fences []int64
	)
	round := func() {
		var wg sync.WaitGroup
		for i := range holders {
			p := ps[i%len(ps)]
			wg.Go(func() {
				for range rounds {
					l, err := acquire(ctxT(t), p.svc, podReq("x", i))
					if err != nil {
						t.Errorf("holder %d: %v", i, err)
						return
					}
					mu.Lock()
					fences = append(fences, l.Fence)
					mu.Unlock()
					if f, err := p.svc.CheckFence(ctxT(t), l.Token); err != nil || f != l.Fence {
						t.Errorf("holder %d: check answered fence %d (%v), the acquisition %d", i, f, err, l.Fence)
					}
					if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
						t.Errorf("holder %d release: %v", i, err)
						return
					}
				}
			})
		}
		waitfor.Group(t, &wg, "the holders")
	}
	round()

	// Nobody holds the slot: reconcile, without a safety margin, deletes the counter.
	r := storetest.Open(t, uri, db, leasestore.WithSafetyMargin(0))
	res, err := r.Reconcile(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if cs, err := r.ListCounters(ctxT(t), leasestore.CounterFilter{}); err != nil || len(cs) != 0 || res.Deleted == 0 {
		t.Fatalf("after reconcile: counters %v (%v), result %+v; want the unused counter deleted", cs, err, res)
	}
	round()

	if len(fences) != 2*holders*rounds {
		t.Fatalf("%d grants, want %d", len(fences), 2*holders*rounds)
	}
	if fences[0] < 1 {
		t.Errorf("first fence %d, want at least 1", fences[0])
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fences in the order of the grants %v: %d follows %d", fences, fences[i], fences[i-1])
		}
	}
}
