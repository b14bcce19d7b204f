package livefeed

import (
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Kind is what an event is about.
type Kind int

// The kinds of object the feed follows: the live API's leaseholders, leasewaiters and
// leasecounters.
const (
	KindHolder Kind = iota
	KindWaiter
	KindCounter
)

// Type says what happened to the object.
type Type int

// The event types of a Kubernetes watch.
const (
	Added Type = iota
	Modified
	Deleted
)

// Change is one difference between two reads of the store. Object is the object after it
// (for Deleted: the last state the feed saw), Old the one before (Modified only). Both are a
// lease.Holder, a lease.Waiter or a lease.Counter, by Kind.
type Change struct {
	Type   Type
	Kind   Kind
	Key    string
	Object any
	Old    any
}

// State is one read of the store: holders and waiters by public ID, counters by key.
type State struct {
	Holders  map[string]lease.Holder
	Waiters  map[string]lease.Waiter
	Counters map[string]lease.Counter
}

// NewState indexes a read of the store.
func NewState(holders []lease.Holder, waiters []lease.Waiter, counters []lease.Counter) State {
	s := State{
		Holders:  make(map[string]lease.Holder, len(holders)),
		Waiters:  make(map[string]lease.Waiter, len(waiters)),
		Counters: make(map[string]lease.Counter, len(counters)),
	}
	for _, h := range holders {
		s.Holders[h.ID] = h
	}
	for _, w := range waiters {
		// A waiter shows its holder's spec, not its state: renewing its place (LastSeenAt)
		// changes nothing a watcher sees, so the feed does not report it.
		w.Holder.LastSeenAt, w.Holder.AcquiredAt, w.Holder.Levels = time.Time{}, time.Time{}, nil
		s.Waiters[w.Holder.ID] = w
	}
	for _, c := range counters {
		s.Counters[c.Key] = c
	}
	return s
}

// Diff lists the changes that take prev to next: holders first, then waiters, then
// counters, each in the order of their keys, so that two feeds that read the same states
// report the same changes in the same order. An object whose every field is unchanged is
// not reported.
func Diff(prev, next State) []Change {
	var out []Change
	out = diffKind(out, KindHolder, prev.Holders, next.Holders)
	out = diffKind(out, KindWaiter, prev.Waiters, next.Waiters)
	return diffKind(out, KindCounter, prev.Counters, next.Counters)
}

func diffKind[T any](out []Change, kind Kind, prev, next map[string]T) []Change {
	keys := slices.Collect(maps.Keys(prev))
	for k := range next {
		if _, ok := prev[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	for _, k := range keys {
		p, had := prev[k]
		n, has := next[k]
		switch {
		case !had:
			out = append(out, Change{Type: Added, Kind: kind, Key: k, Object: n})
		case !has:
			out = append(out, Change{Type: Deleted, Kind: kind, Key: k, Object: p})
		case !reflect.DeepEqual(p, n):
			out = append(out, Change{Type: Modified, Kind: kind, Key: k, Object: n, Old: p})
		}
	}
	return out
}

// Added lists the state's objects as Added changes, in Diff's order: what a watch that
// starts without a resource version receives first.
func (s State) Added() []Change {
	return Diff(State{}, s)
}
