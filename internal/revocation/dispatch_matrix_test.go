package revocation_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/revocation"
)

// fixedPods answers every Confirm with one verdict, or with an error (liveness unknown).
type fixedPods struct {
	verdict liveness.Verdict
	err     error
}

func (fixedPods) WaitForSync(context.Context) bool { return true }
func (p fixedPods) Confirm(context.Context, lease.PodRef) (liveness.Verdict, error) {
	return p.verdict, p.err
}

// calls records what the dispatcher did: forwards (to an IP) and handler runs (at a site).
type calls struct {
	mu         sync.Mutex
	forwardErr error
	forwarded  []string
	ran        []revocation.Site
}

func (c *calls) Forward(_ context.Context, ip string, _ revocation.Revocation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.forwarded = append(c.forwarded, ip)
	return c.forwardErr
}

func (c *calls) OnRevoked(_ context.Context, r revocation.Revocation) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ran = append(c.ran, r.Site)
	return nil
}

// TestDispatchFollowsTheMatrix drives the dispatcher (not only Decide) with each row of the
// dispatch matrix for a holder of another pod, the pod's liveness coming from the pod view:
// the input the dispatcher builds from the holder and the verdict must select the row. In a
// synctest bubble, synctest.Wait returns once the workers are idle again, so what they did
// is complete when the test looks.
func TestDispatchFollowsTheMatrix(t *testing.T) {
	self := lease.PodRef{Namespace: "ns", Name: "manager-0", UID: "m"}
	other := lease.PodRef{Namespace: "ns", Name: "app-0", UID: "a"}
	alive := liveness.Verdict{Alive: true, Reason: liveness.ReasonRunning, IP: "10.0.0.7"}
	dead := liveness.Verdict{Reason: liveness.ReasonNotFound}
	for name, tc := range map[string]struct {
		pods       fixedPods
		podBound   bool
		forwardErr error
		wantAction revocation.Action
		wantFwd    []string
		wantRan    []revocation.Site
	}{
		"dead pod, pod-bound holder: release only, nothing runs": {
			pods: fixedPods{verdict: dead}, podBound: true, wantAction: revocation.ActionReleaseOnly},
		"dead pod, resource elsewhere: handler on the reaper": {
			pods: fixedPods{verdict: dead}, wantAction: revocation.ActionReaper, wantRan: []revocation.Site{revocation.SiteReaper}},
		"liveness unknown, pod-bound: release only": {
			pods: fixedPods{err: errors.New("apiserver down")}, podBound: true, wantAction: revocation.ActionReleaseOnly},
		"liveness unknown, resource elsewhere: nothing destructive": {
			pods: fixedPods{err: errors.New("apiserver down")}, wantAction: revocation.ActionReleaseOnly},
		"alive elsewhere: forwarded, nothing runs here": {
			pods: fixedPods{verdict: alive}, podBound: true, wantAction: revocation.ActionForward, wantFwd: []string{"10.0.0.7"}},
		"alive, forward fails, pod-bound: as dead, release only": {
			pods: fixedPods{verdict: alive}, podBound: true, forwardErr: errors.New("connection refused"),
			wantAction: revocation.ActionReleaseOnly, wantFwd: []string{"10.0.0.7"}},
		"alive, forward fails, resource elsewhere: as dead, handler on the reaper": {
			pods: fixedPods{verdict: alive}, forwardErr: errors.New("connection refused"),
			wantAction: revocation.ActionReaper, wantFwd: []string{"10.0.0.7"}, wantRan: []revocation.Site{revocation.SiteReaper}},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				c := &calls{forwardErr: tc.forwardErr}
				handlers := revocation.NewRegistry()
				if err := handlers.Register("tex", c); err != nil {
					t.Fatal(err)
				}
				reg := prometheus.NewRegistry()
				d := revocation.NewDispatcher(tc.pods, self, handlers, revocation.WithForwarder(c),
					revocation.WithMetrics(metrics.New(nil)), revocation.WithRegisterer(reg))
				ctx, cancel := context.WithCancel(t.Context())
				stopped := make(chan struct{})
				go func() {
					defer close(stopped)
					_ = d.Start(ctx)
				}()
				d.Revoked(ctx, "pod", []lease.Holder{{Token: "t1", Type: "tex", Resource: "tex2pdf", Pod: other, PodBound: tc.podBound}})
				synctest.Wait() // the workers dispatched the holder and wait for the next one

				c.mu.Lock()
				if diff := cmp.Diff(tc.wantFwd, c.forwarded); diff != "" {
					t.Errorf("forwards (-want +got):\n%s", diff)
				}
				if diff := cmp.Diff(tc.wantRan, c.ran); diff != "" {
					t.Errorf("handler runs (-want +got):\n%s", diff)
				}
				c.mu.Unlock()
				if got := dispatchedOK(t, reg, tc.wantAction); got != 1 {
					t.Errorf("dispatch{action=%s,outcome=ok} = %v, want 1", tc.wantAction, got)
				}
				cancel()
				<-stopped
			})
		})
	}
}

// dispatchedOK is the value of the dispatch counter of action with outcome ok.
func dispatchedOK(t *testing.T, reg *prometheus.Registry, action revocation.Action) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "vance_lease_revocation_dispatch_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == string(action) && labels["outcome"] == "ok" {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
