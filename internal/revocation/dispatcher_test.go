package revocation_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
)

// noPods is a PodView that knows no pod but this process's.
type noPods struct{}

func (noPods) WaitForSync(context.Context) bool     { return true }
func (noPods) Alive(lease.PodRef) bool              { return false }
func (noPods) Endpoint(lease.PodRef) (string, bool) { return "", false }

// TestRevokedNeverBlocks fills the queue of a dispatcher whose workers do not run: the
// caller returns at once, every reap is counted, the overflow is dropped and counted.
func TestRevokedNeverBlocks(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	d := revocation.NewDispatcher(noPods{}, lease.PodRef{}, handlers.NewDefaultRegistry(nil, nil, nil),
		revocation.WithMetrics(m), revocation.WithRegisterer(reg), revocation.WithQueueSize(2))
	holders := make([]lease.Holder, 5)
	for i := range holders {
		holders[i] = lease.Holder{Token: string(rune('a' + i)), Type: "tex", PodBound: true}
	}
	done := make(chan struct{})
	go func() {
		d.Revoked(context.Background(), "idle", holders)
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Revoked blocked on a full queue")
	}
	if got := promtestutil.ToFloat64(m.Reap.WithLabelValues("idle")); got != 5 {
		t.Errorf("reap{idle} = %v, want 5", got)
	}
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(`
# HELP vance_lease_revocation_dropped_total Revoked holders not dispatched because the dispatcher's queue was full.
# TYPE vance_lease_revocation_dropped_total counter
vance_lease_revocation_dropped_total 3
`), "vance_lease_revocation_dropped_total"); err != nil {
		t.Error(err)
	}
}

// TestDispatchSelfWithoutPodView: the holder pod is this process's pod; the handler runs
// here even though the pod view knows no pod at all.
func TestDispatchSelfWithoutPodView(t *testing.T) {
	self := lease.PodRef{Namespace: "ns", Name: "agent-pod", UID: "u"}
	hub := notify.NewHub(time.Minute, clock.RealClock{})
	d := revocation.NewDispatcher(noPods{}, self, handlers.NewDefaultRegistry(hub, nil, nil),
		revocation.WithMetrics(metrics.New(nil)))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { _ = d.Start(ctx) }()
	d.Revoked(ctx, "pod", []lease.Holder{{Token: "t1", Type: "tex", Resource: "tex2pdf", Pod: self, PodBound: true}})
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	ev, ok := hub.Wait(wctx, "t1")
	if !ok || ev.Reason != "pod" {
		t.Fatalf("event %+v, %v", ev, ok)
	}
}
