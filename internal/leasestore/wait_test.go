package leasestore_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

var globalCap1 = []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}

func userReq(user string, caps []lease.LevelCap) leasestore.AcquireRequest {
	r := request("gpu", "acme", "p", user, caps)
	r.Pod = lease.PodRef{Namespace: "ns", Name: "pod-" + user, UID: "uid-" + user}
	return r
}

// resume goes on with the waiter of token after a wake-up (granted: the key it was told).
func resume(t *testing.T, s *leasestore.Store, req leasestore.AcquireRequest, token, granted string, look bool) (lease.Holder, error) {
	t.Helper()
	return s.Resume(context.Background(), withToken(req, token), granted, look)
}

func isWaiting(err error) bool {
	var w *leasestore.WaitingError
	return errors.As(err, &w)
}

// TestLineServesOldestFirst: a release hands its slot to the oldest waiter of the level
// (the count stays at the cap), a newcomer meanwhile finds the level full and queues behind
// the line, and a waiter that lapsed (no renewal within its WaitTTL) is passed over.
func TestLineServesOldestFirst(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	a := mustAcquire(t, s, userReq("ann", globalCap1))
	// More lapsed places ahead than a look ever read before (issue 18, finding 8).
	for i := range 10 {
		lapsed := userReq(fmt.Sprintf("old%d", i), globalCap1)
		lapsed.WaitTTL = time.Millisecond // lapses at once: as if its process had died
		if _, err := s.Acquire(ctx, lapsed); !isWaiting(err) {
			t.Fatalf("lapsing waiter: %v", err)
		}
	}
	w1 := queueWaiter(t, s, userReq("bob", globalCap1))
	w2 := queueWaiter(t, s, userReq("cid", globalCap1))
	if _, err := s.Acquire(ctx, userReq("dan", globalCap1)); !errors.Is(err, lease.ErrBusy) || isWaiting(err) {
		t.Fatalf("a newcomer that may not wait: %v, want busy", err)
	}
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	if c := counts(t, s)[k]; c != [2]int{1, 1} { // bob books the slot handed to him
		t.Fatalf("after the release: count/booked %v, want the slot kept and handed over", c)
	}
	if _, err := resume(t, s, userReq("cid", globalCap1), w2, "", true); !isWaiting(err) {
		t.Fatalf("cid, second in line, looked and got %v; want it still waiting", err)
	}
	h, err := resume(t, s, userReq("bob", globalCap1), w1, k, false)
	if err != nil || h.State != lease.StateHeld {
		t.Fatalf("bob taking the slot handed to him: %+v, %v", h, err)
	}
	if _, err := s.Release(ctx, w1); err != nil {
		t.Fatal(err)
	}
	if h, err := resume(t, s, userReq("cid", globalCap1), w2, k, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("cid next: %+v, %v", h, err)
	}
	assertNoDrift(t, s)
}

// TestWaiterHandedASlotThatLeavesPassesItOn: a waiter whose acquisition a hand-over
// completed, and which leaves before it answers (its caller gone, its deadline come), passes
// the slot to the next waiter of the line; the hand-over is not lost with it (issue 18,
// finding 7).
func TestWaiterHandedASlotThatLeavesPassesItOn(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	a := mustAcquire(t, s, userReq("ann", globalCap1))
	w1 := queueWaiter(t, s, userReq("bob", globalCap1))
	w2 := queueWaiter(t, s, userReq("cid", globalCap1))
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Withdraw(ctx, w1); err != nil { // bob leaves with the slot handed to him
		t.Fatal(err)
	}
	if c := counts(t, s)[k]; c != [2]int{1, 1} {
		t.Fatalf("after bob left: count/booked %v, want the slot kept for cid", c)
	}
	if h, err := resume(t, s, userReq("cid", globalCap1), w2, k, false); err != nil || h.State != lease.StateHeld {
		t.Fatalf("cid, next in line: %+v, %v", h, err)
	}
	if _, err := s.Release(ctx, w2); err != nil {
		t.Fatal(err)
	}
	if c := counts(t, s)[k]; c != [2]int{0, 0} {
		t.Fatalf("after the last release: count/booked %v, want the slot back at the counter", c)
	}
	assertNoDrift(t, s)
}

// TestWaiterKeepsNarrowLevelsAndPassesThemOn: a waiter blocked at the global level keeps the
// user slot it booked; when it withdraws, that slot goes to the waiter of the user level.
func TestWaiterKeepsNarrowLevelsAndPassesThemOn(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelUser, Cap: 1}, {Level: lease.LevelGlobal, Cap: 1}}
	ku := key("gpu", lease.LevelUser, "acme", "p", "bob")
	mustAcquire(t, s, userReq("ann", caps))
	w1 := queueWaiter(t, s, userReq("bob", caps)) // books bob's user slot, waits at global
	w2 := queueWaiter(t, s, userReq("bob", caps)) // waits at bob's user level
	if c := counts(t, s)[ku]; c != [2]int{1, 1} {
		t.Fatalf("bob's user level: %v, want the first waiter booking it", c)
	}
	if err := s.Withdraw(ctx, w1); err != nil {
		t.Fatal(err)
	}
	// The user slot went to w2, which now books it and goes on to wait at global.
	if _, err := resume(t, s, userReq("bob", caps), w2, ku, false); !isWaiting(err) {
		t.Fatalf("w2 after the hand-over: %v, want waiting at the global level", err)
	}
	var busy *lease.BusyError
	_, err := resume(t, s, userReq("bob", caps), w2, "", false)
	if !errors.As(err, &busy) || busy.Level != lease.LevelGlobal {
		t.Fatalf("w2 waits at %v, want global", err)
	}
	assertNoDrift(t, s)
}

// TestQueueingTakesASlotFreedJustBefore: a slot freed between a waiter's failed increment and
// its entering the line went to no waiter; the waiter's second try right after queueing
// takes it (here the slot is given back at the fault step right after the state write).
func TestQueueingTakesASlotFreedJustBefore(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	clean := newStoreAt(t, uri, db)
	var holder string
	faulty := newStoreAt(t, uri, db, leasestore.WithFault(func(step leasestore.Step, _ string) error {
		if step == leasestore.StepQueued && holder != "" {
			// The release of another process, whose hand-over ran before this waiter queued:
			// its counter was decremented.
			coll := rawCounters(t, uri, db)
			if _, err := coll.UpdateOne(context.Background(), bson.D{{Key: "_id", Value: key("gpu", lease.LevelGlobal, "acme", "p", "ann")}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}}); err != nil {
				t.Error(err)
			}
			if _, err := rawHolders(t, uri, db).DeleteOne(context.Background(), bson.D{{Key: "_id", Value: holder}}); err != nil {
				t.Error(err)
			}
			holder = ""
		}
		return nil
	}))
	holder = mustAcquire(t, clean, userReq("ann", globalCap1)).Token
	req := userReq("bob", globalCap1)
	req.WaitTTL = time.Minute
	h, err := faulty.Acquire(ctxT(t), req)
	if err != nil || h.State != lease.StateHeld {
		t.Fatalf("the waiter's second try: %+v, %v; want the slot freed before it queued", h, err)
	}
	assertNoDrift(t, clean)
}

func rawCounters(t *testing.T, uri, db string) *mongo.Collection {
	return rawClient(t, uri).Database(db).Collection(leasestore.CountersCollection)
}

func rawHolders(t *testing.T, uri, db string) *mongo.Collection {
	return rawClient(t, uri).Database(db).Collection(leasestore.HoldersCollection)
}

func rawClient(t *testing.T, uri string) *mongo.Client {
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// TestEveryCrashWindowRecoversWithinTheBound: for every step of an acquisition, a wait, a
// claim, a hand-over and a release, a process that dies there (the fault hook stops the
// operation dead, and the process issues nothing more) leaves the level serving its full cap
// again within max(TTL, operation timeout) + 2 s, through what callers do anyway (the lazy
// sweep of idle holders, and Repair on a refusal), without reconcile and never above the
// cap, while another caller keeps acquiring and releasing a slot of that level all along.
// The dead process's operation timeout is 1 s (a release it leaves half done expires then);
// the surviving process's is the default.
func TestEveryCrashWindowRecoversWithinTheBound(t *testing.T) {
	const ttl = 2 * time.Second
	steps := []leasestore.Step{
		leasestore.StepHolderCreated, leasestore.StepBooked, leasestore.StepLevelPushed,
		leasestore.StepQueued, leasestore.StepCreatedInLine, leasestore.StepClaimBooked, leasestore.StepPicked,
		leasestore.StepHandedOver, leasestore.StepHolderReleased, leasestore.StepGivenBack,
	}
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 2}}
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	for _, step := range steps {
		t.Run(string(step), func(t *testing.T) {
			uri, err := mongotest.URI()
			if err != nil {
				t.Fatal(err)
			}
			db := mongotest.DatabaseName(t)
			healer := newStoreAt(t, uri, db)
			crashed := false
			faulty := newStoreAt(t, uri, db, leasestore.WithOpTimeout(time.Second), leasestore.WithFault(func(st leasestore.Step, _ string) error {
				if st == step && !crashed {
					crashed = true
					return leasestore.ErrCrash
				}
				return nil
			}))
			ctx := ctxT(t)
			req := func(user string) leasestore.AcquireRequest {
				r := userReq(user, caps)
				r.TTL = ttl
				return r
			}
			waiter := func(user string) leasestore.AcquireRequest {
				r := req(user)
				r.WaitTTL = 500 * time.Millisecond // its process renews it, until it dies
				return r
			}
			ann := mustAcquire(t, healer, req("ann"))
			var bob, cid string
			scenario := []func(){
				func() { h, _ := faulty.Acquire(ctx, req("bob")); bob = h.Token },
				func() { cid = tokenOf(faulty.Acquire(ctx, waiter("cid"))) },
				func() { _, _ = faulty.Acquire(ctx, waiter("dan")) }, // behind cid: created in line
				func() { // another process's release that found no waiter: room nobody is handed
					if _, err := rawCounters(t, uri, db).UpdateOne(ctx, bson.D{{Key: "_id", Value: k}},
						bson.D{{Key: "$unset", Value: bson.D{{Key: "slots." + ann.ID, Value: ""}}}, {Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}}); err != nil {
						t.Fatal(err)
					}
					if _, err := rawHolders(t, uri, db).DeleteOne(ctx, bson.D{{Key: "_id", Value: ann.Token}}); err != nil {
						t.Fatal(err)
					}
				},
				func() { _, _ = faulty.Resume(ctx, withWait(waiter("cid"), cid), "", true) }, // cid claims
				func() { _, _ = faulty.Release(ctx, bob) },                                   // to dan
				func() { _, _ = faulty.Release(ctx, cid) },                                   // a release of this process's own lease: no mark
				func() { // a release of another process's lease: marked released first
					if h, err := healer.Acquire(ctx, req("gil")); err == nil {
						_, _ = faulty.Release(ctx, h.Token)
					}
				},
			}
			for _, op := range scenario {
				if crashed {
					break
				}
				op()
			}
			if !crashed {
				t.Fatalf("the scenario never reached %s", step)
			}
			// The surviving process lets go of its holder: what remains booked is the dead
			// process's alone.
			if _, err := healer.Release(ctx, ann.Token); err != nil {
				t.Fatal(err)
			}
			recover := func(user string) leasestore.AcquireRequest {
				r := userReq(user, caps)
				r.TTL = time.Hour
				return r
			}
			// A refusal asks for the sweep of the resource and the repair of the level, as
			// the service does (at most every 100 ms here).
			var tendMu sync.Mutex
			var lastTend time.Time
			tend := func() {
				tendMu.Lock()
				due := time.Since(lastTend) >= 100*time.Millisecond
				if due {
					lastTend = time.Now()
				}
				tendMu.Unlock()
				if !due {
					return
				}
				if _, err := healer.SweepIdle(ctx, "gpu"); err != nil {
					t.Error(err)
				}
				if _, err := healer.Repair(ctx, k); err != nil {
					t.Error(err)
				}
			}
			// The churn: another caller takes a slot and gives it back, over and over.
			churnCtx, stopChurn := context.WithCancel(ctx)
			churned := make(chan int)
			go func() {
				n := 0
				defer func() { churned <- n }()
				for churnCtx.Err() == nil {
					h, err := healer.Acquire(ctx, recover("churn"))
					if err != nil {
						tend()
						time.Sleep(5 * time.Millisecond) // real time: a caller's pace between refused tries
						continue
					}
					n++
					if _, err := healer.Release(ctx, h.Token); err != nil {
						t.Error(err)
						return
					}
				}
			}()
			// Recovery: two acquisitions must be held at once (the cap) and a third be
			// refused, within the TTL and a margin, with only what callers trigger.
			start := time.Now()
			got := 0
			bound := max(ttl, time.Second) + 2*time.Second
			for time.Since(start) < bound && got < 2 {
				if _, err := healer.Acquire(ctx, recover("new")); err == nil {
					got++
					continue
				}
				tend()
				time.Sleep(20 * time.Millisecond) // real time: recovery is measured against the real TTL
			}
			took := time.Since(start)
			stopChurn()
			n := <-churned
			if got < 2 {
				t.Fatalf("after a crash at %s the level served %d of 2 within %v (the churn took %d slots meanwhile); counters %v",
					step, got, bound, n, counts(t, healer))
			}
			if _, err := healer.Acquire(ctx, recover("more")); !errors.Is(err, lease.ErrBusy) {
				t.Fatalf("a third acquisition: %v, want busy (cap 2); counters %v", err, counts(t, healer))
			}
			t.Logf("crash at %s: full cap served again after %v, %d churned slots meanwhile", step, took.Round(time.Millisecond), n)
		})
	}
}

func tokenOf(_ lease.Holder, err error) string {
	var w *leasestore.WaitingError
	if errors.As(err, &w) {
		return w.Token
	}
	return ""
}

func withWait(req leasestore.AcquireRequest, token string) leasestore.AcquireRequest {
	req.Token = token
	return req
}

// TestRepairRemovesOnlyEntriesOfGoneHolders: Repair removes the entries whose holder document
// is gone (a booking that arrived after its holder's release) and nothing else: not the
// entries of held holders, not the entry of a holder being released (its give-back is on the
// way), not the entry of a holder that has just been written.
func TestRepairRemovesOnlyEntriesOfGoneHolders(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	s := newStoreAt(t, uri, db)
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 5}}
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	ann := mustAcquire(t, s, userReq("ann", caps))
	mustAcquire(t, s, userReq("bob", caps))
	const gone = "lh-00000000000000000000dead"
	if err := storetest.LateEntry(ctx, uri, db, k, gone); err != nil {
		t.Fatal(err)
	}
	if c := counts(t, s)[k]; c[0] != 3 || c[1] != 2 {
		t.Fatalf("with a late entry: count %d, booked %d; want 3 and 2", c[0], c[1])
	}
	// ann is being released: her entry stays until her give-back.
	if _, err := rawHolders(t, uri, db).UpdateOne(ctx, bson.D{{Key: "_id", Value: ann.Token}}, bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: "RELEASED"}}}}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Repair(ctx, k)
	if err != nil || n != 1 {
		t.Fatalf("Repair removed %d (%v), want 1", n, err)
	}
	cs, err := s.ListCounters(ctx, leasestore.CounterFilter{Resource: "gpu"})
	if err != nil || len(cs) != 1 {
		t.Fatalf("counters %+v, %v", cs, err)
	}
	if c := cs[0]; c.Count != 2 || len(c.Holders) != 2 || slices.Contains(c.Holders, gone) || len(c.Gone) != 0 {
		t.Errorf("after Repair: %+v, want ann's and bob's entries only", c)
	}
	if n, err := s.Repair(ctx, k); err != nil || n != 0 {
		t.Errorf("a second Repair removed %d (%v), want 0", n, err)
	}
}

// TestClaimMeetingAHandOverBooksOneSlot: a waiter that takes room at the level itself while a
// release hands it a slot of the same level ends with one entry there, and the releaser's
// slot is free again: the hand-over's move is conditional on the waiter having no entry, so
// it finds none to move to and removes the releaser's entry instead (the first finding of
// issue 41, where this admitted a third holder on a cap-2 level).
func TestClaimMeetingAHandOverBooksOneSlot(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	other := newStoreAt(t, uri, db)
	var ann lease.Holder
	var once sync.Once
	waiter := newStoreAt(t, uri, db, leasestore.WithFault(func(st leasestore.Step, _ string) error {
		if st == leasestore.StepClaimBooked {
			once.Do(func() {
				if _, err := other.Release(context.Background(), ann.Token); err != nil {
					t.Error(err)
				}
			})
		}
		return nil
	}))
	one := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	two := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 2}}
	ann = mustAcquire(t, other, userReq("ann", one))
	w := queueWaiter(t, waiter, userReq("bob", one))
	kg := key("gpu", lease.LevelGlobal, "acme", "p", "bob")
	// The cap is raised: bob's look finds room and books; ann's release, in between, names
	// bob for her slot.
	if _, err := resume(t, waiter, userReq("bob", two), w, "", true); err != nil && !isWaiting(err) {
		t.Fatalf("bob's look: %v", err)
	}
	got, err := resume(t, waiter, userReq("bob", two), w, "", true)
	if err != nil || got.State != lease.StateHeld {
		t.Fatalf("bob after his look: %+v, %v", got, err)
	}
	if c := counts(t, other)[kg]; c[0] != 1 || c[1] != 1 {
		t.Errorf("count %d, booked %d; want bob's one entry", c[0], c[1])
	}
	mustAcquire(t, other, userReq("cid", two))
	if _, err := other.Acquire(ctxT(t), userReq("dan", two)); !errors.Is(err, lease.ErrBusy) {
		t.Errorf("a third holder on a cap-2 level: %v, want busy", err)
	}
	assertNoDrift(t, other)
}

// TestRefusalLeavesNothingAndNeedsNoMark: an attempt refused at its first level booked
// nothing, so its holder goes in one delete, without a release mark (and without the mark's
// later delete); nothing of it is left.
func TestRefusalLeavesNothingAndNeedsNoMark(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	var mu sync.Mutex
	var cmds []string
	var counting atomic.Bool
	record := func(c string) {
		if counting.Load() {
			mu.Lock()
			cmds = append(cmds, c)
			mu.Unlock()
		}
	}
	s := newStoreAt(t, uri, db, leasestore.WithCommandObserver(record), leasestore.WithOffPathObserver(record))
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	held := mustAcquire(t, s, userReq("ann", caps))
	counting.Store(true)
	_, err = s.Acquire(ctxT(t), userReq("bob", caps))
	if !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("a second acquisition at cap 1 = %v, want busy", err)
	}
	time.Sleep(200 * time.Millisecond) // real time: an off-path delete, if any, would come now
	counting.Store(false)
	mu.Lock()
	got := slices.Clone(cmds)
	mu.Unlock()
	if n := slices.Index(got, "findAndModify"); n >= 0 || slices.Index(got, "delete") < 0 || len(got) > 4 {
		t.Errorf("a refusal sent %v, want the holder's insert, the refused increment (and its read) and one delete, no release mark", got)
	}
	n, err := rawHolders(t, uri, db).CountDocuments(ctxT(t), bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("%d holder documents after a refusal, want only the held one (%s)", n, held.Token)
	}
	assertNoDrift(t, s)
}

// TestReleaseCostsTwoWritesUnlessSomeoneWaits: a release nobody waits for costs two writes.
// Of a lease this store answered held: one removal of its entries from every level, then the
// holder's delete. Of a lease another process answered: the holder is marked released, its
// entries removed in one write, and its delete follows off the caller's path. A process
// without the hint still hands a lined level's slot to its waiter.
func TestReleaseCostsTwoWritesUnlessSomeoneWaits(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	var cmds, offPath atomic.Int64
	var counting atomic.Bool
	releaser := newStoreAt(t, uri, db, leasestore.WithCommandObserver(func(string) {
		if counting.Load() {
			cmds.Add(1)
		}
	}), leasestore.WithOffPathObserver(func(string) { offPath.Add(1) }))
	waiter := newStoreAt(t, uri, db)
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelUser, Cap: 1}, {Level: lease.LevelGlobal, Cap: 1}}
	holders := rawHolders(t, uri, db)
	for _, by := range []*leasestore.Store{releaser, waiter} {
		h := mustAcquire(t, by, userReq("ann", caps))
		cmds.Store(0)
		counting.Store(true)
		if _, err := releaser.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
		counting.Store(false)
		if n := cmds.Load(); n != 2 {
			t.Errorf("a release nobody waits for (acquired by this process: %v) sent %d commands, want 2", by == releaser, n)
		}
		waitfor.Until(t, "the released holder deleted", func() bool {
			n, err := holders.CountDocuments(ctx, bson.D{{Key: "_id", Value: h.Token}})
			return err == nil && n == 0
		})
		assertNoDrift(t, releaser)
	}
	if offPath.Load() == 0 {
		t.Error("the release of another process's lease deleted its holder on the caller's path")
	}

	h := mustAcquire(t, releaser, userReq("ann", caps))
	w := queueWaiter(t, waiter, userReq("bob", caps)) // books bob's user level, waits at global
	if _, err := releaser.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	kg := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	if got, err := resume(t, waiter, userReq("bob", caps), w, kg, false); err != nil || got.State != lease.StateHeld {
		t.Fatalf("the waiter after a release by a process without the hint: %+v, %v", got, err)
	}
	assertNoDrift(t, releaser)
}

// TestReleasesShareTheHolderDelete: holders released one after the other within a moment are
// deleted off the callers' path by one command, not one each (marks.go, markGather).
func TestReleasesShareTheHolderDelete(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	var deletes atomic.Int64
	s := newStoreAt(t, uri, db, leasestore.WithOffPathObserver(func(cmd string) {
		if cmd == "delete" {
			deletes.Add(1)
		}
	}))
	ctx := ctxT(t)
	const n = 8
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: n}}
	var tokens []string
	for i := range n {
		tokens = append(tokens, mustAcquire(t, s, userReq(fmt.Sprintf("u%d", i), caps)).Token)
	}
	for _, tok := range tokens { // one after the other, as one caller would
		if _, err := s.Release(ctx, tok); err != nil {
			t.Fatal(err)
		}
	}
	holders := rawHolders(t, uri, db)
	waitfor.Until(t, "the released holders deleted", func() bool {
		c, err := holders.CountDocuments(ctx, bson.D{})
		return err == nil && c == 0
	})
	if d := deletes.Load(); d*2 > n {
		t.Errorf("%d holders released one after the other were deleted by %d commands, want at most %d", n, d, n/2)
	}
}

// TestLeavingALineCostsTwoCommands: a waiter that leaves its line with nothing handed to it
// (its deadline) costs its mark and one read of where it has entries (none), then the delete
// off the path; one that booked a narrower level first gives that entry back as well. The
// slots are where they were.
func TestLeavingALineCostsTwoCommands(t *testing.T) {
	s, cmds, counting := countingStore(t)
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelUser, Cap: 1}, {Level: lease.LevelGlobal, Cap: 1}}
	mustAcquire(t, s, userReq("ann", globalCap1))
	w := queueWaiter(t, s, userReq("bob", globalCap1))
	counting.Store(true)
	if err := s.Withdraw(ctx, w); err != nil {
		t.Fatal(err)
	}
	counting.Store(false)
	if n := cmds.Load(); n != 2 {
		t.Errorf("leaving a line with nothing booked took %d round trips, want 2 (mark, read)", n)
	}
	assertNoDrift(t, s)

	// Booked at bob's user level, waiting at the global one (taken by ann's lease with
	// caps of its own).
	s2, cmds2, counting2 := countingStore(t)
	mustAcquire(t, s2, userReq("ann", caps))
	w = queueWaiter(t, s2, userReq("bob", caps))
	counting2.Store(true)
	if err := s2.Withdraw(ctx, w); err != nil {
		t.Fatal(err)
	}
	counting2.Store(false)
	if n := cmds2.Load(); n != 3 {
		t.Errorf("leaving a line with a narrower level booked took %d round trips, want 3 (mark, read, removal)", n)
	}
	if _, err := s2.Acquire(ctx, userReq("bob", []lease.LevelCap{{Level: lease.LevelUser, Cap: 1}})); err != nil {
		t.Errorf("bob's user level after he left the line: %v", err)
	}
	assertNoDrift(t, s2)
}

// TestNewcomerJoinsALineInTwoWrites: while this store sees a line at the level, a newcomer
// that may wait is written into it at once and tries the level once: two writes, where a
// refused increment and the write that queues would make four. It queues behind the line
// and is served in its turn; and when the line has emptied and the level has room after
// all, the try takes the slot.
func TestNewcomerJoinsALineInTwoWrites(t *testing.T) {
	s, cmds, counting := countingStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	a := mustAcquire(t, s, userReq("ann", globalCap1))
	w1 := queueWaiter(t, s, userReq("bob", globalCap1)) // the store sees the line
	counting.Store(true)
	w2 := queueWaiter(t, s, userReq("cid", globalCap1))
	counting.Store(false)
	if n := cmds.Load(); n != 2 {
		t.Errorf("a newcomer behind a line took %d round trips, want 2", n)
	}
	line, err := s.Line(ctx, k)
	if err != nil {
		t.Fatal(err)
	}
	if len(line) != 2 || line[0].ID != lease.HolderID(w1) || line[1].ID != lease.HolderID(w2) {
		t.Fatalf("line %+v, want bob then cid", line)
	}
	for _, next := range []struct {
		user, token string
	}{{"bob", w1}, {"cid", w2}} {
		if _, err := s.Release(ctx, a.Token); err != nil {
			t.Fatal(err)
		}
		h, err := resume(t, s, userReq(next.user, globalCap1), next.token, k, false)
		if err != nil || h.State != lease.StateHeld {
			t.Fatalf("%s after the release: %+v, %v", next.user, h, err)
		}
		a = h
	}
	// The line is empty and the level has room: a newcomer (the hint still fresh) queues,
	// and its one try takes the slot.
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	r := userReq("dan", globalCap1)
	r.WaitTTL = time.Minute
	h, err := s.Acquire(ctx, r)
	if err != nil || h.State != lease.StateHeld {
		t.Fatalf("a newcomer at a level with room and an empty line: %+v, %v", h, err)
	}
	assertNoDrift(t, s)
}

// TestNewcomerAfterAHandOverJoinsInOneWrite: right after this store handed a slot of a level
// over, the level is full with a line, and a newcomer's try would be refused: the newcomer's
// holder is written into the line and nothing more (its first look tries the level). It is
// served in its turn all the same.
func TestNewcomerAfterAHandOverJoinsInOneWrite(t *testing.T) {
	s, cmds, counting := countingStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	a := mustAcquire(t, s, userReq("ann", globalCap1))
	w1 := queueWaiter(t, s, userReq("bob", globalCap1))
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	b, err := resume(t, s, userReq("bob", globalCap1), w1, k, false)
	if err != nil || b.State != lease.StateHeld {
		t.Fatalf("bob after the hand-over: %+v, %v", b, err)
	}
	counting.Store(true)
	w2 := queueWaiter(t, s, userReq("cid", globalCap1))
	counting.Store(false)
	if n := cmds.Load(); n != 1 {
		t.Errorf("a newcomer right after a hand-over took %d round trips, want 1 (its holder, in line)", n)
	}
	if _, err := s.Release(ctx, b.Token); err != nil {
		t.Fatal(err)
	}
	c, err := resume(t, s, userReq("cid", globalCap1), w2, k, false)
	if err != nil || c.State != lease.StateHeld {
		t.Fatalf("cid after the release: %+v, %v", c, err)
	}
	assertNoDrift(t, s)
}

// TestCountersShowTheLine: the counters' view counts the live waiters in each counter's line
// (what holds the count at its cap); a lapsed place is not counted, and a waiter handed its
// slot leaves the line.
func TestCountersShowTheLine(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	waiting := func() int {
		t.Helper()
		cs, err := s.ListCounters(ctx, leasestore.CounterFilter{Resource: "gpu"})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range cs {
			if c.Key == k {
				return c.Waiting
			}
		}
		t.Fatalf("no counter %s in %+v", k, cs)
		return 0
	}
	a := mustAcquire(t, s, userReq("ann", globalCap1))
	if n := waiting(); n != 0 {
		t.Fatalf("nobody waits yet, the view says %d", n)
	}
	lapsed := userReq("old", globalCap1)
	lapsed.WaitTTL = time.Millisecond
	if _, err := s.Acquire(ctx, lapsed); !isWaiting(err) {
		t.Fatalf("lapsing waiter: %v", err)
	}
	w := queueWaiter(t, s, userReq("bob", globalCap1))
	queueWaiter(t, s, userReq("cid", globalCap1))
	if n := waiting(); n != 2 {
		t.Errorf("two live waiters and a lapsed one: the view says %d waiting, want 2", n)
	}
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := resume(t, s, userReq("bob", globalCap1), w, k, false); err != nil {
		t.Fatal(err)
	}
	if n := waiting(); n != 1 {
		t.Errorf("after bob was handed the slot: %d waiting, want 1", n)
	}
}

// countingStore is a store that counts the commands it sends while counting is true.
func countingStore(t *testing.T) (s *leasestore.Store, cmds *atomic.Int64, counting *atomic.Bool) {
	cmds, counting = new(atomic.Int64), new(atomic.Bool)
	s = newStore(t, leasestore.WithCommandObserver(func(string) {
		if counting.Load() {
			cmds.Add(1)
		}
	}))
	return s, cmds, counting
}
