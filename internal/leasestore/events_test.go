package leasestore_test

import (
	"context"
	"errors"
	"sort"
	"sync"
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
