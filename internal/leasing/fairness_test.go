package leasing_test

import (
	"context"
	"fmt"
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

// untilQueued returns once the store holds n reservations on key.
func (p *process) untilQueued(t *testing.T, key string, n int) {
	t.Helper()
	waitfor.Until(t, fmt.Sprintf("%d reservations on %s", n, key), func() bool {
		rs, err := p.store.ListReservations(ctxT(t), key)
		if err != nil {
			t.Fatal(err)
		}
		return len(rs) == n
	})
}

// entries runs acquisitions, each releasing at once, and records the order they got in.
type entries struct {
	t     *testing.T
	wg    sync.WaitGroup
	mu    sync.Mutex
	order []int
}

func (e *entries) start(p *process, name string, id int) {
	e.wg.Go(func() {
		l, err := p.svc.Acquire(ctxT(e.t), podReq(name, id))
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

// TestFairnessComesFromTheDefinition: two processes (two services on one store), no
// service option: the lease whose definition says global serves its waiters in the order
// they queued across both processes, the holder that releases coming back behind them;
// the lease that leaves fairness unset (process) queues nothing in the store.
func TestFairnessComesFromTheDefinition(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{
		{name: "fifo", global: 1, ttlSeconds: 60, waitMs: 30000, fairness: definition.FairGlobal},
		{name: "free", global: 1, ttlSeconds: 60, waitMs: 30000},
	}, processOpts{})

	t.Run("global", func(t *testing.T) {
		held := mustAcquire(t, ps[0].svc, podReq("fifo", 0))
		e := &entries{t: t}
		for i, p := range []*process{ps[1], ps[0], ps[1]} {
			e.start(p, "fifo", i+1)
			ps[0].untilQueued(t, globalKey("fifo"), i+1)
		}
		if _, err := ps[0].svc.Release(ctxT(t), held.Token); err != nil {
			t.Fatal(err)
		}
		e.start(ps[0], "fifo", 0) // the releasing holder comes back at once
		if got, want := e.wait(), []int{1, 2, 3, 0}; !slices.Equal(got, want) {
			t.Errorf("order of entry %v, want %v", got, want)
		}
	})

	t.Run("process", func(t *testing.T) {
		held := mustAcquire(t, ps[0].svc, podReq("free", 0))
		e := &entries{t: t}
		e.start(ps[1], "free", 1)
		ps[1].untilBlocked(t, "free")
		if rs, err := ps[0].store.ListReservations(ctxT(t), ""); err != nil || len(rs) != 0 {
			t.Errorf("reservations under the process policy: %+v, %v", rs, err)
		}
		if _, err := ps[0].svc.Release(ctxT(t), held.Token); err != nil {
			t.Fatal(err)
		}
		if got := e.wait(); !slices.Equal(got, []int{1}) {
			t.Errorf("entries %v, want [1]", got)
		}
	})

	if rs, _ := ps[0].store.ListReservations(ctxT(t), ""); len(rs) != 0 {
		t.Errorf("reservations left: %+v", rs)
	}
	assertNoDrift(t, ps[0].store)
}

// TestMixedPoliciesOnOneResource: two lease names share a resource, one global, one
// process. While a global waiter queues at the level, the store's barrier holds back every
// acquisition there without a reservation, the process-policy lease's included: the
// holder that releases and comes back through the other name enters after the queued
// waiter (docs/waiting.md, "Mixing policies on one resource").
func TestMixedPoliciesOnOneResource(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{
		{name: "ordered", resource: "shared", global: 1, ttlSeconds: 60, waitMs: 30000, fairness: definition.FairGlobal},
		{name: "loose", resource: "shared", global: 1, ttlSeconds: 60, waitMs: 30000, fairness: definition.FairProcess},
	}, processOpts{})
	held := mustAcquire(t, ps[0].svc, podReq("loose", 0))
	e := &entries{t: t}
	e.start(ps[1], "ordered", 1)
	ps[0].untilQueued(t, globalKey("shared"), 1)
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
	for _, f := range []definition.Fairness{definition.FairProcess, definition.FairGlobal} {
		t.Run(string(f), func(t *testing.T) {
			def := leaseDef{name: "x", global: 1, ttlSeconds: 60, waitMs: definition.MaxWaitMs, fairness: f}
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
					l, err := p.svc.Acquire(ctx, podReq("x", i))
					if err != nil {
						errs <- err
						return
					}
					granted <- l
				}()
				waitfor.Until(t, "the waiter is blocked", func() bool { return p.queue.Blocked(globalKey("x")) >= i })
			}
			if f == definition.FairGlobal {
				p.untilQueued(t, globalKey("x"), 2)
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
			if rs, _ := p.store.ListReservations(ctxT(t), ""); len(rs) != 0 {
				t.Errorf("reservations left: %+v", rs)
			}
			assertNoDrift(t, p.store)
		})
	}
}
