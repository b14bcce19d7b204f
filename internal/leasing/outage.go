package leasing

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// storeWatch is what this process saw of the store's answers to an acquisition's calls, for
// one decision: whether a call that the deadline overtook is an outage (503
// LEASE_UNAVAILABLE) or a slow store (409 LEASE_BUSY with the last diagnosis; docs/waiting.md,
// "Deadlines and outages"). A late answer is no evidence of an outage: under load the store's
// queue is long, and its answers come after short deadlines while it is up (issue 41). The
// evidence is an error of the store, or a call in flight for longer than the store's
// operation timeout, by which the store gives up on a call itself.
type storeWatch struct {
	mu       sync.Mutex
	next     uint64
	inFlight map[uint64]time.Time // when each call in flight was asked
	seen     storeSeen
}

// storeSeen is the watch's record, apart from the calls in flight.
type storeSeen struct {
	// answered is when a call was last answered (an outcome, a refusal included).
	answered time.Time
	// failed is when a call last ended with a failure of the store, and err that failure.
	failed time.Time
	err    error
	// oldest is when the oldest call still in flight was asked (zero: none).
	oldest time.Time
}

func newStoreWatch() *storeWatch { return &storeWatch{inFlight: map[uint64]time.Time{}} }

// begin records a call asked at now; end(id, …) records its end.
func (w *storeWatch) begin(now time.Time) uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.next++
	w.inFlight[w.next] = now
	return w.next
}

// end records the end at now of call id with err, its error: an answer of the store, or its
// failure (storeFailed). callerGone: the call ran under the caller's context, which ended
// first, so its error says nothing of the store.
func (w *storeWatch) end(id uint64, now time.Time, err error, callerGone bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	delete(w.inFlight, id)
	switch {
	case callerGone && err != nil:
	case storeFailed(err):
		w.seen.failed, w.seen.err = now, err
	default:
		w.seen.answered = now
	}
}

// snapshot is the record at this moment.
func (w *storeWatch) snapshot() storeSeen {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.seen
	for _, at := range w.inFlight {
		if s.oldest.IsZero() || at.Before(s.oldest) {
			s.oldest = at
		}
	}
	return s
}

// outage is the cause of a 503 for an acquisition whose store call, asked at asked, the
// deadline overtook at now, in a round that began at since; nil when the store is only slow.
// The store is down when a call of this process failed since the round began and none was
// answered after that, or when a call (the overtaken one included) has been in flight for
// longer than timeout, the store's operation timeout. Anything else, however late, is load.
func (s storeSeen) outage(since, asked, now time.Time, timeout time.Duration) error {
	if !s.failed.IsZero() && !s.failed.Before(since) && !s.answered.After(s.failed) {
		return fmt.Errorf("the store failed during the wait: %w", s.err)
	}
	oldest := asked
	if !s.oldest.IsZero() && s.oldest.Before(oldest) {
		oldest = s.oldest
	}
	if waited := now.Sub(oldest); waited > timeout {
		return fmt.Errorf("a store call has had no answer for %v, longer than the store's timeout (%v)", waited, timeout)
	}
	return nil
}

// storeFailed reports whether err, the error of a store call, is a failure of the store (the
// driver's error, a timeout) rather than one of its answers: a full level or a place in line
// (both lease.ErrBusy), a waiter gone, a holder lost, a request it found invalid.
func storeFailed(err error) bool {
	if err == nil || errors.Is(err, leasestore.ErrNotWaiting) {
		return false
	}
	return errors.Is(storeError("", "", err), lease.ErrUnavailable)
}
