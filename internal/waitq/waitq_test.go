package waitq

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"k8s.io/utils/clock"
)

var real clock.RealClock

// TestGrantedWakesExactlyThatWaiter: a hand-over wakes the waiter it names, with the key,
// and nobody else; one for a waiter of another process is ignored.
func TestGrantedWakesExactlyThatWaiter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New()
		a, b := q.Register("a"), q.Register("b")
		defer a.Done()
		defer b.Done()
		if q.Granted("elsewhere", "k") {
			t.Fatal("a grant for a waiter of another process woke someone")
		}
		if !q.Granted("b", "k") {
			t.Fatal("b not woken")
		}
		deadline := time.Now().Add(time.Hour)
		if w, key := b.Wait(t.Context(), real, time.Minute, deadline); w != Granted || key != "k" {
			t.Fatalf("b: %v %q, want Granted k", w, key)
		}
		if w, _ := a.Wait(t.Context(), real, time.Minute, deadline); w != Timer { // virtual time
			t.Fatalf("a: %v, want its timer", w)
		}
	})
}

// TestAWakeUpAtTheDeadlineIsNotLost: a grant that is already there when the deadline comes
// wins, so the slot handed over is taken rather than dropped (issue 18, finding 7); a
// WakeAll after a grant keeps the grant's key.
func TestAWakeUpAtTheDeadlineIsNotLost(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New()
		w := q.Register("w")
		defer w.Done()
		q.Granted("w", "k")
		q.WakeAll()
		if got, key := w.Wait(t.Context(), real, time.Minute, time.Now()); got != Granted || key != "k" {
			t.Fatalf("at the deadline with a grant pending: %v %q, want Granted k", got, key)
		}
		if got, _ := w.Wait(t.Context(), real, time.Minute, time.Now()); got != Deadline {
			t.Fatalf("then: %v, want Deadline", got)
		}
	})
}

// TestWaitEnds covers the other ways out: WakeAll (look), the caller leaving, the deadline
// before the timer, and Done removing the waiter.
func TestWaitEnds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		q := New()
		w := q.Register("w")
		if n := q.WakeAll(); n != 1 {
			t.Fatalf("WakeAll woke %d", n)
		}
		if got, _ := w.Wait(t.Context(), real, time.Minute, time.Now().Add(time.Hour)); got != Look {
			t.Fatalf("after WakeAll: %v, want Look", got)
		}
		if got, _ := w.Wait(t.Context(), real, time.Minute, time.Now().Add(time.Second)); got != Deadline { // virtual time
			t.Fatalf("deadline before the timer: %v", got)
		}
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		if got, _ := w.Wait(ctx, real, time.Minute, time.Now().Add(time.Hour)); got != Cancelled {
			t.Fatalf("caller gone: %v", got)
		}
		w.Done()
		if q.Len() != 0 || q.Waiting("w") || q.Granted("w", "k") {
			t.Fatal("a waiter that is done is still registered")
		}
	})
}

func TestSafetyDelayStaysInItsBand(t *testing.T) {
	for _, r := range []float64{0, 0.5, 0.999} {
		d := SafetyDelay(time.Second, r)
		if d < 750*time.Millisecond || d >= 1250*time.Millisecond {
			t.Errorf("SafetyDelay(1s, %v) = %v", r, d)
		}
	}
}
