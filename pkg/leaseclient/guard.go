package leaseclient

import (
	"errors"
	"fmt"
	"sync"
)

// Guard is for the service a lease protects: it keeps the highest fence it has seen per
// resource and refuses work that carries a lower one.
//
// Why: a holder can pause (a long garbage collection, a frozen node, a partition) for longer
// than its lease's TTL. The operator then reaps it and grants the slot again, while the paused
// holder still believes it holds; when it resumes, its writes land next to its successor's.
// The lease alone cannot stop that, since the paused holder sends nothing to the operator
// before it writes. The service it writes to can: every grant carries a fence that strictly
// increases for its resource, the successor's is higher, and once the service has seen the
// successor's it refuses the lower one. Where the service has not seen the successor yet, it
// has no conflicting write either, and the late holder's check at its next use answers lost.
//
// The fence orders holders that follow each other on a slot capped at one (a level with a cap
// of 1 that the guarded work belongs to: one holder per resource, per tenant or per user).
// Key the guard by that scope: the resource for a global cap of 1, the tenant or the user for
// a narrower one. Under a larger cap several holders are legitimately alive at once, with
// different fences, and a guard keyed wider than the exclusive scope would refuse the older.
//
// A Guard is safe for concurrent use; its zero value is ready. It keeps one number per key in
// memory: a service that restarts starts from nothing (it then accepts the first fence it sees
// again), or persists Highest next to the data it guards.
type Guard struct {
	mu      sync.Mutex
	highest map[string]int64
}

// ErrStaleFence is what Admit refuses with: the work carries a fence lower than one the guard
// has seen for its key; the error is a *StaleFenceError.
var ErrStaleFence = errors.New("stale fence")

// StaleFenceError is Admit's refusal.
type StaleFenceError struct {
	// Key is what the guard keys by (a resource, a tenant, a user).
	Key string
	// Fence is what the work carried; Highest the highest the guard has seen for Key.
	Fence, Highest int64
}

func (e *StaleFenceError) Error() string {
	return fmt.Sprintf("stale fence for %s: the work carries fence %d, a holder with fence %d came after it (its lease was reaped or released)",
		e.Key, e.Fence, e.Highest)
}

// Is makes a *StaleFenceError match ErrStaleFence.
func (e *StaleFenceError) Is(target error) bool { return target == ErrStaleFence }

// Admit accepts work for key carrying fence when fence is at least the highest seen for key,
// and remembers it; the same fence again is accepted (one holder does many pieces of work).
// A lower fence is refused with a *StaleFenceError; a fence below 1 (no lease, a NOOP lease)
// is refused too. Run the work only after Admit accepted it, and hold the guard's decision
// and the write together where they must not interleave (Do).
func (g *Guard) Admit(key string, fence int64) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.admit(key, fence)
}

func (g *Guard) admit(key string, fence int64) error {
	if fence < 1 {
		return &StaleFenceError{Key: key, Fence: fence, Highest: g.highest[key]}
	}
	if h := g.highest[key]; fence < h {
		return &StaleFenceError{Key: key, Fence: fence, Highest: h}
	}
	if g.highest == nil {
		g.highest = map[string]int64{}
	}
	g.highest[key] = fence
	return nil
}

// Do runs work when Admit accepts fence for key, with the guard held for key's decision and
// the work together: no higher fence is admitted while it runs, so a stale write cannot slip
// in between a check and its write. Keep work short; it blocks the guard for every key.
func (g *Guard) Do(key string, fence int64, work func() error) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if err := g.admit(key, fence); err != nil {
		return err
	}
	return work()
}

// Highest is the highest fence the guard has admitted for key (0: none).
func (g *Guard) Highest(key string) int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.highest[key]
}
