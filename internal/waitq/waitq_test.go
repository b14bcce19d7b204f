package waitq

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/clock"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// woken returns the indexes of the waiters whose wake is pending, draining them.
func woken(ws []*Waiter) []int {
	var out []int
	for i, w := range ws {
		select {
		case <-w.C():
			out = append(out, i)
		default:
		}
	}
	return out
}

func TestFreedWakesOldestFirstAtMostOnePerSlot(t *testing.T) {
	for name, tc := range map[string]struct {
		freed []string
		want  []int
	}{
		"one slot wakes the oldest":          {freed: []string{"k"}, want: []int{0}},
		"two slots wake the two oldest":      {freed: []string{"k", "k"}, want: []int{0, 1}},
		"more slots than waiters wakes all":  {freed: []string{"k", "k", "k", "k", "k"}, want: []int{0, 1, 2}},
		"another key wakes nobody":           {freed: []string{"other"}, want: nil},
		"a slot of the other key is ignored": {freed: []string{"other", "k"}, want: []int{0}},
	} {
		t.Run(name, func(t *testing.T) {
			q := New()
			ws := []*Waiter{q.Register("k"), q.Register("k"), q.Register("k")}
			q.Freed(tc.freed)
			if diff := cmp.Diff(tc.want, woken(ws)); diff != "" {
				t.Errorf("woken (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWokenWaiterIsNotWokenTwiceUntilRearmed(t *testing.T) {
	q := New()
	ws := []*Waiter{q.Register("k"), q.Register("k")}
	q.Freed([]string{"k"})
	q.Freed([]string{"k"})
	if diff := cmp.Diff([]int{0, 1}, woken(ws)); diff != "" {
		t.Fatalf("second slot goes to the second waiter (-want +got):\n%s", diff)
	}
	// The oldest lost the race and goes back to its place: the next slot is its.
	ws[0].Rearm()
	ws[1].Rearm()
	q.Freed([]string{"k"})
	if diff := cmp.Diff([]int{0}, woken(ws)); diff != "" {
		t.Errorf("after rearm (-want +got):\n%s", diff)
	}
}

func TestDonePassesAnUnusedWakeOn(t *testing.T) {
	q := New()
	ws := []*Waiter{q.Register("k"), q.Register("k")}
	ws[0].Block("k", nil)
	ws[1].Block("k", nil)
	q.Freed([]string{"k"})
	ws[0].Done() // woken but gone (deadline, cancelled) before using the slot
	if diff := cmp.Diff([]int{1}, woken(ws)); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
	if n := q.Blocked("k"); n != 1 {
		t.Errorf("Blocked = %d, want 1", n)
	}
}

func TestBlockNarrowsAndKeepsThePlace(t *testing.T) {
	q := New()
	a := q.Register("user", "global")
	b := q.Register("global")
	a.Block("global", "diag-a")
	b.Block("global", nil)
	if q.Blocked("user") != 0 || q.Blocked("global") != 2 {
		t.Errorf("blocked on user %d, on global %d; want 0 and 2", q.Blocked("user"), q.Blocked("global"))
	}
	q.Freed([]string{"global"})
	if diff := cmp.Diff([]int{0}, woken([]*Waiter{a, b})); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
	// A key not registered before is joined at the waiter's age, ahead of younger ones.
	c := q.Register("tenant")
	d := q.Register("other")
	d.Block("tenant", nil)
	c.Block("tenant", nil)
	q.Freed([]string{"tenant"})
	if diff := cmp.Diff([]int{0}, woken([]*Waiter{c, d})); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
}

func TestAheadSeesOnlyBlockedWaiters(t *testing.T) {
	q := New()
	first := q.Register("k") // in its first attempt: not blocking anyone
	if _, ok := q.Ahead("k"); ok {
		t.Fatal("a waiter in its first attempt makes newcomers queue")
	}
	first.Block("k", "full 6/6")
	second := q.Register("k")
	second.Block("k", "full 6/6 later")
	info, ok := q.Ahead("x", "k")
	if !ok || info != "full 6/6" {
		t.Errorf("Ahead = %v, %v; want the oldest blocked waiter's info", info, ok)
	}
	first.Done()
	second.Done()
	if _, ok := q.Ahead("k"); ok {
		t.Error("Ahead after every waiter left")
	}
}

func TestWakeAllWakesEveryWaiterOnce(t *testing.T) {
	q := New()
	ws := []*Waiter{q.Register("a"), q.Register("b"), q.Register("b")}
	if n := q.WakeAll(); n != 3 {
		t.Errorf("WakeAll = %d, want 3", n)
	}
	if diff := cmp.Diff([]int{0, 1, 2}, woken(ws)); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
}

// TestWaitNeverPastTheDeadline runs Wait in a synctest bubble: the bubble's clock advances
// only when every goroutine in it is blocked, so the waiter is known to be waiting when the
// test looks, and Wait's timers fire at their exact virtual time.
func TestWaitNeverPastTheDeadline(t *testing.T) {
	for name, tc := range map[string]struct {
		safety, remaining time.Duration
		wake              bool
		step              time.Duration
		want              Wake
	}{
		"woken":                          {safety: time.Second, remaining: 5 * time.Second, wake: true, want: Freed},
		"safety timer":                   {safety: time.Second, remaining: 5 * time.Second, step: time.Second, want: Timer},
		"deadline before the safety one": {safety: time.Second, remaining: 300 * time.Millisecond, step: 300 * time.Millisecond, want: Deadline},
		"deadline already passed":        {safety: time.Second, remaining: 0, want: Deadline},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := clock.RealClock{} // the bubble's virtual time
				start := clk.Now()
				q := New()
				w := q.Register("k")
				if tc.wake {
					q.Freed([]string{"k"})
				}
				got := make(chan Wake, 1)
				go func() { got <- w.Wait(t.Context(), clk, tc.safety, start.Add(tc.remaining)) }()
				if tc.step > 0 {
					time.Sleep(tc.step - time.Nanosecond) // virtual time
					synctest.Wait()
					select {
					case r := <-got:
						t.Fatalf("Wait returned %v before its time", r)
					default:
					}
				}
				r := waitfor.Receive(t, got, "Wait's answer")
				if r != tc.want {
					t.Errorf("Wait = %v, want %v", r, tc.want)
				}
				if elapsed := time.Since(start); elapsed != tc.step {
					t.Errorf("Wait returned after %v, want %v", elapsed, tc.step)
				}
			})
		})
	}
}

func TestWaitCancelled(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Now())
	w := New().Register("k")
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if r := w.Wait(ctx, clk, time.Second, clk.Now().Add(time.Minute)); r != Cancelled {
		t.Errorf("Wait = %v, want Cancelled", r)
	}
}

func TestSafetyDelayBounds(t *testing.T) {
	for _, tc := range []struct {
		r    float64
		want time.Duration
	}{{0, 750 * time.Millisecond}, {0.5, time.Second}, {0.999, 1249500 * time.Microsecond}} {
		if got := SafetyDelay(time.Second, tc.r); got != tc.want {
			t.Errorf("SafetyDelay(1s, %v) = %v, want %v", tc.r, got, tc.want)
		}
	}
}

func TestPassOnWakesTheNextOneBehind(t *testing.T) {
	q := New()
	ws := []*Waiter{q.Register("k"), q.Register("k"), q.Register("k")}
	for _, w := range ws {
		w.Block("k", nil)
	}
	q.Freed([]string{"k"})
	woken(ws) // the oldest took its wake-up; not its turn
	ws[0].PassOn()
	if diff := cmp.Diff([]int{1}, woken(ws)); diff != "" {
		t.Fatalf("woken (-want +got):\n%s", diff)
	}
	ws[1].PassOn() // never back to the oldest: down the queue
	if diff := cmp.Diff([]int{2}, woken(ws)); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
	ws[2].PassOn() // the last one: nobody behind
	if got := woken(ws); got != nil {
		t.Errorf("woken %v, want nobody", got)
	}
}

func TestOrderFollowsTheReservations(t *testing.T) {
	q := New()
	ws := []*Waiter{q.Register("k"), q.Register("k"), q.Register("k")}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	ws[2].Order(t0) // reserved first although registered last
	ws[0].Order(t0.Add(time.Millisecond))
	q.Freed([]string{"k"})
	if diff := cmp.Diff([]int{2}, woken(ws)); diff != "" {
		t.Fatalf("woken (-want +got):\n%s", diff)
	}
	q.Freed([]string{"k"})
	if diff := cmp.Diff([]int{0}, woken(ws)); diff != "" {
		t.Errorf("woken (-want +got):\n%s", diff)
	}
}

// TestNotifiedWakesAsRemote runs in a synctest bubble: a waiter that is not woken returns
// Timer after its virtual second instead of blocking the test.
func TestNotifiedWakesAsRemote(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clock.RealClock{} // the bubble's virtual time
		q := New()
		a, b := q.Register("k"), q.Register("k")
		q.Notified([]string{"k"})
		if r := a.Wait(t.Context(), clk, time.Second, clk.Now().Add(time.Minute)); r != Remote {
			t.Errorf("Wait after Notified = %v, want Remote", r)
		}
		a.Rearm()
		q.Freed([]string{"k"})
		if r := a.Wait(t.Context(), clk, time.Second, clk.Now().Add(time.Minute)); r != Freed {
			t.Errorf("Wait after Freed = %v, want Freed", r)
		}
		_ = b
	})
}
