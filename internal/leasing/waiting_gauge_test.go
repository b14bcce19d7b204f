package leasing_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
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
		_, err := acquire(ctxT(t), e.svc, req("tex", "acme", "p", "other"))
		done <- err
	}()
	waitfor.Until(t, "the gauge counts the waiting acquisition", func() bool { return waiting() == 1 })
	if _, err := e.svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatal(err)
	}
	if err := waitfor.Receive(t, done, "the waiting acquisition"); err != nil {
		t.Fatalf("waiting acquire: %v", err)
	}
	if got := waiting(); got != 0 {
		t.Errorf("waiting after the outcome = %v, want 0", got)
	}
}
