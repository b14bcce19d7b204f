package livefeed

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

func holder(id string, fence int64) lease.Holder {
	return lease.Holder{ID: id, Tenant: "acme", Resource: "tex", State: lease.StateHeld, Fence: fence}
}

func TestDiff(t *testing.T) {
	t0 := time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC)
	waiter := func(lastSeen time.Time, pos int) lease.Waiter {
		h := holder("h-w", 0)
		h.State, h.LastSeenAt = lease.StateWaiting, lastSeen
		return lease.Waiter{Holder: h, Key: "k", Position: pos}
	}
	counter := lease.Counter{Key: "tex/global", Count: 1}
	cases := map[string]struct {
		prev, next State
		want       []string
	}{
		"a grant, a release and a check, in the order of the IDs": {
			prev: NewState([]lease.Holder{holder("h-b", 1), holder("h-c", 2)}, nil, nil),
			next: NewState([]lease.Holder{holder("h-a", 3), func() lease.Holder { h := holder("h-c", 2); h.LastSeenAt = t0; return h }()}, nil, nil),
			want: []string{"Added holder h-a", "Deleted holder h-b", "Modified holder h-c"},
		},
		"nothing changed": {
			prev: NewState([]lease.Holder{holder("h-a", 1)}, []lease.Waiter{waiter(t0, 0)}, []lease.Counter{counter}),
			next: NewState([]lease.Holder{holder("h-a", 1)}, []lease.Waiter{waiter(t0, 0)}, []lease.Counter{counter}),
		},
		"a waiter renewing its place shows no change; moving up does": {
			prev: NewState(nil, []lease.Waiter{waiter(t0, 1)}, nil),
			next: NewState(nil, []lease.Waiter{waiter(t0.Add(time.Second), 1)}, nil),
		},
		"a waiter moving up": {
			prev: NewState(nil, []lease.Waiter{waiter(t0, 1)}, nil),
			next: NewState(nil, []lease.Waiter{waiter(t0, 0)}, nil),
			want: []string{"Modified waiter h-w"},
		},
		"a waiter granted: it leaves the line and holds; holders, waiters, counters in that order": {
			prev: NewState(nil, []lease.Waiter{waiter(t0, 0)}, []lease.Counter{counter}),
			next: NewState([]lease.Holder{holder("h-w", 4)}, nil, []lease.Counter{{Key: "tex/global", Count: 2}}),
			want: []string{"Added holder h-w", "Deleted waiter h-w", "Modified counter tex/global"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []string
			for _, c := range Diff(tc.prev, tc.next) {
				got = append(got, describe(c))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Diff (-want +got):\n%s", diff)
			}
		})
	}
}

func describe(c Change) string {
	return [...]string{"Added", "Modified", "Deleted"}[c.Type] + " " + [...]string{"holder", "waiter", "counter"}[c.Kind] + " " + c.Key
}

// fakeSource serves the holders it is given.
type fakeSource struct {
	mu      sync.Mutex
	holders []lease.Holder
	err     error
	// read, when set, runs as the holders are read.
	read func()
}

func (s *fakeSource) set(hs ...lease.Holder) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.holders = hs
}

func (s *fakeSource) EachHolder(_ context.Context, f func(lease.Holder) error) error {
	if s.read != nil {
		s.read()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return s.err
	}
	for _, h := range s.holders {
		if err := f(h); err != nil {
			return err
		}
	}
	return nil
}
func (s *fakeSource) ListWaiters(context.Context, leasestore.HolderFilter) ([]lease.Waiter, error) {
	return nil, nil
}
func (s *fakeSource) ListCounters(context.Context, leasestore.CounterFilter) ([]lease.Counter, error) {
	return nil, nil
}

// world is a feed over a fake source with a fake clock, read by hand (round).
type world struct {
	t     *testing.T
	src   *fakeSource
	clock *clocktesting.FakeClock
	feed  *Feed
}

func newWorld(t *testing.T, opts Options) *world {
	w := &world{t: t, src: &fakeSource{}, clock: clocktesting.NewFakeClock(time.Date(2026, 12, 7, 10, 0, 0, 0, time.UTC))}
	opts.Clock = w.clock
	w.feed = New(w.src, opts)
	return w
}

// read sets the store's holders and lets the feed read them, a second later than before.
func (w *world) read(hs ...lease.Holder) {
	w.t.Helper()
	w.clock.Step(time.Second)
	w.src.set(hs...)
	if err := w.feed.round(context.Background()); err != nil {
		w.t.Fatal(err)
	}
}

func (w *world) watch(from string) *Subscription {
	w.t.Helper()
	s, err := w.feed.Watch(context.Background(), from)
	if err != nil {
		w.t.Fatalf("Watch(%q): %v", from, err)
	}
	return s
}

// received describes what s has: its initial events, then those waiting in C.
func received(s *Subscription) []string {
	var out []string
	for _, e := range s.Initial {
		out = append(out, describe(e.Change))
	}
	for {
		select {
		case e, ok := <-s.C:
			if !ok {
				return append(out, "closed")
			}
			out = append(out, describe(e.Change))
		default:
			return out
		}
	}
}

func TestAWatchFromAListsVersionMissesNothingAfterIt(t *testing.T) {
	w := newWorld(t, Options{})
	w.read(holder("h-a", 1))
	listed := w.feed.RV() // what a list read from the store now would carry
	w.read(holder("h-a", 1), holder("h-b", 2))
	w.read(holder("h-b", 2))
	after := w.watch(listed)
	current := w.watch("")
	w.read(holder("h-b", 2), holder("h-c", 3))

	if diff := cmp.Diff([]string{"Added holder h-b", "Deleted holder h-a", "Added holder h-c"}, received(after)); diff != "" {
		t.Errorf("watch from the list's version (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]string{"Added holder h-b", "Added holder h-c"}, received(current)); diff != "" {
		t.Errorf("watch without a version: the state, then what follows (-want +got):\n%s", diff)
	}
	if after.From != current.From || strconv.FormatInt(current.From, 10) == listed {
		t.Errorf("From = %d and %d, want both the latest version (not the list's %s)", after.From, current.From, listed)
	}
}

func TestVersionsIncreaseWithinARead(t *testing.T) {
	w := newWorld(t, Options{})
	w.read()
	s := w.watch("")
	w.read(holder("h-a", 1), holder("h-b", 2), holder("h-c", 3))
	var last int64
	for range 3 {
		e := <-s.C
		if e.RV <= last {
			t.Fatalf("version %d after %d", e.RV, last)
		}
		last = e.RV
	}
	// A watch resuming from the middle of the read gets the rest of it.
	if got := received(w.watch(strconv.FormatInt(last-1, 10))); len(got) != 1 || got[0] != "Added holder h-c" {
		t.Errorf("resumed after the second change: %q, want the third only", got)
	}
}

func TestAVersionOlderThanTheWindowExpires(t *testing.T) {
	w := newWorld(t, Options{Window: 2})
	w.read()
	first := w.feed.RV()
	w.read(holder("h-a", 1))
	kept := w.feed.RV()
	w.read(holder("h-a", 1), holder("h-b", 2))
	w.read(holder("h-a", 1), holder("h-b", 2), holder("h-c", 3)) // three events: the first leaves the window
	if len(w.feed.ring) != 2 {
		t.Errorf("the window holds %d events, want 2", len(w.feed.ring))
	}
	_, err := w.feed.Watch(context.Background(), first)
	var expired *ExpiredError
	if !errors.As(err, &expired) {
		t.Fatalf("Watch from %s: %v, want ExpiredError", first, err)
	}
	// The version of the event that just left the window is still complete after it.
	if got := received(w.watch(kept)); len(got) != 2 {
		t.Errorf("watch from %s: %q, want the two events after it", kept, got)
	}
	if _, err := w.feed.Watch(context.Background(), "12x"); !errors.As(err, new(*InvalidVersionError)) {
		t.Errorf("Watch(12x): %v, want InvalidVersionError", err)
	}
}

func TestAVersionOfAnotherReplicaOrRunExpires(t *testing.T) {
	w := newWorld(t, Options{})
	w.read()
	w.read(holder("h-a", 1))
	w.read(holder("h-a", 1), holder("h-b", 2))
	// Another replica's list: a version between this replica's events, never handed out here.
	for name, rv := range map[string]int64{
		"another replica's": w.feed.rv - 500,
		"before a restart":  w.feed.start - 1,
	} {
		if _, err := w.feed.Watch(context.Background(), strconv.FormatInt(rv, 10)); !errors.As(err, new(*ExpiredError)) {
			t.Errorf("%s version: %v, want ExpiredError", name, err)
		}
	}
	// This replica's own version replays exactly what followed it.
	if got := received(w.watch(w.feed.RV())); len(got) != 0 {
		t.Errorf("watch from the latest version: %q, want nothing", got)
	}
}

// A holder that lived between two reads of the feed, shown by a list, goes in the watch from
// the list's version; one still there comes as the read's ADDED, as to every watch.
func TestWhatAListSawTheFeedMissedIsReportedGone(t *testing.T) {
	w := newWorld(t, Options{})
	w.read(holder("h-a", 1))
	listed := w.feed.RV()
	// A list reads the store between two reads of the feed: h-b and h-c, granted since.
	w.feed.Seen(NewState([]lease.Holder{holder("h-a", 1), holder("h-b", 2), holder("h-c", 3)}, nil, nil))
	s := w.watch(listed)
	w.read(holder("h-a", 1), holder("h-c", 3)) // h-b has gone before the feed's next read
	if diff := cmp.Diff([]string{"Added holder h-c", "Deleted holder h-b"}, received(s)); diff != "" {
		t.Errorf("watch from the list's version (-want +got):\n%s", diff)
	}
	if len(w.feed.seen) != 0 {
		t.Errorf("the feed still keeps %d objects lists saw", len(w.feed.seen))
	}
}

// An object a list saw while a read of the feed ran waits for the feed's next read: that one
// may have read the store before the list did, and must not call it gone.
func TestWhatAListSawDuringAReadWaitsForTheNext(t *testing.T) {
	w := newWorld(t, Options{})
	w.read()
	s := w.watch(w.feed.RV())
	w.src.read = func() { w.feed.Seen(NewState([]lease.Holder{holder("h-a", 1)}, nil, nil)) }
	w.read() // the list saw h-a while this read ran; this read's answer has no h-a
	w.src.read = nil
	if got := received(s); len(got) != 0 {
		t.Errorf("after the read the list ran beside: %q, want nothing (h-a may be there still)", got)
	}
	w.read()
	if got := received(s); len(got) != 1 || got[0] != "Deleted holder h-a" {
		t.Errorf("after the next read, h-a gone: %q, want it deleted", got)
	}
}

func TestASlowWatcherIsDroppedAndTheOthersGoOn(t *testing.T) {
	w := newWorld(t, Options{Buffer: 2})
	w.read()
	slow, live := w.watch(""), w.watch("")
	w.read(holder("h-a", 1))
	<-live.C
	w.read(holder("h-a", 1), holder("h-b", 2))
	<-live.C
	w.read(holder("h-a", 1), holder("h-b", 2), holder("h-c", 3)) // slow has two waiting: a third drops it

	if got := received(slow); len(got) != 3 || got[2] != "closed" {
		t.Errorf("slow watcher received %q, want two events then closed", got)
	}
	if !errors.Is(slow.Err(), ErrTooSlow) {
		t.Errorf("slow.Err() = %v, want ErrTooSlow", slow.Err())
	}
	if got := received(live); len(got) != 1 || got[0] != "Added holder h-c" {
		t.Errorf("live watcher received %q, want the third change", got)
	}
	if n := w.feed.Watchers(); n != 1 {
		t.Errorf("%d watchers, want 1", n)
	}
	live.Stop()
	if got := received(live); len(got) != 1 || got[0] != "closed" || live.Err() != nil {
		t.Errorf("stopped watcher: %q, %v; want closed without error", got, live.Err())
	}
}

func TestAFailedReadChangesNothing(t *testing.T) {
	w := newWorld(t, Options{})
	w.read(holder("h-a", 1))
	s := w.watch("")
	w.src.err = lease.ErrUnavailable
	w.src.holders = nil
	if err := w.feed.round(context.Background()); err == nil {
		t.Fatal("round with a failing store: no error")
	}
	w.src.err = nil
	w.read(holder("h-a", 1))
	if got := received(s); len(got) != 1 || got[0] != "Added holder h-a" {
		t.Errorf("after a failed read: %q, want only the state (h-a was never gone)", got)
	}
}

func TestWatchWaitsForTheFirstRead(t *testing.T) {
	w := newWorld(t, Options{})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := w.feed.Watch(ctx, ""); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("Watch before the first read, context done: %v, want ErrUnavailable", err)
	}
	if rv := w.feed.RV(); rv != "" {
		t.Errorf("RV before the first read = %q, want empty", rv)
	}
}

// What lists saw waits for the feed's next read; while its reads fail, it stays bounded.
func TestWhatListsSawStaysBoundedWhileTheFeedCannotRead(t *testing.T) {
	w := newWorld(t, Options{})
	w.read()
	const perList = 10000
	for list := range 20 {
		hs := make([]lease.Holder, perList)
		for i := range hs {
			hs[i] = holder(fmt.Sprintf("h-%d-%d", list, i), 1)
		}
		w.feed.Seen(NewState(hs, nil, nil))
		if n := len(w.feed.seen); n > maxSeen+perList {
			t.Fatalf("after %d lists the feed keeps %d objects they saw, want at most %d", list+1, n, maxSeen+perList)
		}
	}
}

// After a read that took longer than the interval, the feed rests as long as the read took:
// it takes at most half of the store's time.
func TestTheFeedRestsAsLongAsItsReadTook(t *testing.T) {
	w := newWorld(t, Options{Interval: time.Second})
	var mu sync.Mutex
	reads := 0
	w.src.read = func() {
		mu.Lock()
		reads++
		mu.Unlock()
		w.clock.Step(3 * time.Second) // the read takes 3 s
	}
	count := func() int {
		mu.Lock()
		defer mu.Unlock()
		return reads
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = w.feed.Run(ctx) }()
	waitTimer := func() {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); !w.clock.HasWaiters(); {
			if time.Now().After(deadline) {
				t.Fatal("the feed does not rest")
			}
			time.Sleep(time.Millisecond) // real time: the feed runs in another goroutine
		}
	}
	waitTimer()
	w.clock.Step(time.Second)         // an interval: not enough after a read of 3 s
	time.Sleep(50 * time.Millisecond) // real time: a read would have started by now
	if n := count(); n != 1 {
		t.Fatalf("%d reads one interval after a read of 3 s, want 1", n)
	}
	w.clock.Step(2 * time.Second) // 3 s rested
	for deadline := time.Now().Add(10 * time.Second); count() < 2; {
		if time.Now().After(deadline) {
			t.Fatal("no second read after resting as long as the first took")
		}
		time.Sleep(time.Millisecond) // real time: the feed runs in another goroutine
	}
}
