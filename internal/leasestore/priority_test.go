package leasestore_test

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Priority among waiters (docs/waiting.md, "Priority").

func prioReq(user string, priority int) leasestore.AcquireRequest {
	req := userReq(user, globalCap1)
	req.Priority = priority
	return req
}

// TestLineServesHighestPriorityFirst: two processes (two stores on one database) queue
// waiters of priority 0 and 5; every slot that comes back goes to the highest priority
// first, and within a priority to the oldest, whichever process released it or waits.
func TestLineServesHighestPriorityFirst(t *testing.T) {
	uri, db := newDatabase(t)
	a, b := newStoreAt(t, uri, db), newStoreAt(t, uri, db)
	ctx := ctxT(t)
	held := mustAcquire(t, a, prioReq("ann", 0))
	bob := queueWaiter(t, a, prioReq("bob", 0))
	cid := queueWaiter(t, b, prioReq("cid", 0))
	dan := queueWaiter(t, b, prioReq("dan", 5)) // later, but urgent
	eve := queueWaiter(t, a, prioReq("eve", 5))

	line, err := a.Line(ctx, gpuKey)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, w := range line {
		got = append(got, w.ID)
	}
	want := []string{lease.HolderID(dan), lease.HolderID(eve), lease.HolderID(bob), lease.HolderID(cid)}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Fatalf("line (-want +got):\n%s", diff)
	}

	next := held.Token
	for i, w := range []struct {
		user, token string
		store       *leasestore.Store
	}{{"dan", dan, b}, {"eve", eve, a}, {"bob", bob, a}, {"cid", cid, b}} {
		releaser := []*leasestore.Store{a, b}[i%2]
		if _, err := releaser.Release(ctx, next); err != nil {
			t.Fatal(err)
		}
		h, err := resume(t, w.store, prioReq(w.user, 0), w.token, gpuKey, false)
		if err != nil || h.State != lease.StateHeld {
			t.Fatalf("slot %d: %s taking it: %+v, %v; want it handed to %s", i+1, w.user, h, err, w.user)
		}
		next = w.token
	}
	if _, err := b.Release(ctx, next); err != nil {
		t.Fatal(err)
	}
	assertNoDrift(t, a)
}

// gpuKey is the counter of gpu's global level, capped at 1 (globalCap1).
var gpuKey = key("gpu", lease.LevelGlobal, "acme", "p", "ann")

// oldThenUrgent fills gpuKey's level (ann holds it), then queues bob (priority 0) and after him
// dan (priority 5).
func oldThenUrgent(t *testing.T, s *leasestore.Store) (held lease.Holder, bob, dan string) {
	t.Helper()
	held = mustAcquire(t, s, prioReq("ann", 0))
	return held, queueWaiter(t, s, prioReq("bob", 0)), queueWaiter(t, s, prioReq("dan", 5))
}

// TestRoomAtTheCounterGoesToTheHigherPriority: room that reaches the counter rather than a
// waiter (here a cap raised under the waiters) is not taken by a waiter of lower priority
// that happens to look first: it hands the slot to the higher one.
func TestRoomAtTheCounterGoesToTheHigherPriority(t *testing.T) {
	s, ctx := newStore(t), ctxT(t)
	held, low, high := oldThenUrgent(t, s)

	raised := func(user string, priority int) leasestore.AcquireRequest {
		req := prioReq(user, priority)
		req.Caps, req.WaitTTL = []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 2}}, time.Minute
		return req
	}
	if _, err := resume(t, s, raised("bob", 0), low, "", true); !isWaiting(err) {
		t.Fatalf("bob looking at the raised cap: %v, want him still waiting behind dan", err)
	}
	h, err := resume(t, s, raised("dan", 5), high, gpuKey, false)
	if err != nil || h.State != lease.StateHeld {
		t.Fatalf("dan after bob's look: %+v, %v; want the room handed to him", h, err)
	}
	if _, err := s.Release(ctx, held.Token); err != nil {
		t.Fatal(err)
	}
	if h, err := resume(t, s, raised("bob", 0), low, gpuKey, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("bob next: %+v, %v", h, err)
	}
	assertNoDrift(t, s)
}

// TestPositionsCountHigherPrioritiesFirst: the views' positions and a busy answer's (Ahead)
// follow the hand-overs' order.
func TestPositionsCountHigherPrioritiesFirst(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	mustAcquire(t, s, prioReq("ann", 0))
	tokens := map[string]string{}
	for _, w := range []struct {
		user     string
		priority int
	}{{"bob", 0}, {"cid", 2}, {"dan", 0}, {"eve", 7}} {
		tokens[w.user] = queueWaiter(t, s, prioReq(w.user, w.priority))
	}
	ws, err := s.ListWaiters(ctx, leasestore.HolderFilter{Resource: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	type place struct {
		User               string
		Priority, Position int
	}
	var got []place
	for _, w := range ws {
		got = append(got, place{w.Holder.User, w.Priority, w.Position})
	}
	want := []place{{"eve", 7, 0}, {"cid", 2, 1}, {"bob", 0, 2}, {"dan", 0, 3}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("waiters (-want +got):\n%s", diff)
	}
	for user, n := range map[string]int{"eve": 0, "cid": 1, "bob": 2, "dan": 3} {
		if ahead, err := s.Ahead(ctx, gpuKey, tokens[user]); err != nil || ahead != n {
			t.Errorf("Ahead of %s = %d, %v; want %d", user, ahead, err, n)
		}
	}
}

// TestRenewalRaisesAnAgedWaiter: the waiting process raises a waiter past its definition's
// age bound to the highest priority in the renewal of its safety look (no round trip of its
// own); the next slot is its, ahead of younger urgent waiters.
func TestRenewalRaisesAnAgedWaiter(t *testing.T) {
	s, ctx := newStore(t), ctxT(t)
	held, old, urgent := oldThenUrgent(t, s)
	first := func() string {
		t.Helper()
		line, err := s.Line(ctx, gpuKey)
		if err != nil || len(line) != 2 {
			t.Fatalf("line %v, %v; want two waiters", line, err)
		}
		return line[0].ID
	}
	if got := first(); got != lease.HolderID(urgent) {
		t.Fatalf("before the raise %s is first, want dan (priority 5)", got)
	}
	aged := prioReq("bob", 1000) // what the process asks once the bound has passed
	aged.WaitTTL = time.Minute
	if _, err := resume(t, s, aged, old, "", false); !isWaiting(err) {
		t.Fatalf("bob's renewal: %v, want him waiting", err)
	}
	if got := first(); got != lease.HolderID(old) {
		t.Fatalf("after the raise %s is first, want bob", got)
	}
	if _, err := s.Release(ctx, held.Token); err != nil {
		t.Fatal(err)
	}
	if h, err := resume(t, s, aged, old, gpuKey, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("bob, aged: %+v, %v; want the slot handed to him before dan", h, err)
	}
	if ahead, err := s.Ahead(ctx, gpuKey, urgent); err != nil || ahead != 0 {
		t.Errorf("dan: %d ahead, %v; want 0", ahead, err)
	}
}
