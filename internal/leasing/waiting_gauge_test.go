package leasing_test

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestWaitingGauge: an acquisition waiting for a slot shows in vance_lease_acquire_waiting
// until its outcome (docs/observability.md).
func TestWaitingGauge(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", project: 1, ttlSeconds: 60, waitMs: 10000}}, envOpts{})
	held := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	waiting := func() float64 { return testutil.ToFloat64(e.metrics.Waiting.WithLabelValues("tex2pdf")) }
	if got := waiting(); got != 0 {
		t.Fatalf("waiting after an immediate acquisition = %v, want 0", got)
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.svc.Acquire(ctxT(t), req("tex", "acme", "p", "other"))
		done <- err
	}()
	deadline := time.Now().Add(10 * time.Second)
	for waiting() != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := waiting(); got != 1 {
		t.Fatalf("waiting while an acquisition waits = %v, want 1", got)
	}
	if _, err := e.svc.Release(context.Background(), held.Token); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting acquire: %v", err)
	}
	if got := waiting(); got != 0 {
		t.Errorf("waiting after the outcome = %v, want 0", got)
	}
}
