package leasestore_test

import (
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// TestWaitersShowTheirPlaceAndAnEstimate: the waiters of a full level are listed oldest
// first with their level, scope, cap and the number of live waiters ahead of them, across
// tenants (a tenant's list counts the other tenant's waiter ahead without naming it), a
// lapsed place is shown but not counted; Ahead answers the same for a waiter and the whole
// line for an acquisition that is not in it. The estimate appears once a hand-over recorded a
// hold time, and grows with the position.
func TestWaitersShowTheirPlaceAndAnEstimate(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := globalCap1
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	first := mustAcquire(t, s, userReq("ann", caps))
	lapsed := userReq("old", caps)
	lapsed.WaitTTL = time.Millisecond
	if _, err := s.Acquire(ctx, lapsed); !isWaiting(err) {
		t.Fatalf("lapsing waiter: %v", err)
	}
	bob := queueWaiter(t, s, userReq("bob", caps))
	eve := request("gpu", "globex", "web", "eve", caps)
	eve.Pod = lease.PodRef{Namespace: "globex", Name: "pod-eve", UID: "uid-eve"}
	eveTok := queueWaiter(t, s, eve)
	cid := queueWaiter(t, s, userReq("cid", caps))

	all, err := s.ListWaiters(ctx, leasestore.HolderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	type place struct {
		user     string
		position int
		lapsed   bool
	}
	var got []place
	for _, w := range all {
		got = append(got, place{w.Holder.User, w.Position, w.Lapsed})
		if w.Key != k || w.Level != lease.LevelGlobal || w.Scope != "*" || w.Cap != 1 || w.Holder.Token != "" || w.Holder.State != lease.StateWaiting {
			t.Errorf("waiter %s: key %q level %q scope %q cap %d token %q state %q", w.Holder.User, w.Key, w.Level, w.Scope, w.Cap, w.Holder.Token, w.Holder.State)
		}
		if w.EstimatedWait != 0 {
			t.Errorf("waiter %s: estimate %v before any hand-over recorded a hold time", w.Holder.User, w.EstimatedWait)
		}
	}
	want := []place{{"old", 0, true}, {"bob", 0, false}, {"eve", 1, false}, {"cid", 2, false}}
	if len(got) != len(want) {
		t.Fatalf("waiters %+v, want %+v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("waiters %+v, want %+v", got, want)
		}
	}
	acme, err := s.ListWaiters(ctx, leasestore.HolderFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if len(acme) != 3 || acme[2].Holder.User != "cid" || acme[2].Position != 2 {
		t.Fatalf("acme's waiters %+v: want old, bob, cid with cid behind bob and globex's eve", acme)
	}
	for _, tc := range []struct {
		token string
		want  int
	}{{bob, 0}, {eveTok, 1}, {cid, 2}, {"not-in-line", 3}} {
		if n, err := s.Ahead(ctx, k, tc.token); err != nil || n != tc.want {
			t.Errorf("Ahead(%s) = %d, %v; want %d", tc.token, n, err, tc.want)
		}
	}

	// ann's release hands the slot to bob and records her hold time.
	time.Sleep(20 * time.Millisecond) // real time: ann holds for a measurable time
	if _, err := s.Release(ctx, first.Token); err != nil {
		t.Fatal(err)
	}
	holds, err := s.HoldTimes(ctx, "gpu")
	if err != nil || len(holds) != 1 || holds[0] < 20*time.Millisecond {
		t.Fatalf("hold times after the hand-over: %v, %v; want ann's one hold of at least 20ms", holds, err)
	}
	all, err = s.ListWaiters(ctx, leasestore.HolderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	var estEve, estCid time.Duration
	for _, w := range all {
		switch w.Holder.User {
		case "eve":
			estEve = w.EstimatedWait
			if w.Position != 0 {
				t.Errorf("eve after bob was handed the slot: position %d, want 0", w.Position)
			}
		case "cid":
			estCid = w.EstimatedWait
		case "bob":
			t.Errorf("bob is still listed as waiting after the hand-over completed his acquisition")
		}
	}
	if estEve < holds[0] || estCid != 2*estEve {
		t.Fatalf("estimates eve %v, cid %v; want eve one hold (%v) and cid twice that", estEve, estCid, holds[0])
	}
}
