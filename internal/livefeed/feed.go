// Package livefeed follows the lease store for the watches of the live API (docs/live-api.md,
// "Watch"). One loop per manager replica reads the holders, waiters and counters every
// interval, compares the read with the one before (Diff) and keeps the differences as events
// numbered by resource version in a bounded window. Every watcher of the replica reads from
// that window and from the events that follow: a thousand watchers cost the store nothing
// more than one.
//
// A list is read from the store, not from the feed; it tells the feed what it read (Seen), so
// that an object the list showed and the feed never read itself (one that lived between two
// of its reads) is still reported when it goes. Resource versions are microseconds of the
// replica's clock at the read that found the change, made strictly increasing: a version from
// before a restart is older than the feed's first read, and one of another replica is no
// version this feed handed out; both answer ExpiredError, and the client lists again.
package livefeed

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Source is the part of the store the feed reads (*leasestore.Store).
type Source interface {
	EachHolder(ctx context.Context, f func(lease.Holder) error) error
	ListWaiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error)
	ListCounters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error)
}

var _ Source = (*leasestore.Store)(nil)

// Defaults of Options.
const (
	DefaultInterval = 500 * time.Millisecond
	DefaultWindow   = 4096
	DefaultBuffer   = 1024
)

// Options tune a feed; zero values take the defaults.
type Options struct {
	// Interval between two reads of the store.
	Interval time.Duration
	// Window is how many events the feed keeps for watches that resume from a resource
	// version; an older version is answered with ExpiredError.
	Window int
	// Buffer is how many events one watcher may fall behind before it is dropped with
	// ErrTooSlow (it then lists again, as after an expired version).
	Buffer int
	// Clock (nil: the real clock).
	Clock clock.WithTicker
	// Log for failed reads (zero: discard).
	Log logr.Logger
}

// Event is a change with the resource version the feed gave it.
type Event struct {
	RV int64
	Change
}

// ErrTooSlow ends a subscription whose watcher fell a buffer behind the feed.
var ErrTooSlow = errors.New("the watch fell behind the changes of the lease store; list and watch again")

// ExpiredError answers a watch from a resource version older than the feed's window, or one
// this feed did not hand out (another replica's, or one from before a restart).
type ExpiredError struct {
	RV, Since int64
}

func (e *ExpiredError) Error() string {
	return fmt.Sprintf("too old resource version: %d (this manager replica holds the changes since %d, "+
		"and only versions it handed out: a list answered by another replica or before a restart has none of them); list again", e.RV, e.Since)
}

// InvalidVersionError answers a resource version that is no number.
type InvalidVersionError struct{ RV string }

func (e *InvalidVersionError) Error() string {
	return fmt.Sprintf("invalid resource version %q: a watch starts from the resourceVersion of a list or of an object", e.RV)
}

// Feed is one replica's follower of the store. Run reads; Watch subscribes.
type Feed struct {
	src   Source
	opts  Options
	nudge chan struct{}
	ready chan struct{}

	mu    sync.Mutex
	state State
	// start is the version of the first read; since: every event after it is in ring; rv:
	// the latest version (of the last event, or start).
	start, since, rv int64
	ring             []*Event
	subs             map[*Subscription]struct{}
	// seen are objects lists read that the feed's state lacks, numbered in the order they
	// were seen (Seen); a read that starts after one was seen reports what became of it.
	seen    []seenObject
	seenSeq uint64
}

// maxSeen bounds the objects lists saw that wait for the feed's next read.
const maxSeen = 1 << 16

// seenObject is one object a list read.
type seenObject struct {
	seq    uint64
	kind   Kind
	key    string
	object any
}

// New returns a feed over src; it reads nothing until Run.
func New(src Source, opts Options) *Feed {
	if opts.Interval <= 0 {
		opts.Interval = DefaultInterval
	}
	if opts.Window <= 0 {
		opts.Window = DefaultWindow
	}
	if opts.Buffer <= 0 {
		opts.Buffer = DefaultBuffer
	}
	if opts.Clock == nil {
		opts.Clock = clock.RealClock{}
	}
	if opts.Log.GetSink() == nil {
		opts.Log = logr.Discard()
	}
	return &Feed{src: src, opts: opts, nudge: make(chan struct{}, 1), ready: make(chan struct{}),
		subs: map[*Subscription]struct{}{}}
}

// Run reads the store, rests, and reads again until ctx ends (at once after Nudge). It rests
// an interval, or as long as the read took if that was longer: on a large store the feed
// takes at most half of the store's time (on the development store, which answers one
// command at a time, a read of 10 000 holders takes seconds).
func (f *Feed) Run(ctx context.Context) error {
	failing := false
	for {
		began := f.opts.Clock.Now()
		err := f.round(ctx)
		rest := max(f.opts.Interval, f.opts.Clock.Since(began))
		switch {
		case err != nil && !failing && ctx.Err() == nil:
			f.opts.Log.Error(err, "Reading the lease store for the live API's watches failed; watchers see no change until it answers")
			failing = true
		case err == nil && failing:
			f.opts.Log.Info("Reading the lease store for the live API's watches works again")
			failing = false
		}
		t := f.opts.Clock.NewTimer(rest)
		select {
		case <-ctx.Done():
			t.Stop()
			f.closeAll()
			return nil
		case <-t.C():
		case <-f.nudge:
			t.Stop()
		}
	}
}

// Nudge asks for a read now (a change is known to have been written).
func (f *Feed) Nudge() {
	select {
	case f.nudge <- struct{}{}:
	default:
	}
}

// round reads the store once and publishes the differences.
func (f *Feed) round(ctx context.Context) error {
	f.mu.Lock()
	began := f.seenSeq // what lists saw before this read is older than it
	f.mu.Unlock()
	holders, err := f.readHolders(ctx)
	if err != nil {
		return err
	}
	waiters, err := f.src.ListWaiters(ctx, leasestore.HolderFilter{})
	if err != nil {
		return err
	}
	counters, err := f.src.ListCounters(ctx, leasestore.CounterFilter{})
	if err != nil {
		return err
	}
	next := NewState(holders, waiters, counters)
	now := f.opts.Clock.Now().UnixMicro()

	f.mu.Lock()
	defer f.mu.Unlock()
	if f.start == 0 {
		f.start, f.since, f.rv, f.state = now, now, now, next
		close(f.ready)
		return nil
	}
	changes := append(Diff(f.state, next), f.goneSeen(began, next)...)
	f.state = next
	for _, c := range changes {
		f.rv = max(now, f.rv+1)
		e := &Event{RV: f.rv, Change: c}
		f.ring = append(f.ring, e)
		for s := range f.subs {
			select {
			case s.c <- e:
			default:
				s.end(ErrTooSlow)
			}
		}
	}
	if drop := len(f.ring) - f.opts.Window; drop > 0 {
		f.since = f.ring[drop-1].RV
		f.ring = slices.Clone(f.ring[drop:])
	}
	return nil
}

// readHolders reads every holder, streamed in small batches: no command of the feed's holds
// the store for long (the development store answers one command at a time).
func (f *Feed) readHolders(ctx context.Context) ([]lease.Holder, error) {
	var all []lease.Holder
	err := f.src.EachHolder(ctx, func(h lease.Holder) error {
		all = append(all, h)
		return nil
	})
	return all, err
}

// goneSeen forgets the objects lists saw up to seq (before this read began) and returns, as
// DELETED, those that neither the feed's state nor this read next has: they lived between two
// reads of the feed. (Those next has come as the read's ADDED, those the state has as its
// changes.)
func (f *Feed) goneSeen(seq uint64, next State) []Change {
	var gone []Change
	keep := f.seen[:0]
	for _, o := range f.seen {
		if o.seq > seq {
			keep = append(keep, o)
			continue
		}
		var known bool
		switch o.kind {
		case KindHolder:
			_, known = f.state.Holders[o.key]
			if !known {
				_, known = next.Holders[o.key]
			}
		case KindWaiter:
			_, known = f.state.Waiters[o.key]
			if !known {
				_, known = next.Waiters[o.key]
			}
		case KindCounter:
			_, known = f.state.Counters[o.key]
			if !known {
				_, known = next.Counters[o.key]
			}
		}
		if !known && !slices.ContainsFunc(gone, func(c Change) bool { return c.Kind == o.kind && c.Key == o.key }) {
			gone = append(gone, Change{Type: Deleted, Kind: o.kind, Key: o.key, Object: o.object})
		}
	}
	clear(f.seen[len(keep):])
	f.seen = keep
	slices.SortStableFunc(gone, func(a, b Change) int {
		if a.Kind != b.Kind {
			return int(a.Kind) - int(b.Kind)
		}
		return strings.Compare(a.Key, b.Key)
	})
	return gone
}

// Seen tells the feed what a list read from the store: the objects the feed has not read
// itself are reported by its next read that starts after now (DELETED if they are gone by
// then), so that a watch from the list's version never keeps an object the feed missed.
func (f *Feed) Seen(s State) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.start == 0 {
		return
	}
	f.seenSeq++
	if len(f.seen) > maxSeen {
		// The feed has not read for a long while (its reads fail): keep the newer half, and
		// an object only the forgotten lists showed may stay in a watcher's cache.
		f.seen = slices.Clone(f.seen[len(f.seen)/2:])
	}
	add := func(kind Kind, key string, known bool, obj any) {
		if !known {
			f.seen = append(f.seen, seenObject{seq: f.seenSeq, kind: kind, key: key, object: obj})
		}
	}
	for k, h := range s.Holders {
		_, ok := f.state.Holders[k]
		add(KindHolder, k, ok, h)
	}
	for k, w := range s.Waiters {
		_, ok := f.state.Waiters[k]
		add(KindWaiter, k, ok, w)
	}
	for k, c := range s.Counters {
		_, ok := f.state.Counters[k]
		add(KindCounter, k, ok, c)
	}
}

// RV is the feed's latest resource version, "" before its first read: a list read from the
// store after it shows every change up to it, and a watch from it misses nothing after.
func (f *Feed) RV() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.start == 0 {
		return ""
	}
	return strconv.FormatInt(f.rv, 10)
}

// Subscription is one watcher's view of the feed: Initial first (the state, or the events
// after the version the watch resumes from), then the events of C until it closes.
type Subscription struct {
	// Initial are the events a watch starts with.
	Initial []*Event
	// From is the version the subscription is complete after: a watcher that has seen every
	// event up to a version ≥ From may resume from it.
	From int64
	// C carries the following events; it closes when the subscription ends (Err says why).
	C <-chan *Event

	c    chan *Event
	feed *Feed
	err  error
}

// Watch subscribes from resource version from: "" or "0" start with the current state as
// Added events; a version replays the events after it (ExpiredError when the window no
// longer holds them). It waits for the feed's first read, at most until ctx ends.
func (f *Feed) Watch(ctx context.Context, from string) (*Subscription, error) {
	select {
	case <-f.ready:
	case <-ctx.Done():
		return nil, fmt.Errorf("waiting for the first read of the lease store: %w", lease.ErrUnavailable)
	}
	var rv int64
	if from != "" && from != "0" {
		var err error
		if rv, err = strconv.ParseInt(from, 10, 64); err != nil || rv < 0 {
			return nil, &InvalidVersionError{RV: from}
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	s := &Subscription{c: make(chan *Event, f.opts.Buffer), feed: f, From: f.rv}
	s.C = s.c
	if rv == 0 {
		for _, c := range f.state.Added() {
			s.Initial = append(s.Initial, &Event{RV: f.rv, Change: c})
		}
	} else {
		if rv < f.since || !f.handedOut(rv) {
			return nil, &ExpiredError{RV: rv, Since: f.since}
		}
		i, _ := slices.BinarySearchFunc(f.ring, rv+1, func(e *Event, v int64) int { return cmp.Compare(e.RV, v) })
		s.Initial = slices.Clone(f.ring[i:])
	}
	f.subs[s] = struct{}{}
	return s, nil
}

// handedOut: rv is a version this run of the feed gave (to an event, or to its first read).
func (f *Feed) handedOut(rv int64) bool {
	if rv == f.start || rv == f.since {
		return true
	}
	_, ok := slices.BinarySearchFunc(f.ring, rv, func(e *Event, v int64) int { return cmp.Compare(e.RV, v) })
	return ok
}

// Stop ends the subscription; C closes.
func (s *Subscription) Stop() {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	s.end(nil)
}

// Err says why C closed: ErrTooSlow, or nil when stopped or when the feed stopped.
func (s *Subscription) Err() error {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	return s.err
}

// end closes the subscription with err (under the feed's lock).
func (s *Subscription) end(err error) {
	if _, ok := s.feed.subs[s]; !ok {
		return
	}
	delete(s.feed.subs, s)
	s.err = err
	close(s.c)
}

func (f *Feed) closeAll() {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s := range f.subs {
		s.end(nil)
	}
}

// Watchers is the number of subscriptions.
func (f *Feed) Watchers() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.subs)
}
