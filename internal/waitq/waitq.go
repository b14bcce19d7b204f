// Package waitq is the in-process registry of waiting acquisitions (docs/waiting.md), by
// the public ID of each one's waiting holder. The order of waiters lives in the store (the
// line of a full level); this registry only delivers wake-ups: the slot handed to one waiter
// (from this process's store, or from another process through the notifier) wakes exactly
// that waiter, and a definition change or a notifier's reconnect wakes all of them once. It
// knows nothing of the store: internal/leasing registers and waits.
package waitq

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Queue holds the waiters of one process. The zero value is not usable; use New.
type Queue struct {
	mu      sync.Mutex
	waiters map[string]*Waiter
}

// New returns an empty queue.
func New() *Queue { return &Queue{waiters: map[string]*Waiter{}} }

// Waiter is one registered acquisition.
type Waiter struct {
	q  *Queue
	id string
	// c holds at most one wake-up: the key of a slot handed over, or "" (look at the
	// store). A newer wake-up replaces an older unread one only if that carries no key.
	c chan string
}

// Register adds the waiter whose waiting holder has the public ID id. Register before the
// attempt that may queue the holder: a slot handed to it before the attempt returns then
// wakes it rather than being missed until its next safety look.
func (q *Queue) Register(id string) *Waiter {
	w := &Waiter{q: q, id: id, c: make(chan string, 1)}
	q.mu.Lock()
	q.waiters[id] = w
	q.mu.Unlock()
	return w
}

// Done removes the waiter (it got its slot, gave up or failed).
func (w *Waiter) Done() {
	w.q.mu.Lock()
	if w.q.waiters[w.id] == w {
		delete(w.q.waiters, w.id)
	}
	w.q.mu.Unlock()
}

// Granted wakes the waiter with public ID id, if it waits in this process, telling it the
// counter key whose slot it was handed. It reports whether it woke one.
func (q *Queue) Granted(id, key string) bool {
	q.mu.Lock()
	w, ok := q.waiters[id]
	q.mu.Unlock()
	if ok {
		w.signal(key)
	}
	return ok
}

// WakeAll wakes every waiter once, without a key: each looks at the store (a definition
// changed, or the notifier may have lost events). It returns how many it woke.
func (q *Queue) WakeAll() int {
	q.mu.Lock()
	ws := make([]*Waiter, 0, len(q.waiters))
	for _, w := range q.waiters {
		ws = append(ws, w)
	}
	q.mu.Unlock()
	for _, w := range ws {
		w.signal("")
	}
	return len(ws)
}

// Len returns the number of registered waiters.
func (q *Queue) Len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.waiters)
}

// Waiting reports whether the waiter with public ID id is registered.
func (q *Queue) Waiting(id string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	_, ok := q.waiters[id]
	return ok
}

// signal leaves a wake-up for the waiter; a key is never replaced by a wake-up without one.
func (w *Waiter) signal(key string) {
	for {
		select {
		case w.c <- key:
			return
		default:
		}
		select {
		case old := <-w.c:
			if old != "" && key == "" {
				key = old
			}
		default:
		}
	}
}

// Wake is why Wait returned.
type Wake int

const (
	// Granted means a slot was handed to the waiter (Wait's key names its counter).
	Granted Wake = iota
	// Look means the waiter should look at the store (WakeAll).
	Look
	// Timer means the safety timer fired.
	Timer
	// Deadline means the wait's deadline came.
	Deadline
	// Cancelled means the caller's context ended.
	Cancelled
)

// Wait blocks until a wake-up, the safety timer (after d), the deadline or ctx's end,
// whichever comes first. A wake-up that is already there wins over the others, so that a
// slot handed over at the deadline is taken rather than dropped.
func (w *Waiter) Wait(ctx context.Context, clk clock.Clock, d time.Duration, deadline time.Time) (Wake, string) {
	select {
	case key := <-w.c:
		return woken(key)
	default:
	}
	remaining := deadline.Sub(clk.Now())
	if remaining <= 0 {
		return Deadline, ""
	}
	reason := Timer
	if remaining <= d {
		d, reason = remaining, Deadline
	}
	t := clk.NewTimer(d)
	defer t.Stop()
	select {
	case key := <-w.c:
		return woken(key)
	case <-t.C():
		return reason, ""
	case <-ctx.Done():
		return Cancelled, ""
	}
}

func woken(key string) (Wake, string) {
	if key == "" {
		return Look, ""
	}
	return Granted, key
}

// SafetyDelay is the pause of a waiter's safety timer: uniformly random (r in [0,1)) in
// [3/4·base, 5/4·base), so that waiters that queued together do not look in lockstep.
func SafetyDelay(base time.Duration, r float64) time.Duration {
	return base*3/4 + time.Duration(r*float64(base/2))
}
