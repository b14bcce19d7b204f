package notify_test

import (
	"context"
	"testing"
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
			clk := clocktesting.NewFakePassiveClock(start)
			hub := notify.NewHub(time.Minute, clk)
			if tc.publishFirst {
				hub.Publish(ev)
				clk.SetTime(start.Add(tc.advance))
				hub.Publish(notify.Event{Token: "other"}) // publishing collects old events
			} else {
				go func() {
					time.Sleep(20 * time.Millisecond)
					hub.Publish(ev)
				}()
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if !tc.wantOK {
				cancel()
			}
			defer cancel()
			got, ok := hub.Wait(ctx, "t1")
			if ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
			if !ok {
				return
			}
			want := ev
			want.At = start
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHubWaitEndsWithContext(t *testing.T) {
	hub := notify.NewHub(time.Minute, clocktesting.NewFakePassiveClock(time.Now()))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
	defer cancel()
	if _, ok := hub.Wait(ctx, "nobody"); ok {
		t.Fatal("Wait returned an event nobody published")
	}
	// The cancelled waiter is gone: a later publish for that token reaches a new waiter only.
	hub.Publish(notify.Event{Token: "nobody", Reason: "idle"})
	got, ok := hub.Wait(context.Background(), "nobody")
	if !ok || got.Reason != "idle" {
		t.Errorf("Wait after publish = %+v, %v", got, ok)
	}
}
