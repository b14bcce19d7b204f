package lease

import (
	"strings"
	"time"
)

// Waiter is an acquisition waiting in the line of a full level (docs/waiting.md).
type Waiter struct {
	// Holder is who waits; its Token is never shown, its State is WAITING.
	Holder Holder
	// Key is the counter key of the level it waits at, Level and Scope that level, Cap its
	// cap when the waiter lined up.
	Key   string
	Level Level
	Scope string
	Cap   int
	// Resource is the resource of the level it waits at, and Lease the lease name it waits
	// there under: for an acquisition of several resources, the part it waits on (the parts
	// before it are booked).
	Resource string
	Lease    string
	// Since is when it first lined up (its place; kept from level to level).
	Since time.Time
	// Priority is its priority (raised to the highest past its definition's age bound);
	// waiters of a higher priority stand ahead of it (docs/waiting.md, "Priority").
	Priority int
	// Position is the number of live waiters ahead of it in the line.
	Position int
	// Lapsed: its process stopped renewing its place; hand-overs pass it over until it
	// renews or is reaped.
	Lapsed bool
	// EstimatedWait is EstimateWait of its position; 0 when there is no estimate.
	EstimatedWait time.Duration
}

// SplitCounterKey is the inverse of CounterKey.
func SplitCounterKey(key string) (resource string, level Level, scope string, ok bool) {
	r, rest, ok1 := strings.Cut(key, "|")
	l, sc, ok2 := strings.Cut(rest, "|")
	if !ok1 || !ok2 {
		return "", "", "", false
	}
	return r, Level(l), sc, true
}

// EstimateWait estimates how long an acquisition with ahead live waiters before it, at a
// level with cap slots, will wait, from recent hold times of the resource: the mean hold
// times (ahead+1)/cap, that is, the slots free at the rate the recent holders gave them
// back and each goes to the oldest waiter. It is 0 (no estimate) without hold times or a
// cap. An estimate, never a promise: holds change, waiters leave, a revocation frees a slot
// early.
func EstimateWait(ahead, cap int, holds []time.Duration) time.Duration {
	if cap < 1 || len(holds) == 0 || ahead < 0 {
		return 0
	}
	var sum time.Duration
	for _, h := range holds {
		sum += h
	}
	mean := sum / time.Duration(len(holds))
	return mean * time.Duration(ahead+1) / time.Duration(cap)
}
