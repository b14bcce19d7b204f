package leasing_test

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// globalKey is the counter key of resource's global level.
func globalKey(resource string) string {
	return lease.CounterKey(resource, lease.LevelGlobal, lease.ScopeOf(lease.LevelGlobal, "acme", "p", "u"))
}

// entries runs acquisitions, each releasing at once, and records the order they got in.
type entries struct {
	t     *testing.T
	wg    sync.WaitGroup
	mu    sync.Mutex
	order []int
}

func (e *entries) start(p *process, name string, id int) { e.acquire(p, podReq(name, id), id) }

// acquire runs the acquisition r in p, recorded as id.
func (e *entries) acquire(p *process, r leasing.Request, id int) {
	e.wg.Go(func() {
		l, err := acquire(ctxT(e.t), p.svc, r)
		if err != nil {
			e.t.Errorf("waiter %d: %v", id, err)
			return
		}
		e.mu.Lock()
		e.order = append(e.order, id)
		e.mu.Unlock()
		if _, err := p.svc.Release(ctxT(e.t), l.Token); err != nil {
			e.t.Errorf("waiter %d release: %v", id, err)
		}
	})
}

func (e *entries) wait() []int {
	waitfor.Group(e.t, &e.wg, "the acquisitions")
	return e.order
}

// TestOneLineWhateverTheFairnessField: every waiter of a level is served in the order it
// queued, across processes, the holder that releases coming back behind them, whatever the
// definition's fairness field says (it no longer changes the order; docs/waiting.md).
func TestOneLineWhateverTheFairnessField(t *testing.T) {
	for _, f := range []definition.Fairness{definition.FairProcess, definition.FairGlobal} {
		t.Run(string(f), func(t *testing.T) {
			ps := newProcesses(t, 2, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000, fairness: f}}, processOpts{})
			held := mustAcquire(t, ps[0].svc, podReq("x", 0))
			e := &entries{t: t}
			for i, p := range []*process{ps[1], ps[0], ps[1]} {
				e.start(p, "x", i+1)
				ps[0].untilInLine(t, globalKey("x"), i+1)
			}
			if _, err := ps[0].svc.Release(ctxT(t), held.Token); err != nil {
				t.Fatal(err)
			}
			e.start(ps[0], "x", 0) // the releasing holder comes back at once
			if got, want := e.wait(), []int{1, 2, 3, 0}; !slices.Equal(got, want) {
				t.Errorf("order of entry %v, want %v", got, want)
			}
			ps[0].untilInLine(t, "", 0)
			assertNoDrift(t, ps[0].store)
		})
	}
}

// TestNamesSharingAResourceShareItsLine: two lease names share a resource; the level that
// is full is the resource's, and so is its line: the holder that releases and comes back
// through the other name enters after the waiter of the first.
func TestNamesSharingAResourceShareItsLine(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{
		{name: "ordered", resource: "shared", global: 1, ttlSeconds: 60, waitMs: 30000, fairness: definition.FairGlobal},
		{name: "loose", resource: "shared", global: 1, ttlSeconds: 60, waitMs: 30000, fairness: definition.FairProcess},
	}, processOpts{})
	held := mustAcquire(t, ps[0].svc, podReq("loose", 0))
	e := &entries{t: t}
	e.start(ps[1], "ordered", 1)
	ps[0].untilInLine(t, globalKey("shared"), 1)
	if _, err := ps[0].svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatal(err)
	}
	e.start(ps[0], "loose", 0)
	if got, want := e.wait(), []int{1, 0}; !slices.Equal(got, want) {
		t.Errorf("order of entry %v, want %v", got, want)
	}
	assertNoDrift(t, ps[0].store)
}

// TestCapRaiseWakesWaiters: a definition change that raises the cap admits the waiters at
// once. The service's clock is fake and never advanced, so no safety timer and no deadline
// can fire: only the wake-up of the definition change (the resolver's OnChange, as
// cmd/manager wires it) lets them in.
func TestCapRaiseWakesWaiters(t *testing.T) {
	def := leaseDef{name: "x", global: 1, ttlSeconds: 60, waitMs: definition.MaxWaitMs}
	ps := newProcesses(t, 1, []leaseDef{def},
		processOpts{clock: testingclock.NewFakeClock(time.Now()), safety: time.Hour})
	p := ps[0]
	mustAcquire(t, p.svc, podReq("x", 0))
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	granted := make(chan leasing.Lease, 2)
	errs := make(chan error, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			l, err := acquire(ctx, p.svc, podReq("x", i))
			if err != nil {
				errs <- err
				return
			}
			granted <- l
		}()
		p.untilInLine(t, globalKey("x"), i)
	}

	def.global = 3
	p.source.set(def)
	p.resolver.Invalidate(definition.LayerKey{Name: "x", Tenant: definition.SystemTenant, Project: definition.TenantProject})
	for range 2 {
		select {
		case l := <-granted:
			if got := l.Levels[0].Cap; got != 3 {
				t.Errorf("granted under cap %d, want the raised 3", got)
			}
		case err := <-errs:
			t.Fatalf("a waiter was not admitted after the cap was raised: %v", err)
		}
	}
	p.untilInLine(t, "", 0)
	assertNoDrift(t, p.store)
}
