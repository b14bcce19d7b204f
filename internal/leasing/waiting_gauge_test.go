package leasing_test

import (
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/vancetope/lease-operator/internal/lease"
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

// TestWaitHistograms: the wait is observed per resource and outcome, and the share of the
// allowed wait it used: an acquisition refused at its deadline used all of it, an immediate
// grant almost none (docs/observability.md).
func TestWaitHistograms(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", project: 1, ttlSeconds: 60, waitMs: 10000}}, envOpts{})
	mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	r := req("tex", "acme", "p", "other")
	r.Wait = waitFor(200 * time.Millisecond)
	if _, err := acquire(ctxT(t), e.svc, r); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire of a full level: %v, want busy", err)
	}
	histogram := func(o prometheus.Observer) *dto.Histogram {
		t.Helper()
		var m dto.Metric
		if err := o.(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram()
	}
	busy := histogram(e.metrics.AcquireWait.WithLabelValues("tex2pdf", "busy"))
	if busy.GetSampleCount() != 1 || busy.GetSampleSum() < 0.2 {
		t.Errorf("wait{busy}: %d samples, sum %vs; want one of at least 0.2s", busy.GetSampleCount(), busy.GetSampleSum())
	}
	if ok := histogram(e.metrics.AcquireWait.WithLabelValues("tex2pdf", "success")); ok.GetSampleCount() != 1 || ok.GetSampleSum() > 0.2 {
		t.Errorf("wait{success}: %d samples, sum %vs; want the one immediate grant", ok.GetSampleCount(), ok.GetSampleSum())
	}
	share := histogram(e.metrics.AcquireWaitShare.WithLabelValues("tex2pdf"))
	below := map[float64]uint64{}
	for _, b := range share.GetBucket() {
		below[b.GetUpperBound()] = b.GetCumulativeCount()
	}
	// Two acquisitions: the grant used almost none of its 10 s, the refusal all of its 200 ms.
	if share.GetSampleCount() != 2 || below[0.1] != 1 || below[0.95] != 1 {
		t.Errorf("wait share: %d samples, buckets %v; want one below 0.1 and one above 0.95", share.GetSampleCount(), below)
	}
}
