package leasestore_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// crashWorld is one case of TestEveryBorrowingCrashWindowHeals: a surviving process (healer),
// a process that dies at the armed step (faulty), and what the survivor holds or has queued.
type crashWorld struct {
	t              *testing.T
	ctx            context.Context
	healer, faulty *leasestore.Store
	arm            func()
	crashed        *atomic.Bool
	mine           []string // the healer's tokens: let go of before the recovery
}

// keep records a token of the healer's.
func (w *crashWorld) keep(token string) string {
	w.mine = append(w.mine, token)
	return token
}

// hold acquires for the healer.
func (w *crashWorld) hold(req leasestore.AcquireRequest) lease.Holder {
	w.t.Helper()
	h := mustAcquire(w.t, w.healer, req)
	w.keep(h.Token)
	return h
}

// fill has the healer hold the global cap of 6 with req(0) ... req(5): for tenant a, 2
// within its cap and 4 borrowed.
func (w *crashWorld) fill(req func(i int) leasestore.AcquireRequest) []lease.Holder {
	w.t.Helper()
	hs := make([]lease.Holder, 6)
	for i := range hs {
		hs[i] = w.hold(req(i))
	}
	return hs
}

// queue makes req wait in line in s, and returns its token.
func (w *crashWorld) queue(s *leasestore.Store, req leasestore.AcquireRequest) string {
	w.t.Helper()
	_, err := s.Acquire(w.ctx, req)
	var waiting *leasestore.WaitingError
	if !errors.As(err, &waiting) {
		w.t.Fatalf("acquire for %s/%s: %v, want it to wait in line", req.Tenant, req.User, err)
	}
	return waiting.Token
}

// wantCrash fails unless err is the simulated crash at the armed step.
func (w *crashWorld) wantCrash(err error) {
	w.t.Helper()
	if !w.crashed.Load() || !errors.Is(err, leasestore.ErrCrash) {
		w.t.Fatalf("the armed operation answered %v (crashed %v), want the simulated crash", err, w.crashed.Load())
	}
}

// TestEveryBorrowingCrashWindowHeals: the writes that borrowing and priority add to the line
// (a borrowed increment at an acquisition and at a waiter's look, the unborrow of a borrower
// refused at the global level, the hand-over of a borrowed slot with its mark, the
// revocation of a reclaim, the pass-up of room to a waiter of higher priority) each leave,
// when their process dies right after them (the fault hook stops it dead), the levels serving
// their full caps again within one TTL and a margin, through what callers do anyway (the
// lazy sweep of idle holders and Heal on a refusal), with the global level never above its
// cap, and every counter exact once the dead process's holders are gone.
//
// The borrowing cases bound the tenant's borrowing (maxBorrowed 4: the tenant counter may
// reach 6, the global cap), so that a tenant slot leaked by the crash would keep the tenant
// from the whole global cap: recovery is the crashed tenant holding all 6 slots again.
func TestEveryBorrowingCrashWindowHeals(t *testing.T) {
	const ttl = 1500 * time.Millisecond
	pdf := func(tenant string, i int) leasestore.AcquireRequest {
		r := withBorrow(borrowReq(tenant, i, pdfCaps), &leasestore.Borrow{MaxBorrowed: 4})
		r.TTL = ttl
		return r
	}
	pdfWaiter := func(tenant string, i int) leasestore.AcquireRequest {
		r := pdf(tenant, i)
		r.WaitTTL = ttl // its process renews it, until it dies
		return r
	}
	gpu := func(user string, priority, cap int) leasestore.AcquireRequest {
		r := userReq(user, []lease.LevelCap{{Level: lease.LevelGlobal, Cap: cap}})
		r.Priority, r.TTL, r.WaitTTL = priority, ttl, ttl
		return r
	}
	pdfKeys := []string{tenantKey("a"), tenantKey("b"), tenantKey("c"), pdfGlobal}
	recoverPDF := func(i int) leasestore.AcquireRequest {
		r := pdf("a", 100+i)
		r.TTL = time.Hour
		return r
	}
	recoverGPU := func(i int) leasestore.AcquireRequest {
		r := gpu(uniq("new", i), 0, 2)
		r.TTL, r.WaitTTL = time.Hour, 0
		return r
	}

	cases := []struct {
		name      string
		step      leasestore.Step
		keyPrefix string
		// the recovery: what acquires, the resource's counters, how many it must hold at
		// once, and the global counter with its cap
		recover   func(i int) leasestore.AcquireRequest
		resource  string
		keys      []string
		want      int
		global    string
		globalCap int
		crashAt   func(w *crashWorld)
	}{
		{
			name: "borrowed booking at an acquisition", step: leasestore.StepBooked, keyPrefix: tenantKey("a"),
			recover: recoverPDF, resource: "pdf", keys: pdfKeys, want: 6, global: pdfGlobal, globalCap: 6,
			crashAt: func(w *crashWorld) {
				w.hold(pdf("a", 0))
				w.hold(pdf("a", 1))
				w.arm()
				_, err := w.faulty.Acquire(w.ctx, pdf("a", 2)) // above the cap: borrows
				w.wantCrash(err)
			},
		},
		{
			name: "borrowed booking at a waiter's look", step: leasestore.StepClaimBooked, keyPrefix: tenantKey("a"),
			recover: recoverPDF, resource: "pdf", keys: pdfKeys, want: 6, global: pdfGlobal, globalCap: 6,
			crashAt: func(w *crashWorld) {
				for _, tenant := range []string{"a", "b", "c"} {
					w.hold(pdf(tenant, 0))
					w.hold(pdf(tenant, 1))
				}
				a2 := w.queue(w.faulty, pdfWaiter("a", 2)) // the global level is full: a waits at its tenant level
				b0 := w.mine[2]
				if _, err := w.healer.Release(w.ctx, b0); err != nil { // room at the global level
					w.t.Fatal(err)
				}
				w.arm()
				_, err := w.faulty.Resume(w.ctx, withWait(pdfWaiter("a", 2), a2), "", true)
				w.wantCrash(err)
			},
		},
		{
			name: "unborrow", step: leasestore.StepUnborrowed, keyPrefix: tenantKey("a"),
			recover: recoverPDF, resource: "pdf", keys: pdfKeys, want: 6, global: pdfGlobal, globalCap: 6,
			crashAt: func(w *crashWorld) {
				hs := w.fill(func(i int) leasestore.AcquireRequest { return pdf("a", i) })
				a6 := w.queue(w.faulty, pdfWaiter("a", 6))   // at a's tenant level (cap + 4 reached)
				w.keep(w.queue(w.healer, pdfWaiter("b", 0))) // within b's cap, at the global level
				// A borrowed release: the tenant slot to a6 with its mark, the global one to b0.
				if _, err := w.healer.Release(w.ctx, hs[5].Token); err != nil {
					w.t.Fatal(err)
				}
				w.arm()
				_, err := w.faulty.Resume(w.ctx, withWait(pdfWaiter("a", 6), a6), tenantKey("a"), false)
				w.wantCrash(err)
			},
		},
		{
			name: "borrowed slot handed over with its mark", step: leasestore.StepHandedOver, keyPrefix: tenantKey("a"),
			recover: recoverPDF, resource: "pdf", keys: pdfKeys, want: 6, global: pdfGlobal, globalCap: 6,
			crashAt: func(w *crashWorld) {
				hs := w.fill(func(i int) leasestore.AcquireRequest { return pdf("a", i) })
				w.keep(w.queue(w.healer, pdfWaiter("a", 6)))
				w.arm()
				_, err := w.faulty.Release(w.ctx, hs[5].Token)
				w.wantCrash(err)
			},
		},
		{
			name: "revocation of a reclaim", step: leasestore.StepHolderReleased, keyPrefix: "",
			recover: recoverPDF, resource: "pdf", keys: pdfKeys, want: 6, global: pdfGlobal, globalCap: 6,
			crashAt: func(w *crashWorld) {
				w.fill(func(i int) leasestore.AcquireRequest { return pdf("a", i) })
				b0 := w.keep(w.queue(w.healer, pdfWaiter("b", 0)))
				w.arm()
				_, _, err := w.faulty.Reclaim(w.ctx, leasestore.ReclaimRequest{
					Resource: "pdf", Tenant: "b", TenantKey: tenantKey("b"), TenantCap: 2, For: lease.HolderID(b0)})
				w.wantCrash(err)
			},
		},
		{
			name: "pass-up to a higher priority", step: leasestore.StepHandedOver, keyPrefix: gpuKey,
			recover: recoverGPU, resource: "gpu", keys: []string{gpuKey}, want: 2, global: gpuKey, globalCap: 2,
			crashAt: func(w *crashWorld) {
				w.hold(gpu("ann", 0, 1))
				bob := w.queue(w.faulty, gpu("bob", 0, 1))
				w.keep(w.queue(w.healer, gpu("dan", 5, 1))) // later, but urgent
				w.arm()
				// bob looks with a raised cap: his increment finds room, which is dan's.
				_, err := w.faulty.Resume(w.ctx, withWait(gpu("bob", 0, 2), bob), "", true)
				w.wantCrash(err)
			},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			uri, db := newDatabase(t)
			healer := newStoreAt(t, uri, db)
			var armed, crashed atomic.Bool
			faulty := newStoreAt(t, uri, db, leasestore.WithOpTimeout(time.Second), leasestore.WithFault(func(st leasestore.Step, key string) error {
				if armed.Load() && st == tc.step && strings.HasPrefix(key, tc.keyPrefix) && crashed.CompareAndSwap(false, true) {
					return leasestore.ErrCrash
				}
				return nil
			}))
			ctx := ctxT(t)
			w := &crashWorld{t: t, ctx: ctx, healer: healer, faulty: faulty, arm: func() { armed.Store(true) }, crashed: &crashed}
			tc.crashAt(w)

			// The survivor lets go of everything it has: what remains is the dead process's.
			for _, token := range w.mine {
				if _, err := healer.Release(ctx, token); err != nil && !errors.Is(err, lease.ErrLost) {
					t.Fatalf("releasing the survivor's %s: %v", lease.HolderID(token), err)
				}
			}
			// A refusal asks for the sweep of the resource and the repair of its levels, as the
			// service does.
			tend := func() {
				if _, err := healer.SweepIdle(ctx, tc.resource); err != nil {
					t.Error(err)
				}
				for _, k := range tc.keys {
					if _, err := healer.Repair(ctx, k); err != nil {
						t.Error(err)
					}
				}
			}
			start := time.Now()
			var held []lease.Holder
			for time.Since(start) < ttl+2*time.Second && len(held) < tc.want {
				h, err := healer.Acquire(ctx, tc.recover(len(held)))
				if err == nil {
					held = append(held, h)
					continue
				}
				if !errors.Is(err, lease.ErrBusy) {
					t.Fatal(err)
				}
				tend()
				time.Sleep(20 * time.Millisecond) // real time: recovery is measured against the real TTL
			}
			took := time.Since(start)
			if len(held) < tc.want {
				t.Fatalf("after a crash at %s the level served %d of %d within %v; counters %v", tc.step, len(held), tc.want, ttl+2*time.Second, counts(t, healer))
			}
			if _, err := healer.Acquire(ctx, tc.recover(len(held))); !errors.Is(err, lease.ErrBusy) {
				t.Fatalf("one more acquisition: %v, want busy; counters %v", err, counts(t, healer))
			}
			if c := counts(t, healer)[tc.global]; c[0] > tc.globalCap || c[1] > tc.globalCap {
				t.Fatalf("global counter %v (count, booked), cap %d", c, tc.globalCap)
			}
			t.Logf("crash at %s: full cap served again after %v", tc.step, took.Round(time.Millisecond))

			// At rest, once the dead process's holders are gone, every counter is exact.
			for _, h := range held {
				if _, err := healer.Release(ctx, h.Token); err != nil {
					t.Fatal(err)
				}
			}
			raw := rawHolders(t, uri, db)
			for deadline := time.Now().Add(ttl + 2*time.Second); ; {
				tend()
				n, err := raw.CountDocuments(ctx, bson.D{})
				if err != nil {
					t.Fatal(err)
				}
				if n == 0 {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("%d holder documents left after the TTL", n)
				}
				time.Sleep(50 * time.Millisecond) // real time: the dead holders' TTL passes on the store's clock
			}
			tend()
			for k, v := range counts(t, healer) {
				if v != [2]int{0, 0} {
					t.Errorf("counter %s = %v (count, booked) at rest, want 0", k, v)
				}
			}
		})
	}
}
