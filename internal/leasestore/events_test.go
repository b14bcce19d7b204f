package leasestore_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// keyLog collects grants (as "id@key") and resets, safe for concurrent use.
type keyLog struct {
	mu     sync.Mutex
	keys   []string
	resets int
	c      chan struct{}
}

func newKeyLog() *keyLog { return &keyLog{c: make(chan struct{}, 64)} }

func (l *keyLog) granted(grants []leasestore.Grant) {
	l.mu.Lock()
	for _, g := range grants {
		l.keys = append(l.keys, g.ID+"@"+g.Key)
	}
	l.mu.Unlock()
	l.c <- struct{}{}
}

func (l *keyLog) reset() {
	l.mu.Lock()
	l.resets++
	l.mu.Unlock()
	l.c <- struct{}{}
}

func (l *keyLog) snapshot() ([]string, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := append([]string(nil), l.keys...)
	sort.Strings(out)
	return out, l.resets
}

// waitFor waits (bounded) until cond holds, re-checking after each report of l.
func (l *keyLog) waitFor(t *testing.T, what string, cond func(keys []string, resets int) bool) {
	t.Helper()
	timeout := time.After(20 * time.Second)
	for {
		if cond(l.snapshot()) {
			return
		}
		select {
		case <-l.c:
		case <-timeout:
			keys, resets := l.snapshot()
			t.Fatalf("%s: not within 20s; keys %v, resets %d", what, keys, resets)
		}
	}
}

// queueWaiter makes one acquisition that finds the level full wait in its line (WaitTTL)
// and returns its waiting holder's token.
func queueWaiter(t *testing.T, s *leasestore.Store, req leasestore.AcquireRequest) string {
	t.Helper()
	req.WaitTTL = time.Minute
	_, err := s.Acquire(context.Background(), req)
	var w *leasestore.WaitingError
	if !errors.As(err, &w) {
		t.Fatalf("acquire %s for %s: %v, want it to wait in line", req.Resource, req.User, err)
	}
	return w.Token
}

// TestGrantHookTellsTheWaitersOfThisStore: a slot handed to a waiter of this store (process)
// is reported to its hook with the waiter's public ID and the counter key; a release that
// finds no waiter reports nothing.
func TestGrantHookTellsTheWaitersOfThisStore(t *testing.T) {
	log := newKeyLog()
	s := newStore(t, leasestore.WithGrantHook(log.granted))
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	a := mustAcquire(t, s, request("gpu", "acme", "p", "ann", caps))
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	if keys, _ := log.snapshot(); len(keys) != 0 {
		t.Fatalf("a release without waiters reported grants %v", keys)
	}
	a = mustAcquire(t, s, request("gpu", "acme", "p", "ann", caps))
	w := queueWaiter(t, s, request("gpu", "acme", "p", "bob", caps))
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	got, _ := log.snapshot()
	want := []string{lease.HolderID(w) + "@" + key("gpu", lease.LevelGlobal, "acme", "p", "bob")}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("grants (-want +got):\n%s", diff)
	}
}

// runNotifier runs a notifier on s until the test ends.
func runNotifier(t *testing.T, s *leasestore.Store, log *keyLog) *leasestore.Notifier {
	t.Helper()
	n := leasestore.NewNotifier(s, log.granted, log.reset)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		waitfor.Closed(t, done, "the notifier stopping")
	})
	return n
}

// TestNotifierCarriesGrantsToOtherProcesses: two stores on one database stand for two
// processes. A slot that one hands to a waiter of the other reaches the other's notifier; a
// slot handed to its own waiter goes through its hook only, never through an event.
func TestNotifierCarriesGrantsToOtherProcesses(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	hookA := newKeyLog()
	a := newStoreAt(t, uri, db, leasestore.WithGrantEvents(), leasestore.WithGrantHook(hookA.granted))
	b := newStoreAt(t, uri, db, leasestore.WithGrantEvents())
	logA, logB := newKeyLog(), newKeyLog()
	na := runNotifier(t, a, logA)
	nb := runNotifier(t, b, logB)
	// A notifier that is following skips the events from before it started, so wait until
	// both follow before releasing.
	waitfor.Until(t, "both notifiers follow", func() bool { return na.Mode() != "" && nb.Mode() != "" })
	if m := nb.Mode(); m != leasestore.NotifyTail && m != leasestore.NotifyChangeStream {
		t.Fatalf("notifier mode %q, want tail or changeStream", m)
	}
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	h := mustAcquire(t, a, request("gpu", "acme", "p", "ann", caps))
	wb := queueWaiter(t, b, request("gpu", "acme", "p", "bob", caps))
	wa := queueWaiter(t, a, request("gpu", "acme", "p", "cid", caps))
	if _, err := a.Release(ctx, h.Token); err != nil { // to b's waiter, the oldest
		t.Fatal(err)
	}
	logB.waitFor(t, "b learns of the slot a handed to its waiter", func(keys []string, _ int) bool { return len(keys) >= 1 })
	if keys, _ := logB.snapshot(); !cmp.Equal(keys, []string{lease.HolderID(wb) + "@" + k}) {
		t.Errorf("b's notifier delivered %v", keys)
	}
	// b's waiter takes its slot and releases it: it goes to a's waiter, and a hears of it.
	got, err := b.Resume(ctx, withToken(request("gpu", "acme", "p", "bob", caps), wb), k, false)
	if err != nil || got.State != lease.StateHeld {
		t.Fatalf("b's waiter taking its slot: %+v, %v", got, err)
	}
	if _, err := b.Release(ctx, wb); err != nil {
		t.Fatal(err)
	}
	logA.waitFor(t, "a learns of the slot b handed to its waiter", func(keys []string, _ int) bool { return len(keys) >= 1 })
	if keys, _ := logA.snapshot(); !cmp.Equal(keys, []string{lease.HolderID(wa) + "@" + k}) {
		t.Errorf("a's notifier delivered %v", keys)
	}
	if keys, _ := hookA.snapshot(); len(keys) != 0 {
		t.Errorf("a's hook heard of grants made by b: %v", keys)
	}
}

func withToken(req leasestore.AcquireRequest, token string) leasestore.AcquireRequest {
	req.Token = token
	req.WaitTTL = time.Minute
	return req
}

// TestNotifierResetsAfterABreak: a notifier whose cursor breaks (here: the events collection
// is dropped under it) reconnects and asks every waiter to re-check once.
func TestNotifierResetsAfterABreak(t *testing.T) {
	s := newStore(t, leasestore.WithGrantEvents())
	log := newKeyLog()
	n := runNotifier(t, s, log)
	ready := time.After(20 * time.Second)
	for n.Mode() == "" {
		select {
		case <-ready:
			t.Fatal("notifier not connected within 20s")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if err := s.DropEvents(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	log.waitFor(t, "reset after the cursor broke", func(_ []string, resets int) bool { return resets >= 1 })
}

// refuseEvents is a fault hook for a server without capped collections: creating the events
// collection fails. It counts the tries.
func refuseEvents(tries *atomic.Int32) leasestore.FaultFunc {
	return func(step leasestore.Step, _ string) error {
		if step == leasestore.StepCreatingEvents {
			tries.Add(1)
			return errors.New("capped collections are not supported")
		}
		return nil
	}
}

// TestNotifierWithoutEventsWakesNobody: on a server where the events collection cannot be
// had, the notifier stays in poll mode and asks again less and less often, and it never
// wakes the waiters as if a slot were freed: they learn at their safety looks, by a read. A
// notifier that reset on every failed round made every waiter write once a second (issue 18,
// finding 5).
func TestNotifierWithoutEventsWakesNobody(t *testing.T) {
	var tries atomic.Int32
	s := newStore(t, leasestore.WithFault(refuseEvents(&tries)))
	log := newKeyLog()
	n := leasestore.NewNotifier(s, log.granted, log.reset)
	n.SetBackoff(time.Millisecond)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.Run(ctx)
	}()
	// Rounds of 1, 2, 4, ... ms: in 300 ms about eight of them.
	time.Sleep(300 * time.Millisecond) // real time: the notifier's own pauses run
	cancel()
	waitfor.Closed(t, done, "the notifier stopping")
	if got := n.Mode(); got != leasestore.NotifyPoll {
		t.Errorf("mode = %q, want %q", got, leasestore.NotifyPoll)
	}
	if _, resets := log.snapshot(); resets != 0 {
		t.Errorf("the notifier woke every waiter %d times without a slot freed; want never", resets)
	}
	// One store asks once per EventsRetry: the later rounds are refused without a command.
	if got := tries.Load(); got != 1 {
		t.Errorf("events collection created %d times in 300 ms, want once (then once per %v)", got, leasestore.EventsRetry)
	}
}

// TestPublisherWithoutEventsDoesNotRetryEveryRelease: hand-overs to waiters of other
// processes on such a server do not try to create the events collection at every release
// (issue 18, finding 5).
func TestPublisherWithoutEventsDoesNotRetryEveryRelease(t *testing.T) {
	var tries atomic.Int32
	s := newStore(t, leasestore.WithFault(refuseEvents(&tries)), leasestore.WithGrantEvents())
	for i := range 20 {
		s.Publish([]leasestore.Grant{{ID: fmt.Sprintf("w%d", i), Key: "r|global|*", To: "elsewhere"}}, []string{"elsewhere"})
		time.Sleep(5 * time.Millisecond) // real time: one publication per grant, as from separate releases
	}
	if err := s.Close(ctxT(t)); err != nil { // waits for the publisher
		t.Fatal(err)
	}
	if got := tries.Load(); got != 1 {
		t.Errorf("20 releases tried to create the events collection %d times, want once", got)
	}
}

// TestEveryGrantOfALargeBatchArrives: hundreds of grants with long counter keys, made while
// one insert is in flight, are split into events that each fit the capped collection, and
// every grant reaches the other process. One event with all of them outgrew the collection,
// its insert failed, and every waiter named in it waited for its safety look (issue 18,
// finding 8).
func TestEveryGrantOfALargeBatchArrives(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	a := newStoreAt(t, uri, db, leasestore.WithGrantEvents())
	b := newStoreAt(t, uri, db)
	log := newKeyLog()
	n := runNotifier(t, b, log)
	waitfor.Until(t, "the notifier following", func() bool { return n.Mode() == leasestore.NotifyTail || n.Mode() == leasestore.NotifyChangeStream })

	// Keys as long as scopes get: a user scope with a long user name.
	const grants = 300
	long := strings.Repeat("u", 240)
	batch := make([]leasestore.Grant, grants)
	origins := make([]string, grants)
	for i := range batch {
		batch[i] = leasestore.Grant{ID: fmt.Sprintf("w%03d", i), Key: fmt.Sprintf("r|user|acme/%s%03d", long, i), Held: true, To: b.Origin()}
		origins[i] = b.Origin()
	}
	a.Publish(batch, origins)
	log.waitFor(t, "every grant of the batch at the other process", func(keys []string, _ int) bool { return len(keys) == grants })

	// Every event fits the capped collection, as MongoDB requires (the development server
	// does not check it).
	sizes, err := a.EventSizes(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, size := range sizes {
		if size >= leasestore.EventsBytes {
			t.Errorf("an event of %d bytes, the events collection holds %d", size, leasestore.EventsBytes)
		}
	}
	if len(sizes) < grants/leasestore.EventMaxGrants {
		t.Errorf("%d grants in %d events, want at most %d per event", grants, len(sizes), leasestore.EventMaxGrants)
	}
	// The bound behind it: an event of the most grants it may carry, of this size, fits the
	// collection several times over.
	size, err := leasestore.EventSize(batch[:leasestore.EventMaxGrants])
	if err != nil {
		t.Fatal(err)
	}
	if size*4 > leasestore.EventsBytes {
		t.Errorf("an event of %d grants of this size is %d bytes; the collection holds %d", leasestore.EventMaxGrants, size, leasestore.EventsBytes)
	}
}
