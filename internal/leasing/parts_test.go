package leasing_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// partsReq is an acquisition of several leases by user.
func partsReq(user string, leases ...string) leasing.Request {
	r := req("", "acme", "p", user)
	r.Leases = leases
	return r
}

// TestSeveralLeasesAreServedInTheirLines: an acquisition of gpu and licence books gpu, then
// waits in the licence's line holding it; single acquisitions of the licence that come after
// it queue behind it, and one of gpu waits for the slot it holds. When the licence comes back
// it is granted both (one token, a fence each); when it releases, the next in each line is
// served. Two processes: the waiters of the other are woken by events.
func TestSeveralLeasesAreServedInTheirLines(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{
		{name: "gpu", global: 1, ttlSeconds: 60, waitMs: 30000},
		{name: "licence", global: 1, ttlSeconds: 60, waitMs: 30000},
	}, processOpts{})
	a, b := ps[0], ps[1]
	holder := mustAcquire(t, a.svc, podReq("licence", 0))

	var mu sync.Mutex
	var order []string
	served := func(who string, svc *leasing.Service, r leasing.Request, wg *sync.WaitGroup) chan leasing.Lease {
		out := make(chan leasing.Lease, 1)
		wg.Go(func() {
			l, err := acquire(ctxT(t), svc, r)
			if err != nil {
				t.Errorf("%s: %v", who, err)
				return
			}
			mu.Lock()
			order = append(order, who)
			mu.Unlock()
			out <- l
		})
		return out
	}
	var wg sync.WaitGroup
	both := served("both", a.svc, partsReq("m", "licence", "gpu"), &wg)
	a.untilInLine(t, globalKey("licence"), 1)
	single1 := served("licence-1", b.svc, podReq("licence", 1), &wg)
	a.untilInLine(t, globalKey("licence"), 2)
	single2 := served("licence-2", b.svc, podReq("licence", 2), &wg)
	a.untilInLine(t, globalKey("licence"), 3)
	gpu := served("gpu", b.svc, podReq("gpu", 3), &wg)
	a.untilInLine(t, globalKey("gpu"), 1) // the gpu slot is the waiting acquisition's

	if _, err := a.svc.Release(ctxT(t), holder.Token); err != nil {
		t.Fatal(err)
	}
	m := waitfor.Receive(t, both, "the acquisition of both")
	if len(m.Parts) != 2 || m.Parts[0].Name != "gpu" || m.Parts[1].Name != "licence" || m.Parts[0].Fence < 1 || m.Parts[1].Fence < 1 || m.Name != "gpu+licence" {
		t.Fatalf("granted %+v, want gpu and licence with a fence each", m)
	}
	if a.inLine(t, globalKey("licence")) != 2 || a.inLine(t, globalKey("gpu")) != 1 {
		t.Fatalf("after the grant: %d in the licence's line, %d in gpu's; want 2 and 1", a.inLine(t, globalKey("licence")), a.inLine(t, globalKey("gpu")))
	}
	if err := a.svc.Check(ctxT(t), m.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := a.svc.Release(ctxT(t), m.Token); err != nil {
		t.Fatal(err)
	}
	l1 := waitfor.Receive(t, single1, "the first single licence waiter")
	g := waitfor.Receive(t, gpu, "the gpu waiter")
	if _, err := b.svc.Release(ctxT(t), l1.Token); err != nil {
		t.Fatal(err)
	}
	l2 := waitfor.Receive(t, single2, "the second single licence waiter")
	for _, l := range []leasing.Lease{g, l2} {
		if _, err := b.svc.Release(ctxT(t), l.Token); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Group(t, &wg, "the acquisitions")
	if order[0] != "both" || order[len(order)-1] != "licence-2" {
		t.Errorf("served in the order %v: want both first and licence-2 last", order)
	}
	assertCountsZero(t, a)
}

// assertCountsZero fails when a counter still counts a slot.
func assertCountsZero(t *testing.T, p *process) {
	t.Helper()
	waitfor.Until(t, "every slot given back", func() bool {
		for _, r := range []string{"gpu", "licence"} {
			if busy, err := p.store.Probe(ctxT(t), r, []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}, "acme", "p", "u"); err != nil || busy != nil {
				return false
			}
		}
		return true
	})
}

// TestSeveralLeasesTakeTheStrictestOfTheirDefinitions: the shortest TTL and wait of the
// leases, a priority within every lease's maximum, and a refusal, writing nothing, when two
// leases book one resource.
func TestSeveralLeasesTakeTheStrictestOfTheirDefinitions(t *testing.T) {
	p := newProcesses(t, 1, []leaseDef{
		{name: "gpu", global: 1, ttlSeconds: 60, waitMs: 30000, maxPriority: 10},
		{name: "licence", global: 1, ttlSeconds: 20, waitMs: 300},
		{name: "licence-big", resource: "licence", global: 2, ttlSeconds: 20, waitMs: 300},
	}, processOpts{})[0]
	l := mustAcquire(t, p.svc, partsReq("ann", "gpu", "licence"))
	if l.TTL != 20*time.Second {
		t.Errorf("TTL %v, want the shorter 20s", l.TTL)
	}
	began := time.Now()
	_, err := acquire(ctxT(t), p.svc, partsReq("bob", "gpu", "licence"))
	var busy *lease.BusyError
	if !errors.As(err, &busy) || busy.Lease != "gpu" {
		t.Fatalf("second acquisition = %v, want busy at part gpu", err)
	}
	if waited := time.Since(began); waited > 5*time.Second {
		t.Errorf("answered busy after %v: want the licence's wait of 300 ms, not gpu's 30 s", waited)
	}
	urgent := partsReq("cy", "gpu", "licence")
	urgent.Priority = 5
	if _, err := p.svc.Acquire(ctxT(t), urgent); !errors.Is(err, lease.ErrInvalid) {
		t.Errorf("priority 5 with licence's maximum 0 = %v, want invalid", err)
	}
	_, err = p.svc.Acquire(ctxT(t), partsReq("dan", "licence", "licence-big", "gpu"))
	var inv *lease.InvalidError
	if !errors.As(err, &inv) || inv.Field != "leases" {
		t.Errorf("two leases of one resource = %v, want invalid leases", err)
	}
	if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}
	assertCountsZero(t, p)
}
