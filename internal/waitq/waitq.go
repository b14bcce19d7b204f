// Package waitq is the in-process registry of waiting acquisitions (docs/waiting.md): per
// counter key, the waiters blocked on it, oldest first. A slot freed on a key wakes at most as
// many waiters as slots were freed, oldest first; a waiter that loses the race for the slot
// goes back to its place. The registry knows nothing of the store: internal/leasing registers
// and waits, the store's freed hook and the cross-process notifier call Freed and WakeAll.
package waitq

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Queue holds the waiters of one process. The zero value is not usable; use New.
type Queue struct {
	mu    sync.Mutex
	seq   uint64
	byKey map[string][]*Waiter // each slice ordered by seq (oldest first)
}

// New returns an empty queue.
func New() *Queue { return &Queue{byKey: map[string][]*Waiter{}} }

// Waiter is one registered acquisition. Its position is fixed at Register: a waiter that is
// woken and finds the level full again keeps it.
type Waiter struct {
	q   *Queue
	seq uint64
	// at, once set (Order), places the waiter by the store's order of reservations instead
	// of by registration.
	at   time.Time
	keys []string
	// blocked is set once an attempt found a level full (Block); only blocked waiters make
	// newcomers queue behind them (Ahead).
	blocked bool
	info    any
	woken   bool
	// remote: the pending wake-up came from another process's event (Notified), which
	// every process with waiters receives: the waiter reads before it writes.
	remote bool
	done   bool
	c      chan struct{}
}

// Register adds a waiter on every key of its funnel, at the back of each queue. Register
// before the attempt that may find a level full: a slot freed between that attempt and the
// start of waiting then wakes this waiter instead of being lost.
func (q *Queue) Register(keys ...string) *Waiter {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.seq++
	w := &Waiter{q: q, seq: q.seq, keys: append([]string(nil), keys...), c: make(chan struct{}, 1)}
	for _, k := range w.keys {
		q.byKey[k] = append(q.byKey[k], w)
	}
	return w
}

// Block records that the waiter is blocked on key (the level found full, with info, e.g.
// the busy diagnosis, for Ahead) and drops its registration on the other keys. It keeps its
// place in key's queue; a key it was not registered on is added at its place by age.
func (w *Waiter) Block(key string, info any) {
	q := w.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.done {
		return
	}
	found := false
	for _, k := range w.keys {
		if k == key {
			found = true
			continue
		}
		q.remove(k, w)
	}
	if !found {
		q.insert(key, w)
	}
	w.keys = []string{key}
	w.blocked = true
	w.info = info
}

// Order places the waiter by at (the server's time of its reservation in a queue shared with
// other processes; ties by registration), ahead of waiters that have none, so that this
// registry wakes waiters in the same order as that queue serves them.
func (w *Waiter) Order(at time.Time) {
	q := w.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.done {
		return
	}
	w.at = at
	for _, k := range w.keys {
		q.remove(k, w)
		q.insert(k, w)
	}
}

// before orders waiters: by reservation time where both have one, those with one first, then
// by registration.
func before(a, b *Waiter) bool {
	switch {
	case !a.at.IsZero() && !b.at.IsZero() && !a.at.Equal(b.at):
		return a.at.Before(b.at)
	case a.at.IsZero() != b.at.IsZero():
		return !a.at.IsZero()
	}
	return a.seq < b.seq
}

// C is signalled when a slot this waiter may take was freed (or the notifier asks every
// waiter to re-check).
func (w *Waiter) C() <-chan struct{} { return w.c }

// Rearm makes a woken waiter wakeable again, at its original place: it found the level full
// after all (another process or a newcomer took the slot).
func (w *Waiter) Rearm() {
	w.q.mu.Lock()
	defer w.q.mu.Unlock()
	w.rearm()
}

// rearm drops a pending wake-up; q.mu is held.
func (w *Waiter) rearm() {
	w.woken = false
	w.remote = false
	select {
	case <-w.c:
	default:
	}
}

// PassOn makes a woken waiter wakeable again and hands its wake-up to the oldest waiter on
// its key behind it that has none: it is not this waiter's turn, but one behind it here may
// have an earlier place in a queue this registry does not see (the store's).
func (w *Waiter) PassOn() {
	q := w.q
	q.mu.Lock()
	defer q.mu.Unlock()
	w.rearm()
	for _, k := range w.keys {
		behind := false
		for _, x := range q.byKey[k] {
			if x == w {
				behind = true
				continue
			}
			if behind && !x.woken {
				x.woken = true
				select {
				case x.c <- struct{}{}:
				default:
				}
				return
			}
		}
	}
}

// Done removes the waiter from every queue (it got a slot, gave up, or failed). A wake it
// received but did not use passes to the next waiter on the same key.
func (w *Waiter) Done() {
	q := w.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if w.done {
		return
	}
	w.done = true
	unused := w.woken
	select {
	case <-w.c:
	default:
		unused = false
	}
	for _, k := range w.keys {
		q.remove(k, w)
		if unused {
			q.wake(k, 1)
		}
	}
}

// Freed wakes, for each entry of keys, the oldest waiter on that key not yet woken: one
// entry is one slot given back. It fits leasestore.FreedFunc.
func (q *Queue) Freed(keys []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		q.wake(k, 1)
	}
}

// Notified is Freed for slots another process gave back, as its notifier reports them: the
// same event wakes the oldest waiter of every process, so the waiters it wakes return Remote
// from Wait and look before they write.
func (q *Queue) Notified(keys []string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, k := range keys {
		for _, w := range q.byKey[k] {
			if !w.woken {
				w.remote = true
				break
			}
		}
		q.wake(k, 1)
	}
}

// WakeAll wakes every waiter once so that each re-checks its level (the notifier lost
// events it cannot name, e.g. after a reconnect).
func (q *Queue) WakeAll() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for k := range q.byKey {
		n += q.wake(k, len(q.byKey[k]))
	}
	return n
}

// Ahead reports whether a blocked waiter is queued on one of keys, with the info of the
// oldest such waiter. A newcomer with time to wait queues behind it instead of taking a
// slot it may have freed for that waiter.
func (q *Queue) Ahead(keys ...string) (info any, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	var oldest *Waiter
	for _, k := range keys {
		for _, w := range q.byKey[k] {
			if w.blocked && (oldest == nil || before(w, oldest)) {
				oldest = w
				break
			}
		}
	}
	if oldest == nil {
		return nil, false
	}
	return oldest.info, true
}

// Blocked returns the number of waiters blocked on key.
func (q *Queue) Blocked(key string) int {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := 0
	for _, w := range q.byKey[key] {
		if w.blocked {
			n++
		}
	}
	return n
}

// wake signals up to n waiters on key not yet woken, oldest first; q.mu is held.
func (q *Queue) wake(key string, n int) int {
	woke := 0
	for _, w := range q.byKey[key] {
		if woke == n {
			break
		}
		if w.woken {
			continue
		}
		w.woken = true
		select {
		case w.c <- struct{}{}:
		default:
		}
		woke++
	}
	return woke
}

func (q *Queue) remove(key string, w *Waiter) {
	ws := q.byKey[key]
	for i, x := range ws {
		if x == w {
			ws = append(ws[:i:i], ws[i+1:]...)
			break
		}
	}
	if len(ws) == 0 {
		delete(q.byKey, key)
		return
	}
	q.byKey[key] = ws
}

func (q *Queue) insert(key string, w *Waiter) {
	ws := q.byKey[key]
	i := len(ws)
	for i > 0 && before(w, ws[i-1]) {
		i--
	}
	ws = append(ws, nil)
	copy(ws[i+1:], ws[i:])
	ws[i] = w
	q.byKey[key] = ws
}

// Wake is why Wait returned.
type Wake int

// The reasons Wait returns.
const (
	// Freed: a slot was freed on the waiter's key in this process; the waiter may try the
	// write path at once.
	Freed Wake = iota
	// Remote: another process freed a slot on the key (Notified); waiters of other processes
	// were woken by the same event, so the waiter reads before it writes.
	Remote
	// Timer: the safety timer fired; the waiter re-checks with a read first.
	Timer
	// Deadline: the waiter's deadline came; it must answer busy.
	Deadline
	// Cancelled: ctx ended.
	Cancelled
)

// Wait blocks until the waiter is woken, its safety timer (safety, from the service's clock)
// fires, the deadline passes or ctx ends, whichever is first. It never waits past deadline.
func (w *Waiter) Wait(ctx context.Context, clk clock.Clock, safety time.Duration, deadline time.Time) Wake {
	remaining := deadline.Sub(clk.Now())
	if remaining <= 0 {
		return Deadline
	}
	reason := Timer
	if remaining <= safety {
		safety, reason = remaining, Deadline
	}
	t := clk.NewTimer(safety)
	defer t.Stop()
	select {
	case <-w.c:
		w.q.mu.Lock()
		remote := w.remote
		w.q.mu.Unlock()
		if remote {
			return Remote
		}
		return Freed
	case <-t.C():
		return reason
	case <-ctx.Done():
		return Cancelled
	}
}

// SafetyDelay is the pause of a waiter's safety timer: uniformly random (r in [0,1)) in
// [3/4·base, 5/4·base), so that waiters that blocked together do not re-check in lockstep,
// and the reads of a waiter stay about one per base.
func SafetyDelay(base time.Duration, r float64) time.Duration {
	return base*3/4 + time.Duration(r*float64(base/2))
}
