package sweeper

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// deadPods is a pod view in which every pod is dead; it counts the confirmations asked
// (each one is an API server read in the real watcher).
type deadPods struct {
	mu        sync.Mutex
	confirmed int
}

func (*deadPods) WaitForSync(context.Context) bool { return true }

func (d *deadPods) Confirm(context.Context, lease.PodRef) (liveness.Verdict, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.confirmed++
	return liveness.Verdict{Reason: liveness.ReasonNotFound}, nil
}

// TestGonePodsThatHoldNothingCostOneQuery: a burst of pod deletions (a node drain, a
// rollout) where most pods hold nothing costs one store query for the burst and no API server
// read for those pods; the pod that holds a lease is still reaped at once.
func TestGonePodsThatHoldNothingCostOneQuery(t *testing.T) {
	var finds atomic.Int64 // the store's find commands (one round trip each)
	store := storetest.New(t, leasestore.WithCommandObserver(func(cmd string) {
		if cmd == "find" {
			finds.Add(1)
		}
	}))
	ctx := context.Background()
	holder := lease.PodRef{Namespace: "ns", Name: "worker-7", UID: "uid-7"}
	h, err := store.Acquire(ctx, leasestore.AcquireRequest{
		Resource: "r", Type: "tex", Tenant: "acme", TTL: time.Hour, Pod: holder, PodBound: true,
		Caps: []lease.LevelCap{{Level: lease.LevelTenant, Cap: 5}},
	})
	if err != nil {
		t.Fatal(err)
	}
	pods := &deadPods{}
	s := New(store, pods, nil, WithMetrics(metrics.New(nil)))
	for i := range 50 {
		s.PodGone(lease.PodRef{Namespace: "ns", Name: fmt.Sprintf("idle-%d", i), UID: fmt.Sprintf("u-%d", i)})
	}
	s.PodGone(holder)
	finds.Store(0)

	s.reapGone(ctx)

	got := finds.Load()
	if _, err := store.GetHolder(ctx, h.Token); err == nil {
		t.Error("the gone pod's holder was not reaped")
	}
	if got != 2 { // one to find who holds anything, one inside the holder pod's reap
		t.Errorf("store finds for 51 gone pods, one holding a lease: %d, want 2", got)
	}
	if pods.confirmed != 1 {
		t.Errorf("liveness confirmations (API server reads) = %d, want 1, for the pod that holds a lease", pods.confirmed)
	}
}
