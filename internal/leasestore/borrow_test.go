package leasestore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Borrowing idle capacity across tenants (docs/borrowing.md).

// pdfCaps: tenant cap 2, global cap 6 (the figure).
var pdfCaps = []lease.LevelCap{{Level: lease.LevelTenant, Cap: 2}, {Level: lease.LevelGlobal, Cap: 6}}

func borrowReq(tenant string, i int, caps []lease.LevelCap) leasestore.AcquireRequest {
	r := request("pdf", tenant, "p", uniq("u", i), caps)
	r.Pod = lease.PodRef{Namespace: tenant, Name: uniq("pod-", i), UID: uniq("uid-"+tenant, i)}
	r.Borrow = &leasestore.Borrow{}
	return r
}

func tenantKey(tenant string) string { return key("pdf", lease.LevelTenant, tenant, "", "") }

var pdfGlobal = key("pdf", lease.LevelGlobal, "", "", "")

// TestTenantBorrowsIdleCapacity: without borrowing a tenant is refused at its cap, as before;
// with it, a tenant alone on the resource takes slots above its cap up to the global cap,
// each marked borrowed; its tenant counter carries them, the global one stays exact.
func TestTenantBorrowsIdleCapacity(t *testing.T) {
	s := newStore(t)
	for i := range 2 {
		mustAcquire(t, s, withBorrow(borrowReq("a", i, pdfCaps), nil))
	}
	_, err := s.Acquire(context.Background(), withBorrow(borrowReq("a", 2, pdfCaps), nil))
	var busy *lease.BusyError
	if !errors.As(err, &busy) || busy.Level != lease.LevelTenant {
		t.Fatalf("without borrowing: %v, want busy at the tenant level", err)
	}
	var borrowed int
	for i := 2; i < 6; i++ {
		h := mustAcquire(t, s, borrowReq("a", i, pdfCaps))
		if !h.Borrowed {
			t.Errorf("holder %d not marked borrowed", i)
		}
		borrowed++
	}
	_, err = s.Acquire(context.Background(), borrowReq("a", 6, pdfCaps))
	if !errors.As(err, &busy) || busy.Level != lease.LevelTenant {
		t.Fatalf("7th acquisition: %v, want busy at the tenant level (the global level is full)", err)
	}
	want := map[string][2]int{tenantKey("a"): {6, 6}, pdfGlobal: {6, 6}}
	if diff := cmp.Diff(want, counts(t, s)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	hs, err := s.ListHolders(context.Background(), leasestore.HolderFilter{Resource: "pdf"})
	if err != nil {
		t.Fatal(err)
	}
	for _, h := range hs {
		if h.Borrowed {
			borrowed--
		}
	}
	if borrowed != 0 {
		t.Errorf("listed borrowed holders differ from the granted ones by %d", borrowed)
	}
}

func withBorrow(r leasestore.AcquireRequest, b *leasestore.Borrow) leasestore.AcquireRequest {
	r.Borrow = b
	return r
}

// TestCountersShowTheBorrowedSlots: a counter's Borrowed is the number of its booking
// holders marked borrowed at it: a tenant's slots above its cap on its tenant counter, none on
// the global counter or another tenant's, and one fewer when a borrowed holder is released.
func TestCountersShowTheBorrowedSlots(t *testing.T) {
	s := newStore(t)
	var borrowers []lease.Holder
	for i := range 4 {
		if h := mustAcquire(t, s, borrowReq("a", i, pdfCaps)); h.Borrowed {
			borrowers = append(borrowers, h)
		}
	}
	mustAcquire(t, s, borrowReq("b", 0, pdfCaps))
	borrowed := func() map[string][2]int {
		t.Helper()
		cs, err := s.ListCounters(ctxT(t), leasestore.CounterFilter{Resource: "pdf"})
		if err != nil {
			t.Fatal(err)
		}
		out := map[string][2]int{}
		for _, c := range cs {
			out[c.Key] = [2]int{c.Booked, c.Borrowed}
		}
		return out
	}
	want := map[string][2]int{tenantKey("a"): {4, 2}, tenantKey("b"): {1, 0}, pdfGlobal: {5, 0}}
	if diff := cmp.Diff(want, borrowed()); diff != "" || len(borrowers) != 2 {
		t.Fatalf("booked and borrowed per counter (-want +got):\n%s(%d borrowers, want 2)", diff, len(borrowers))
	}
	if _, err := s.Release(ctxT(t), borrowers[1].Token); err != nil {
		t.Fatal(err)
	}
	want = map[string][2]int{tenantKey("a"): {3, 1}, tenantKey("b"): {1, 0}, pdfGlobal: {4, 0}}
	if diff := cmp.Diff(want, borrowed()); diff != "" {
		t.Errorf("after a borrower's release (-want +got):\n%s", diff)
	}
}

// TestStaleMarksAreDropped: when holders of a borrowing tenant that were within its cap
// release, more holders carry the mark than slots stand above the cap. The counters show the
// slots above the cap (never more than count - cap); the marks stay while the tenant is above
// its cap (a reclaim picks among them, newest first), and once it is back within its cap the
// sweep's reconcile round drops them all, as Reconcile and a reclaim do.
func TestStaleMarksAreDropped(t *testing.T) {
	for _, via := range []string{"sweep round", "reconcile", "reclaim"} {
		t.Run(via, func(t *testing.T) {
			s, ctx := newStore(t), ctxT(t)
			hs := fillWithBorrowers(t, s) // hs[0], hs[1] within a's cap; hs[2..5] borrowed
			borrowedAt := func() int {
				t.Helper()
				cs, err := s.ListCounters(ctx, leasestore.CounterFilter{Resource: "pdf", Tenant: "a"})
				if err != nil || len(cs) != 1 {
					t.Fatalf("a's counters: %+v, %v", cs, err)
				}
				return cs[0].Borrowed
			}
			marked := func() (ids []string) {
				t.Helper()
				held, err := s.ListHolders(ctx, leasestore.HolderFilter{Resource: "pdf"})
				if err != nil {
					t.Fatal(err)
				}
				for _, h := range held {
					if h.Borrowed {
						ids = append(ids, h.ID)
					}
				}
				slices.Sort(ids)
				return ids
			}
			drop := func() int {
				t.Helper()
				switch via {
				case "sweep round":
					r, err := s.SweepRound(ctx)
					if err != nil {
						t.Fatal(err)
					}
					res, err := s.ReconcileRound(ctx, r)
					if err != nil {
						t.Fatal(err)
					}
					return res.Unmarked
				case "reconcile":
					res, err := s.Reconcile(ctx)
					if err != nil {
						t.Fatal(err)
					}
					return res.Unmarked
				}
				// b's tenant is within its cap: owed a slot, but nobody is above a cap.
				if h, ok, err := s.Reclaim(ctx, leasestore.ReclaimRequest{Resource: "pdf", Tenant: "b", TenantKey: tenantKey("b"), TenantCap: 2, For: "w"}); ok || err != nil {
					t.Fatalf("reclaim revoked %+v (%v, %v), want nobody: a is within its cap", h, ok, err)
				}
				return -1
			}
			ids := func(hs ...lease.Holder) (out []string) {
				for _, h := range hs {
					out = append(out, h.ID)
				}
				slices.Sort(out)
				return out
			}
			for _, h := range hs[:2] { // within the cap: their release leaves 4 marks for 2 slots above it
				if _, err := s.Release(ctx, h.Token); err != nil {
					t.Fatal(err)
				}
			}
			if got := borrowedAt(); got != 2 {
				t.Errorf("a's counter shows %d borrowed, want 2 (count 4, cap 2)", got)
			}
			if via != "reclaim" {
				if n := drop(); n != 0 {
					t.Errorf("dropped %d marks while a is above its cap, want none", n)
				}
			}
			if diff := cmp.Diff(ids(hs[2:]...), marked()); diff != "" {
				t.Errorf("marked holders above the cap (-want +got):\n%s", diff)
			}
			for _, h := range hs[4:] {
				if _, err := s.Release(ctx, h.Token); err != nil {
					t.Fatal(err)
				}
			}
			if got := borrowedAt(); got != 0 {
				t.Errorf("a's counter shows %d borrowed at its cap, want 0", got)
			}
			if n := drop(); via != "reclaim" && n != 2 {
				t.Errorf("dropped %d marks at the cap, want 2", n)
			}
			if got := marked(); len(got) != 0 {
				t.Errorf("holders still marked borrowed within a's cap: %v", got)
			}
			assertNoDrift(t, s)
		})
	}
}

// TestMaxBorrowedBoundsATenant: maxBorrowed 1 lets a tenant hold one slot above its cap.
func TestMaxBorrowedBoundsATenant(t *testing.T) {
	s := newStore(t)
	for i := range 3 {
		mustAcquire(t, s, withBorrow(borrowReq("a", i, pdfCaps), &leasestore.Borrow{MaxBorrowed: 1}))
	}
	_, err := s.Acquire(context.Background(), withBorrow(borrowReq("a", 3, pdfCaps), &leasestore.Borrow{MaxBorrowed: 1}))
	var busy *lease.BusyError
	if !errors.As(err, &busy) || busy.Level != lease.LevelTenant {
		t.Fatalf("4th: %v, want busy at the tenant level", err)
	}
}

// fillWithBorrowers has tenant a hold all six slots, four of them borrowed.
func fillWithBorrowers(t *testing.T, s *leasestore.Store) []lease.Holder {
	t.Helper()
	hs := make([]lease.Holder, 6)
	for i := range hs {
		hs[i] = mustAcquire(t, s, borrowReq("a", i, pdfCaps))
	}
	return hs
}

// TestReclaimRevokesTheNewestBorrowerForAWaiterWithinItsCap: tenant b's waiter, within its
// cap and blocked at the global level, reclaims: the most recently granted borrowed holder
// of a is revoked (its next check answers LEASE_LOST), and the global slot is handed to b's
// waiter. A waiter whose tenant holds its cap reclaims nothing, and holders within a's cap
// are never revoked.
func TestReclaimRevokesTheNewestBorrowerForAWaiterWithinItsCap(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	hs := fillWithBorrowers(t, s)
	b := queueWaiter(t, s, borrowReq("b", 0, pdfCaps))
	if line, _ := s.Line(ctx, pdfGlobal); len(line) != 1 {
		t.Fatalf("global line %+v, want b's waiter", line)
	}
	forB := leasestore.ReclaimRequest{Resource: "pdf", Tenant: "b", TenantKey: tenantKey("b"), TenantCap: 2, For: lease.HolderID(b)}
	var revoked []string
	for range 4 {
		h, ok, err := s.Reclaim(ctx, forB)
		if err != nil || !ok {
			t.Fatalf("reclaim: %v, %v; want a borrowed holder revoked", ok, err)
		}
		if h.ReclaimedFor != "b waiter "+lease.HolderID(b) || h.Tenant != "a" {
			t.Errorf("revoked %+v, want a's holder reclaimed for b's waiter", h)
		}
		revoked = append(revoked, h.ID)
	}
	// Newest first: hs[5], hs[4], hs[3], hs[2]; hs[0] and hs[1] are within a's cap.
	if diff := cmp.Diff([]string{hs[5].ID, hs[4].ID, hs[3].ID, hs[2].ID}, revoked); diff != "" {
		t.Errorf("revoked (-want +got):\n%s", diff)
	}
	if _, ok, err := s.Reclaim(ctx, forB); ok || err != nil {
		t.Fatalf("fifth reclaim: %v, %v; want nothing revoked (a is within its cap)", ok, err)
	}
	for _, h := range hs[:2] {
		if err := s.Touch(ctx, h.Token); err != nil {
			t.Errorf("a's holder within its cap: %v", err)
		}
	}
	if err := s.Touch(ctx, hs[5].Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("reclaimed holder's check: %v, want LEASE_LOST", err)
	}
	got, err := resume(t, s, borrowReq("b", 0, pdfCaps), b, pdfGlobal, false)
	if err != nil || got.State != lease.StateHeld || got.Borrowed {
		t.Fatalf("b's waiter: %+v, %v; want it handed the reclaimed global slot, not borrowed", got, err)
	}
	assertNoDrift(t, s)
}

// TestConcurrentReclaimsTakeOneSlotAboveTheCapOnce: a is one slot above its cap, with two
// holders marked borrowed (a holder within the cap released since). A second reclaim runs
// while the first one's victim is released but its slot not yet given back (the fault step
// holder-released): it must see that slot as gone. Taking the counter at its word, it revoked
// the other marked holder too, and a was left below its cap.
func TestConcurrentReclaimsTakeOneSlotAboveTheCapOnce(t *testing.T) {
	uri, db := newDatabase(t)
	ctx := ctxT(t)
	other := newStoreAt(t, uri, db)
	forB := leasestore.ReclaimRequest{Resource: "pdf", Tenant: "b", TenantKey: tenantKey("b"), TenantCap: 2, For: "w"}
	var once atomic.Bool
	var second []string
	reclaimer := newStoreAt(t, uri, db, leasestore.WithFault(func(st leasestore.Step, _ string) error {
		if st == leasestore.StepHolderReleased && once.CompareAndSwap(false, true) {
			h, ok, err := other.Reclaim(ctx, forB)
			if err != nil {
				t.Error(err)
			}
			if ok {
				second = append(second, h.ID)
			}
		}
		return nil
	}))
	hs := make([]lease.Holder, 4)
	for i := range hs {
		hs[i] = mustAcquire(t, other, borrowReq("a", i, pdfCaps))
	}
	if !hs[2].Borrowed || !hs[3].Borrowed {
		t.Fatalf("holders %+v, want the third and fourth borrowed", hs)
	}
	if _, err := other.Release(ctx, hs[0].Token); err != nil { // a: 3 held, 1 above its cap, 2 marks
		t.Fatal(err)
	}
	first, ok, err := reclaimer.Reclaim(ctx, forB)
	if err != nil || !ok || first.ID != hs[3].ID {
		t.Fatalf("first reclaim: %+v, %v, %v; want the newest borrowed holder revoked", first, ok, err)
	}
	if len(second) != 0 {
		t.Errorf("the concurrent reclaim revoked %v as well: a had one slot above its cap", second)
	}
	for _, h := range hs[1:3] {
		if err := other.Touch(ctx, h.Token); err != nil {
			t.Errorf("a's holder %s, within a's cap now: %v", h.ID, err)
		}
	}
	if c := counts(t, other)[tenantKey("a")]; c != [2]int{2, 2} {
		t.Errorf("a's counter %v (count, booked), want its cap 2", c)
	}
	assertNoDrift(t, other)
}

// TestReclaimOwesNothingToATenantAboveItsCap: a waiter whose tenant holds more than its cap
// (a waiter at the global level counts its own tenant slot) reclaims nothing.
func TestReclaimOwesNothingToATenantAboveItsCap(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	fillWithBorrowers(t, s)
	for i := range 3 {
		mustAcquire(t, s, withBorrow(borrowReq("b", 10+i, []lease.LevelCap{{Level: lease.LevelTenant, Cap: 3}}), nil))
	}
	// b holds 3 on its tenant counter (through a lease capped at 3 without a global level)
	// and asks as a waiter of a lease that caps b at 2.
	h, ok, err := s.Reclaim(ctx, leasestore.ReclaimRequest{Resource: "pdf", Tenant: "b", TenantKey: tenantKey("b"), TenantCap: 2, For: "x"})
	if ok || err != nil {
		t.Fatalf("reclaim for a tenant at its cap: %+v, %v, %v; want nothing", h, ok, err)
	}
}

// TestBorrowedSlotHandedOverKeepsItsMark: a borrowed holder's release hands its tenant slot
// to the tenant's next waiter, which is then the borrower (its tenant is still above its cap
// by that slot), and takes the global slot the same release gave back.
func TestBorrowedSlotHandedOverKeepsItsMark(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	hs := fillWithBorrowers(t, s)
	w := queueWaiter(t, s, borrowReq("a", 6, pdfCaps))
	if line, _ := s.Line(ctx, tenantKey("a")); len(line) != 1 {
		t.Fatalf("a's tenant line %+v, want its 7th acquisition there", line)
	}
	if _, err := s.Release(ctx, hs[5].Token); err != nil {
		t.Fatal(err)
	}
	h, err := resume(t, s, borrowReq("a", 6, pdfCaps), w, tenantKey("a"), false)
	if err != nil || h.State != lease.StateHeld || !h.Borrowed {
		t.Fatalf("a's waiter: %+v, %v; want it held and borrowed", h, err)
	}
	assertNoDrift(t, s)
}

// TestBorrowerDoesNotWaitAtTheGlobalLevel: a borrowed tenant slot handed to a's waiter while
// b's waiter takes the global slot leaves a's waiter refused at the global level: it gives
// the borrowed slot back and waits at its tenant level, so the global line holds only
// waiters within their tenant caps (whom reclaim serves).
func TestBorrowerDoesNotWaitAtTheGlobalLevel(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	hs := fillWithBorrowers(t, s)
	wa := queueWaiter(t, s, borrowReq("a", 6, pdfCaps))
	wb := queueWaiter(t, s, borrowReq("b", 0, pdfCaps))
	if _, err := s.Release(ctx, hs[5].Token); err != nil { // borrowed: tenant slot to wa, global to wb
		t.Fatal(err)
	}
	if h, err := resume(t, s, borrowReq("b", 0, pdfCaps), wb, pdfGlobal, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("b's waiter: %+v, %v; want the global slot", h, err)
	}
	_, err := resume(t, s, borrowReq("a", 6, pdfCaps), wa, tenantKey("a"), false)
	var waiting *leasestore.WaitingError
	if !errors.As(err, &waiting) || waiting.Busy.Level != lease.LevelTenant {
		t.Fatalf("a's waiter: %v, want it waiting at its tenant level", err)
	}
	if line, _ := s.Line(ctx, pdfGlobal); len(line) != 0 {
		t.Errorf("global line %+v, want nobody (a borrower does not wait there)", line)
	}
	if line, _ := s.Line(ctx, tenantKey("a")); len(line) != 1 || line[0].ID != lease.HolderID(wa) {
		t.Errorf("a's tenant line %+v, want a's waiter", line)
	}
	assertNoDrift(t, s)
}

// TestWaiterHandedASlotAboveTheCapDoesNotWaitAtTheGlobalLevel: a holder within a's cap
// releases while a is above it; its tenant slot goes to a's waiter (unmarked, a still above
// its cap by it) and its global slot to b's first waiter. Refused at the global level, a's
// waiter gives that slot back and waits at its tenant level: waiting at the global level with
// its old place, it stood ahead of b's second waiter, took the slot b's reclaim freed, and b,
// within its cap, waited on.
func TestWaiterHandedASlotAboveTheCapDoesNotWaitAtTheGlobalLevel(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	hs := fillWithBorrowers(t, s)
	wa := queueWaiter(t, s, borrowReq("a", 6, pdfCaps))
	wb := queueWaiter(t, s, borrowReq("b", 0, pdfCaps))
	if _, err := s.Release(ctx, hs[0].Token); err != nil { // within a's cap: tenant slot to wa, global to wb
		t.Fatal(err)
	}
	if h, err := resume(t, s, borrowReq("b", 0, pdfCaps), wb, pdfGlobal, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("b's first waiter: %+v, %v; want the global slot", h, err)
	}
	wb2 := queueWaiter(t, s, borrowReq("b", 1, pdfCaps))
	_, err := resume(t, s, borrowReq("a", 6, pdfCaps), wa, tenantKey("a"), false)
	var waiting *leasestore.WaitingError
	if !errors.As(err, &waiting) || waiting.Busy.Level != lease.LevelTenant {
		t.Fatalf("a's waiter: %v, want it waiting at its tenant level (a is above its cap)", err)
	}
	if line, _ := s.Line(ctx, pdfGlobal); len(line) != 1 || line[0].ID != lease.HolderID(wb2) {
		t.Errorf("global line %+v, want b's second waiter alone", line)
	}
	forB := leasestore.ReclaimRequest{Resource: "pdf", Tenant: "b", TenantKey: tenantKey("b"), TenantCap: 2, For: lease.HolderID(wb2)}
	v, ok, err := s.Reclaim(ctx, forB)
	if err != nil || !ok || v.ID != hs[5].ID {
		t.Fatalf("reclaim: %+v, %v, %v; want a's newest borrower revoked", v, ok, err)
	}
	if h, err := resume(t, s, borrowReq("b", 1, pdfCaps), wb2, pdfGlobal, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("b's second waiter: %+v, %v; want the reclaimed global slot", h, err)
	}
	// The reclaimed holder's tenant slot went to a's waiter (marked): refused at the global
	// level again, it gives it back.
	if _, err := resume(t, s, borrowReq("a", 6, pdfCaps), wa, tenantKey("a"), false); !errors.As(err, &waiting) || waiting.Busy.Level != lease.LevelTenant {
		t.Fatalf("a's waiter handed the reclaimed tenant slot: %v, want it waiting at its tenant level", err)
	}
	assertAtRest(t, s, map[string][2]int{tenantKey("a"): {4, 4}, tenantKey("b"): {2, 2}, pdfGlobal: {6, 6}})
}

// TestTwoWaitersAboveTheCapGiveBackOnlyTheSlotsAboveIt: a is one above its cap with two of
// its waiters handed slots of its line, both refused at the global level; the second gives
// its slot back while the first is between dropping the slot and giving it back (the fault
// step unborrowed). One slot goes back (a at its cap, never below it while its line waits);
// the first waiter is within the cap then, books its slot again and waits at the global level.
func TestTwoWaitersAboveTheCapGiveBackOnlyTheSlotsAboveIt(t *testing.T) {
	uri, db := newDatabase(t)
	ctx := ctxT(t)
	s := newStoreAt(t, uri, db)
	caps := []lease.LevelCap{{Level: lease.LevelTenant, Cap: 2}, {Level: lease.LevelGlobal, Cap: 3}}
	a := make([]lease.Holder, 3)
	for i := range a {
		a[i] = mustAcquire(t, s, borrowReq("a", i, caps)) // a[2] borrowed
	}
	wa1 := queueWaiter(t, s, borrowReq("a", 3, caps))
	wa2 := queueWaiter(t, s, borrowReq("a", 4, caps))
	wb := queueWaiter(t, s, borrowReq("b", 0, caps))
	wb2 := queueWaiter(t, s, borrowReq("b", 1, caps))
	for _, h := range a[:2] { // within a's cap: tenant slots to wa1, wa2; global ones to wb, wb2
		if _, err := s.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
	}
	var once atomic.Bool
	var second error
	var dips []int // a's count when the first waiter queues at a's level: below the cap is a dip
	first := newStoreAt(t, uri, db, leasestore.WithFault(func(st leasestore.Step, k string) error {
		switch {
		case st == leasestore.StepUnborrowed && once.CompareAndSwap(false, true):
			_, second = resume(t, s, borrowReq("a", 4, caps), wa2, tenantKey("a"), false)
		case st == leasestore.StepQueued && k == tenantKey("a"):
			if c := counts(t, s)[tenantKey("a")][0]; c < 2 {
				dips = append(dips, c)
			}
		}
		return nil
	}))
	_, err := resume(t, first, borrowReq("a", 3, caps), wa1, tenantKey("a"), false)
	for name, c := range map[string]struct {
		err  error
		want lease.Level
	}{"first": {err, lease.LevelGlobal}, "second": {second, lease.LevelTenant}} {
		var waiting *leasestore.WaitingError
		if !errors.As(c.err, &waiting) || waiting.Busy.Level != c.want {
			t.Errorf("a's %s waiter: %v, want it waiting at the %s level", name, c.err, c.want)
		}
	}
	if len(dips) > 0 {
		t.Errorf("a's count fell below its cap of 2 while its line waited: %v", dips)
	}
	for i, w := range []string{wb, wb2} {
		if h, err := resume(t, s, borrowReq("b", i, caps), w, pdfGlobal, false); err != nil || h.State != lease.StateHeld {
			t.Fatalf("b's waiter %d: %+v, %v; want a global slot", i, h, err)
		}
	}
	assertAtRest(t, s, map[string][2]int{tenantKey("a"): {2, 2}, tenantKey("b"): {2, 2}, pdfGlobal: {3, 3}})
}

// assertAtRest checks the counters against want, and against what their holders book.
func assertAtRest(t *testing.T, s *leasestore.Store, want map[string][2]int) {
	t.Helper()
	if diff := cmp.Diff(want, counts(t, s)); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	assertNoDrift(t, s)
}

// TestBorrowingInvariantsUnderConcurrentTenants: two processes (stores on one database),
// three tenants with borrowing; tenant a bursts with 8 loops holding 1.7-2.1 s, b and c
// return after 0.5 s with 2 loops each holding 20-60 ms, every loop acquiring with a wait;
// each waiter at the global level past
// a grace of 100 ms reclaims, as the waiting path does. A sampler reads the counters all the
// while. Invariants: the global level never exceeds its cap, nor does a project level capped
// at 4 (a's project p, with 5 of a's loops, reaches it by borrowing and stops there), no tenant
// exceeds its cap plus the global cap; every reclaim revokes a borrowed holder of another tenant; at rest every counter equals
// what its holders book and no holder is left.
func TestBorrowingInvariantsUnderConcurrentTenants(t *testing.T) {
	uri, db := newDatabase(t)
	stores := []*leasestore.Store{newStoreAt(t, uri, db), newStoreAt(t, uri, db)}
	// A project cap: borrowing passes the tenant cap only.
	caps := append([]lease.LevelCap{{Level: lease.LevelProject, Cap: 4}}, pdfCaps...)
	ctx := ctxT(t)
	stop := time.Now().Add(3 * time.Second)
	var wg sync.WaitGroup
	var grants, reclaims atomic.Int64
	errs := make(chan error, 64)
	fail := func(format string, args ...any) {
		select {
		case errs <- fmt.Errorf(format, args...):
		default:
		}
	}
	var maxOwedWait atomic.Int64 // the longest wait of b and c, who stay within their caps
	loop := func(tenant string, i int) {
		defer wg.Done()
		s := stores[i%2]
		if tenant != "a" {
			time.Sleep(500 * time.Millisecond) // real time: b and c return while a bursts
		}
		for n := 0; time.Now().Before(stop); n++ {
			req := borrowReq(tenant, i*1000+n, caps)
			if tenant == "a" && i >= 5 {
				req.Project = "q" // a's projects: p with 5 loops (capped at 4), q with 3
			}
			req.WaitTTL = 2 * time.Second
			h, err := s.Acquire(ctx, req)
			var waiting *leasestore.WaitingError
			since := time.Now()
			for errors.As(err, &waiting) && time.Now().Before(stop.Add(time.Second)) {
				if waiting.Busy.Level == lease.LevelGlobal && time.Since(since) > 100*time.Millisecond {
					if v, ok, rerr := s.Reclaim(ctx, leasestore.ReclaimRequest{Resource: "pdf", Tenant: tenant,
						TenantKey: tenantKey(tenant), TenantCap: 2, For: lease.HolderID(waiting.Token)}); rerr != nil {
						fail("reclaim for %s: %v", tenant, rerr)
					} else if ok {
						reclaims.Add(1)
						if !v.Borrowed || v.Tenant == tenant {
							fail("reclaim revoked %+v for %s", v, tenant)
						}
					}
				}
				time.Sleep(20 * time.Millisecond) // real time: a waiter's look, shortened
				req.Token = waiting.Token
				h, err = s.Resume(ctx, req, "", true)
			}
			if errors.As(err, &waiting) {
				if err := s.Withdraw(ctx, waiting.Token); err != nil {
					fail("withdrawing %s's waiter: %v", tenant, err)
				}
				continue
			}
			if err != nil {
				fail("%s %d: %v", tenant, i, err)
				return
			}
			grants.Add(1)
			if tenant != "a" {
				if w := time.Since(since); w > time.Duration(maxOwedWait.Load()) {
					maxOwedWait.Store(int64(w))
				}
			}
			hold := time.Duration(20+n%5*10) * time.Millisecond
			if tenant == "a" {
				hold = 1500*time.Millisecond + hold*10 // a's holds outlast the grace: b and c are served by reclaim
			}
			time.Sleep(hold) // real time: a hold
			if _, err := s.Release(ctx, h.Token); err != nil {
				fail("release: %v", err)
				return
			}
		}
	}
	for i := range 8 {
		wg.Add(1)
		go loop("a", i)
	}
	for _, tn := range []string{"b", "c"} {
		for i := range 2 {
			wg.Add(1)
			go loop(tn, i)
		}
	}
	sampled, aProject := 0, 0
	for time.Now().Before(stop) {
		for k, v := range counts(t, stores[0]) {
			switch {
			case k == pdfGlobal && v[0] > 6:
				t.Errorf("global count %d above its cap 6", v[0])
			case strings.HasPrefix(k, "pdf|project|") && v[0] > 4:
				t.Errorf("%s count %d above its cap 4", k, v[0])
			case k == key("pdf", lease.LevelProject, "a", "p", ""):
				aProject = max(aProject, v[0])
			case k != pdfGlobal && v[0] > 2+6:
				t.Errorf("%s count %d above cap plus global", k, v[0])
			}
		}
		sampled++
		time.Sleep(10 * time.Millisecond) // real time: the sampler's pace
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if grants.Load() < 20 || sampled < 10 {
		t.Fatalf("%d grants, %d samples: too few to mean anything", grants.Load(), sampled)
	}
	t.Logf("%d grants, %d reclaims, %d samples, longest wait of b and c %v", grants.Load(), reclaims.Load(), sampled, time.Duration(maxOwedWait.Load()))
	if reclaims.Load() == 0 {
		t.Error("no reclaim: b and c never waited behind a's borrowed slots")
	}
	if aProject != 4 {
		t.Errorf("a's project p reached %d, want its cap 4: a borrowed up to it, and never past it", aProject)
	}
	// How long b and c waited (the grace, 100 ms, plus one hand-over and the 20 ms looks) is
	// a figure, logged above, not an assertion: it depends on the machine's load (measured:
	// 0.3 s alone, 1.2 s beside the package's other tests; docs/borrowing.md).
	assertNoDrift(t, stores[0])
	hs, err := stores[0].ListHolders(ctx, leasestore.HolderFilter{})
	if err != nil || len(hs) != 0 {
		t.Errorf("holders at rest: %d, %v; want none", len(hs), err)
	}
}
