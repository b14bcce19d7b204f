package notify_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/notify"
)

func TestHub(t *testing.T) {
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	ev := notify.Event{Token: "t1", Reason: "revoke", Type: "tex", Resource: "tex2pdf"}
	cases := map[string]struct {
		publishFirst bool
		advance      time.Duration
		wantOK       bool
	}{
		"waiter woken by a later publish":       {publishFirst: false, wantOK: true},
		"late waiter still sees the event":      {publishFirst: true, wantOK: true},
		"event forgotten after the keep period": {publishFirst: true, advance: 2 * time.Minute, wantOK: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			// In a synctest bubble: the waiter is known to be waiting (synctest.Wait) before
			// the later publish, and the context's timeout is virtual time.
			synctest.Test(t, func(t *testing.T) {
				clk := clocktesting.NewFakePassiveClock(start)
				hub := notify.NewHub(time.Minute, clk)
				if tc.publishFirst {
					hub.Publish(ev)
					clk.SetTime(start.Add(tc.advance))
					hub.Publish(notify.Event{Token: "other"}) // publishing collects old events
				}
				ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
				if !tc.wantOK {
					cancel()
				}
				defer cancel()
				type result struct {
					ev notify.Event
					ok bool
				}
				done := make(chan result, 1)
				go func() {
					ev, ok := hub.Wait(ctx, "t1")
					done <- result{ev, ok}
				}()
				if !tc.publishFirst {
					synctest.Wait()
					select {
					case r := <-done:
						t.Fatalf("Wait returned before the publish: %+v", r)
					default:
					}
					hub.Publish(ev)
				}
				r := <-done
				if r.ok != tc.wantOK {
					t.Fatalf("ok = %v, want %v", r.ok, tc.wantOK)
				}
				if !r.ok {
					return
				}
				want := ev
				want.At = start
				if diff := cmp.Diff(want, r.ev); diff != "" {
					t.Errorf("event (-want +got):\n%s", diff)
				}
			})
		})
	}
}

func TestHubWaitEndsWithContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		hub := notify.NewHub(time.Minute, clocktesting.NewFakePassiveClock(time.Now()))
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
		defer cancel()
		if _, ok := hub.Wait(ctx, "nobody"); ok {
			t.Fatal("Wait returned an event nobody published")
		}
		// The cancelled waiter is gone: a later publish for that token reaches a new waiter only.
		hub.Publish(notify.Event{Token: "nobody", Reason: "idle"})
		got, ok := hub.Wait(t.Context(), "nobody")
		if !ok || got.Reason != "idle" {
			t.Errorf("Wait after publish = %+v, %v", got, ok)
		}
	})
}

// TestHubBounded: events published faster than they expire (a flood of forwarded
// revocations) keep at most the configured number; the newest are kept, so a waiter on a
// recent revocation still hears of it.
func TestHubBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
		hub := notify.NewHub(time.Hour, clk, notify.WithMaxEvents(100))
		for i := range 1000 {
			hub.Publish(notify.Event{Token: fmt.Sprintf("tok-%d", i), Reason: "revoke"})
			clk.SetTime(clk.Now().Add(time.Millisecond))
		}
		if got := hub.Len(); got > 100 {
			t.Errorf("hub keeps %d events, want at most 100", got)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Millisecond)
		defer cancel()
		if _, ok := hub.Wait(ctx, "tok-999"); !ok {
			t.Error("the newest event was dropped")
		}
		if _, ok := hub.Wait(ctx, "tok-0"); ok {
			t.Error("the oldest event is still kept beyond the bound")
		}
		// Expired events go too, without a publish scanning all of them.
		clk.SetTime(clk.Now().Add(2 * time.Hour))
		hub.Publish(notify.Event{Token: "fresh"})
		if got := hub.Len(); got != 1 {
			t.Errorf("after expiry the hub keeps %d events, want 1", got)
		}
	})
}

// TestHubIsBoundedInBytes: large events are cut and the hub's bytes stay under its bound,
// whatever their count (issue 26: 1 500 events of 64 KB grew a manager by 150 MiB).
func TestHubIsBoundedInBytes(t *testing.T) {
	h := notify.NewHub(5*time.Minute, clocktesting.NewFakeClock(time.Now()), notify.WithMaxBytes(64<<10))
	big := strings.Repeat("r", 64<<10)
	for i := range 1500 {
		h.Publish(notify.Event{Token: fmt.Sprintf("tok-%d", i), Reason: "revoke", Type: "tex", Resource: big})
	}
	if got := h.Bytes(); got > 64<<10 {
		t.Errorf("hub keeps %d bytes in %d events, want at most %d", got, h.Len(), 64<<10)
	}
	if h.Len() == 0 {
		t.Fatal("hub keeps nothing")
	}
	ev, ok := h.Wait(t.Context(), "tok-1499")
	if !ok || len(ev.Resource) != notify.MaxFieldLen {
		t.Errorf("latest event kept = %v with a resource of %d bytes, want kept and cut to %d", ok, len(ev.Resource), notify.MaxFieldLen)
	}
}
