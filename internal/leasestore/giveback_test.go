package leasestore_test

import (
	"sync/atomic"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// A release's one removal of its entries from several counters, kept at those that are lined
// (a waiter stands there), does not say which it kept; the lined flags read afterwards cannot
// tell either, since other processes change them in between. What the release does next must
// neither give a slot twice nor lose one: it reads which counters still have its entry (the
// entries, not the flags, say so). In these tests another process acts at the moment between
// the removal and what follows it (the fault step given-back).

// partialRelease returns a releaser whose release runs between at the fault step given-back
// (once), another process on the same database, and the caps used: a
// project capped at 1, the global level at 2.
func partialRelease(t *testing.T, between *func()) (releaser, other *leasestore.Store, uri, db string) {
	t.Helper()
	uri, db = newDatabase(t)
	var once atomic.Bool
	releaser = newStoreAt(t, uri, db, leasestore.WithFault(func(st leasestore.Step, _ string) error {
		if st == leasestore.StepGivenBack && *between != nil && once.CompareAndSwap(false, true) {
			(*between)()
		}
		return nil
	}))
	return releaser, newStoreAt(t, uri, db), uri, db
}

var partialCaps = []lease.LevelCap{{Level: lease.LevelProject, Cap: 1}, {Level: lease.LevelGlobal, Cap: 2}}

func partialReq(project, user string) leasestore.AcquireRequest {
	r := request("r", "acme", project, user, partialCaps)
	r.Pod = lease.PodRef{Namespace: "ns", Name: "pod-" + user, UID: "uid-" + user}
	return r
}

// TestPartialGiveBackLosesNoSlot: the kept key's line empties and another release clears its
// flag before the releaser reads it. Handing over by the flags read gave that slot back
// nowhere (the global counter stayed at 1 with no holder); the entry the removal kept is
// found and given back.
func TestPartialGiveBackLosesNoSlot(t *testing.T) {
	var between func()
	releaser, other, _, _ := partialRelease(t, &between)
	ctx := ctxT(t)
	ann := mustAcquire(t, other, partialReq("p", "ann"))
	bob := mustAcquire(t, other, partialReq("q", "bob"))
	cid := queueWaiter(t, other, partialReq("s", "cid")) // at the full global level: lined
	between = func() {
		if err := other.Withdraw(ctx, cid); err != nil {
			t.Error(err)
		}
		if _, err := other.Release(ctx, bob.Token); err != nil { // nobody waits now: the flag is cleared
			t.Error(err)
		}
	}
	if _, err := releaser.Release(ctx, ann.Token); err != nil { // its project entry removed, the global one kept
		t.Fatal(err)
	}
	for k, c := range counts(t, releaser) {
		if c != [2]int{0, 0} {
			t.Errorf("counter %s = %v (count, booked) once every holder left, want 0", k, c)
		}
	}
}

// TestPartialGiveBackGivesNoSlotTwice: the key's flag had been cleared while its line stood
// (as when a waiter's place lapses for a moment); its first waiter looks between the removal
// and the read, takes the slot the removal freed and marks the counter lined. Handing over by
// the flags read gave that slot a second time, to the next waiter: two holders of a project
// capped at 1. The releaser's entry is gone from that counter, so it hands nothing there.
func TestPartialGiveBackGivesNoSlotTwice(t *testing.T) {
	var between func()
	releaser, other, uri, db := partialRelease(t, &between)
	ctx := ctxT(t)
	pKey := key("r", lease.LevelProject, "acme", "p", "")
	ann := mustAcquire(t, other, partialReq("p", "ann"))
	mustAcquire(t, other, partialReq("q", "bob"))        // the global level is full
	queueWaiter(t, other, partialReq("s", "dan"))        // lines the global level
	eve := queueWaiter(t, other, partialReq("p", "eve")) // then two waiters at ann's project
	queueWaiter(t, other, partialReq("p", "fay"))
	if _, err := rawCounters(t, uri, db).UpdateOne(ctx, bson.D{{Key: "_id", Value: pKey}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "lined", Value: false}}}}); err != nil {
		t.Fatal(err)
	}
	between = func() {
		// eve's look takes the project slot at the counter, and waits at the global level.
		if _, err := resume(t, other, partialReq("p", "eve"), eve, "", true); !isWaiting(err) {
			t.Errorf("eve's look: %v, want her waiting at the global level with the project slot", err)
		}
	}
	if _, err := releaser.Release(ctx, ann.Token); err != nil { // its project entry removed, the global one kept
		t.Fatal(err)
	}
	if c := counts(t, releaser)[pKey]; c[0] > 1 || c[1] > 1 {
		t.Errorf("project counter %v (count, booked), cap 1: a slot given twice", c)
	}
	assertNoDrift(t, releaser)
}
