// Package waitfor bounds what tests wait on: a condition polled, a value received, a group of
// goroutines, a context. Each wait ends by Bound, or earlier near the test's own deadline, and
// then fails the test saying what it waited for. A regression that leaves a goroutine blocked
// (a waiter never woken, a fake clock nobody steps) thus fails in seconds instead of hanging
// the package until go test's timeout (docs/testing.md, "Time in tests").
//
// Inside a testing/synctest bubble the same helpers run on the bubble's virtual clock.
package waitfor

import (
	"context"
	"sync"
	"testing"
	"time"
)

// Bound is the longest a single wait of a test may take: generous for a busy 2-core machine
// (a goroutine reaching its wait takes milliseconds, a store round trip well under a second),
// short next to go test's ten-minute timeout.
const Bound = 30 * time.Second

// margin is kept before the test's deadline so that the failure, not the timeout's panic,
// is what the log shows.
const margin = 5 * time.Second

// deadliner is *testing.T's Deadline, which testing.TB lacks.
type deadliner interface {
	Deadline() (time.Time, bool)
}

// Deadline is when a wait that starts now must give up: now plus Bound, or the test's
// deadline less a margin if that is earlier.
func Deadline(t testing.TB) time.Time {
	d := time.Now().Add(Bound)
	if end, ok := testDeadline(t); ok && end.Add(-margin).Before(d) {
		d = end.Add(-margin)
	}
	return d
}

// testDeadline is t's deadline, if it has one and may be asked: inside a synctest bubble
// Deadline panics (the bubble's clock is not the one of go test's timeout), and Bound of the
// bubble's virtual time is the bound there.
func testDeadline(t testing.TB) (end time.Time, ok bool) {
	td, isT := t.(deadliner)
	if !isT {
		return time.Time{}, false
	}
	defer func() {
		if recover() != nil {
			end, ok = time.Time{}, false
		}
	}()
	return td.Deadline()
}

// Context is the test's context (cancelled when the test ends) with the deadline of one wait.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithDeadline(t.Context(), Deadline(t))
	t.Cleanup(cancel)
	return ctx
}

// Until polls cond every millisecond until it holds; it fails the test if it still does not
// by the deadline. what names the condition for the failure ("the waiter is blocked").
func Until(t testing.TB, what string, cond func() bool) {
	t.Helper()
	UntilEvery(t, time.Millisecond, what, cond)
}

// UntilEvery is Until polling every interval: for a condition that costs a store round
// trip to read.
func UntilEvery(t testing.TB, interval time.Duration, what string, cond func() bool) {
	t.Helper()
	end := Deadline(t)
	for !cond() {
		if time.Now().After(end) {
			t.Fatalf("waitfor: %s: still not true after %v", what, Bound)
		}
		time.Sleep(interval) // polling: the condition has no channel to wait on
	}
}

// Receive returns the next value from ch; it fails the test if none comes by the deadline
// (or ch is closed).
func Receive[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	timer := time.NewTimer(time.Until(Deadline(t)))
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			t.Fatalf("waitfor: %s: channel closed", what)
		}
		return v
	case <-timer.C:
		t.Fatalf("waitfor: %s: nothing received within %v", what, Bound)
	}
	panic("unreachable")
}

// Closed waits until ch is closed (or yields a value); it fails the test if that does not
// happen by the deadline.
func Closed[T any](t testing.TB, ch <-chan T, what string) {
	t.Helper()
	timer := time.NewTimer(time.Until(Deadline(t)))
	defer timer.Stop()
	select {
	case <-ch:
	case <-timer.C:
		t.Fatalf("waitfor: %s: not done within %v", what, Bound)
	}
}

// Group waits for wg; it fails the test if the group has not finished by the deadline.
func Group(t testing.TB, wg *sync.WaitGroup, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	timer := time.NewTimer(time.Until(Deadline(t)))
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		t.Fatalf("waitfor: %s: not finished within %v", what, Bound)
	}
}

// Do runs f (a close, a stop) and waits for it to return; it fails the test if f has not
// returned by the deadline, leaving it running. For a cleanup that waits on code under test,
// e.g. an httptest.Server's Close, which waits for every handler still running.
func Do(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	Closed(t, done, what)
}
