package revocation_test

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/revocation/podevents"
)

// noPods is a PodView that knows no pod but this process's.
type noPods struct{}

func (noPods) WaitForSync(context.Context) bool { return true }
func (noPods) Confirm(context.Context, lease.PodRef) (liveness.Verdict, error) {
	return liveness.Verdict{Reason: liveness.ReasonNotFound}, nil
}

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
		d.Revoked(t.Context(), "idle", holders)
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
	ctx, cancel := context.WithCancel(t.Context())
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

// TestAgentDecidesNothingDestructiveForOtherPods: the agent (liveness.SelfOnly) cannot know
// whether another pod is alive; a session-bound holder of another pod is only released, its
// handler does not run on a guess (it might end a live pod's session).
func TestAgentDecidesNothingDestructiveForOtherPods(t *testing.T) {
	// In a synctest bubble: synctest.Wait returns once the dispatch is complete.
	synctest.Test(t, func(t *testing.T) {
		self := lease.PodRef{Namespace: "ns", Name: "agent-pod", UID: "u"}
		reg := prometheus.NewRegistry()
		ran := make(chan revocation.Revocation, 1)
		registry := revocation.NewRegistry()
		if err := registry.Register("mcp", revocation.HandlerFunc(func(_ context.Context, r revocation.Revocation) error {
			ran <- r
			return nil
		})); err != nil {
			t.Fatal(err)
		}
		d := revocation.NewDispatcher(liveness.SelfOnly{Self: self}, self, registry,
			revocation.WithMetrics(metrics.New(nil)), revocation.WithRegisterer(reg))
		ctx, cancel := context.WithCancel(t.Context())
		stopped := make(chan struct{})
		go func() {
			defer close(stopped)
			_ = d.Start(ctx)
		}()
		other := lease.PodRef{Namespace: "ns", Name: "brain-0", UID: "b"}
		d.Revoked(ctx, "idle", []lease.Holder{{Token: "t1", Type: "mcp", Resource: "browser", Pod: other,
			Payload: map[string]string{"endpoint": "http://mcp/", "sessionId": "s"}}})
		want := `
# HELP vance_lease_revocation_dispatch_total Revoked holders dispatched, by matrix action and outcome (ok, error).
# TYPE vance_lease_revocation_dispatch_total counter
vance_lease_revocation_dispatch_total{action="release-only",outcome="ok"} 1
`
		synctest.Wait() // the workers dispatched the holder and wait for the next one
		if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want), "vance_lease_revocation_dispatch_total"); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-ran:
			t.Errorf("handler ran at %s for a pod whose liveness is unknown", r.Site)
		default:
		}
		cancel()
		<-stopped
	})
}

// recordingRegistry has one handler for type "tex" that records the tokens it ran for;
// block, when not nil, holds every call until it is closed or the call's context ends.
func recordingRegistry(t *testing.T, block chan struct{}) (*revocation.Registry, func() []string) {
	t.Helper()
	var mu sync.Mutex
	var ran []string
	reg := revocation.NewRegistry()
	if err := reg.Register("tex", revocation.HandlerFunc(func(ctx context.Context, r revocation.Revocation) error {
		if block != nil {
			select {
			case <-block:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		mu.Lock()
		defer mu.Unlock()
		ran = append(ran, r.Token)
		return nil
	})); err != nil {
		t.Fatal(err)
	}
	return reg, func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), ran...)
	}
}

// TestDispatcherDrainsOnShutdown: holders queued when the manager is told to stop (SIGTERM
// cancels the context) are still dispatched before Start returns.
func TestDispatcherDrainsOnShutdown(t *testing.T) {
	self := lease.PodRef{Namespace: "ns", Name: "manager-0", UID: "u"}
	reg, ran := recordingRegistry(t, nil)
	d := revocation.NewDispatcher(noPods{}, self, reg, revocation.WithMetrics(metrics.New(nil)))
	var want []string
	for i := range 50 {
		tok := fmt.Sprintf("t%02d", i)
		want = append(want, tok)
		d.Revoked(t.Context(), "pod", []lease.Holder{{Token: tok, Type: "tex", Pod: self, PodBound: true}})
	}
	ctx, cancel := context.WithCancel(t.Context())
	cancel() // the signal arrived
	if err := d.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, ran(), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("dispatched before Start returned (-queued +dispatched):\n%s", diff)
	}
}

// TestDispatcherDrainIsBounded: a drain that does not finish within its timeout gives up,
// so that the process ends within its termination grace period.
func TestDispatcherDrainIsBounded(t *testing.T) {
	self := lease.PodRef{Namespace: "ns", Name: "manager-0", UID: "u"}
	reg, ran := recordingRegistry(t, make(chan struct{})) // never released
	d := revocation.NewDispatcher(noPods{}, self, reg, revocation.WithMetrics(metrics.New(nil)),
		revocation.WithDrainTimeout(50*time.Millisecond))
	d.Revoked(t.Context(), "pod", []lease.Holder{{Token: "stuck", Type: "tex", Pod: self, PodBound: true}})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if err := d.Start(ctx); err != nil { // returns: the drain gave up on the stuck handler
		t.Fatal(err)
	}
	if got := ran(); len(got) != 0 {
		t.Errorf("the stuck handler completed: %v", got)
	}
}

// TestReclaimedHolderIsDispatchedWithItsEvent: a holder revoked by a borrowing reclaim goes
// through the matrix like any revocation (its handler runs: here it notifies the holder in this
// pod), is counted as reap{reason="reclaim"}, and its Event says who reclaimed what.
func TestReclaimedHolderIsDispatchedWithItsEvent(t *testing.T) {
	self := lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u"}
	hub := notify.NewHub(time.Minute, clock.RealClock{})
	recorder := events.NewFakeRecorder(4)
	m := metrics.New(prometheus.NewRegistry())
	d := revocation.NewDispatcher(noPods{}, self, handlers.NewDefaultRegistry(hub, nil, nil),
		revocation.WithMetrics(m), revocation.WithRecorder(podevents.New(recorder)))
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = d.Start(ctx) }()
	d.Revoked(ctx, metrics.ReapReclaim, []lease.Holder{{Token: "t1", ID: lease.HolderID("t1"), Type: "tex", Resource: "pdf",
		Tenant: "acme", Pod: self, PodBound: true, Borrowed: true, ReclaimedFor: "globex waiter lh-0123456789abcdef01234567"}})
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if ev, ok := hub.Wait(wctx, "t1"); !ok || ev.Reason != metrics.ReapReclaim {
		t.Fatalf("the holder's notification %+v, %v; want reason reclaim", ev, ok)
	}
	select {
	case e := <-recorder.Events:
		want := "revoked (reclaim): borrowed above tenant acme's cap, reclaimed for globex waiter lh-0123456789abcdef01234567; handler ran in this pod"
		if !strings.HasPrefix(e, "Normal "+revocation.EventReasonRevoked+" ") || !strings.HasSuffix(e, want) {
			t.Errorf("Event %q, want a Normal %s ending in %q", e, revocation.EventReasonRevoked, want)
		}
	case <-wctx.Done():
		t.Fatal("no Event recorded")
	}
	if got := promtestutil.ToFloat64(m.Reap.WithLabelValues(metrics.ReapReclaim)); got != 1 {
		t.Errorf("reap{reason=reclaim} = %v, want 1", got)
	}
}
