package leasestore_test

import (
	"context"
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

// keyLog collects freed keys and resets, safe for concurrent use.
type keyLog struct {
	mu     sync.Mutex
	keys   []string
	resets int
	c      chan struct{}
}

func newKeyLog() *keyLog { return &keyLog{c: make(chan struct{}, 64)} }

func (l *keyLog) freed(keys []string) {
	l.mu.Lock()
	l.keys = append(l.keys, keys...)
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

func TestFreedHookReportsEverySlotGivenBack(t *testing.T) {
	log := newKeyLog()
	s := newStore(t, leasestore.WithFreedHook(log.freed))
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelUser, Cap: 2}, {Level: lease.LevelGlobal, Cap: 3}}
	a := mustAcquire(t, s, request("gpu", "acme", "p", "ann", caps))
	req := request("gpu", "acme", "p", "bob", caps)
	req.Pod = lease.PodRef{Namespace: "ns", Name: "pod-b", UID: "uid-b"}
	mustAcquire(t, s, req)
	if keys, _ := log.snapshot(); len(keys) != 0 {
		t.Fatalf("acquisitions reported freed keys %v", keys)
	}
	if _, err := s.Release(ctx, a.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ReapPod(ctx, req.Pod); err != nil {
		t.Fatal(err)
	}
	want := []string{
		key("gpu", lease.LevelGlobal, "acme", "p", "ann"), key("gpu", lease.LevelGlobal, "acme", "p", "bob"),
		key("gpu", lease.LevelUser, "acme", "p", "ann"), key("gpu", lease.LevelUser, "acme", "p", "bob"),
	}
	sort.Strings(want)
	got, _ := log.snapshot()
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("freed keys (-want +got):\n%s", diff)
	}
}

// runNotifier runs a notifier on s until the test ends.
func runNotifier(t *testing.T, s *leasestore.Store, log *keyLog) *leasestore.Notifier {
	t.Helper()
	n := leasestore.NewNotifier(s, log.freed, log.reset)
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

// TestNotifierCarriesFreedSlotsToOtherProcesses: two stores on one database stand for two
// processes. A release in one reaches the other's notifier, not its own (its hook told it).
func TestNotifierCarriesFreedSlotsToOtherProcesses(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	a := newStoreAt(t, uri, db, leasestore.WithFreedEvents())
	b := newStoreAt(t, uri, db, leasestore.WithFreedEvents())
	logA, logB := newKeyLog(), newKeyLog()
	na := runNotifier(t, a, logA)
	nb := runNotifier(t, b, logB)
	// A notifier that is following skips the events from before it started, so wait until
	// both follow before releasing.
	ready := time.After(20 * time.Second)
	for na.Mode() == "" || nb.Mode() == "" {
		select {
		case <-ready:
			t.Fatal("notifiers not connected within 20s")
		case <-time.After(10 * time.Millisecond):
		}
	}
	if m := nb.Mode(); m != leasestore.NotifyTail && m != leasestore.NotifyChangeStream {
		t.Fatalf("notifier mode %q, want tail or changeStream", m)
	}
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 2}}
	ctx := ctxT(t)
	for range 3 {
		h := mustAcquire(t, a, request("gpu", "acme", "p", "ann", caps))
		if _, err := a.Release(ctx, h.Token); err != nil {
			t.Fatal(err)
		}
	}
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	logB.waitFor(t, "b learns of a's three freed slots", func(keys []string, _ int) bool { return len(keys) >= 3 })
	keys, _ := logB.snapshot()
	if diff := cmp.Diff([]string{k, k, k}, keys); diff != "" {
		t.Errorf("b's freed keys (-want +got):\n%s", diff)
	}
	// b's own release reaches a, and never b's notifier.
	h := mustAcquire(t, b, request("gpu", "acme", "p", "ann", caps))
	if _, err := b.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	logA.waitFor(t, "a learns of b's freed slot", func(keys []string, _ int) bool { return len(keys) == 1 })
	if keys, _ := logB.snapshot(); len(keys) != 3 {
		t.Errorf("b's notifier delivered its own event: %v", keys)
	}
}

// TestNotifierResetsAfterABreak: a notifier whose cursor breaks (here: the events collection
// is dropped under it) reconnects and asks every waiter to re-check once.
func TestNotifierResetsAfterABreak(t *testing.T) {
	s := newStore(t, leasestore.WithFreedEvents())
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
