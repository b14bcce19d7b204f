package leasestore_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// traffic counts an operation's round trips and the documents its replies carried.
type traffic struct{ trips, docs atomic.Int64 }

func (t *traffic) started(string)          { t.trips.Add(1) }
func (t *traffic) replied(_ string, n int) { t.docs.Add(int64(n)) }

// peakHeap samples the heap in use while it runs and returns the highest value, in MiB.
func peakHeap(stop <-chan struct{}) <-chan float64 {
	out := make(chan float64, 1)
	go func() {
		var peak uint64
		var ms runtime.MemStats
		for {
			runtime.ReadMemStats(&ms)
			peak = max(peak, ms.HeapInuse)
			select {
			case <-stop:
				out <- float64(peak) / (1 << 20)
				return
			case <-time.After(5 * time.Millisecond):
			}
		}
	}()
	return out
}

// BenchmarkScale measures how the store's operations grow with the holders: 1 000 and 10 000
// holders over 1 000 tenants (100 000 with LEASE_BENCH_100K=1; filling takes minutes on the
// development server). Per operation it reports store round trips, documents read (counted
// with the driver's command monitor; they carry over to MongoDB) and the peak heap in use.
// Acquire (with its release) must stay flat; the idle sweep, reconcile and the sweep's
// round linear, in batches; a gone pod that holds nothing costs one small query; the views of one
// tenant read that tenant's documents.
func BenchmarkScale(b *testing.B) {
	sizes := []int{1000, 10000}
	if os.Getenv("LEASE_BENCH_100K") != "" {
		sizes = append(sizes, 100000)
	}
	uri, err := mongotest.URI()
	if err != nil {
		b.Fatal(err)
	}
	for _, n := range sizes {
		db := mongotest.DatabaseName(b)
		tr := &traffic{}
		s := newStoreAt(b, uri, db, leasestore.WithCommandObserver(tr.started), leasestore.WithReplyObserver(tr.replied))
		fillHolders(b, uri, db, n, 1000)
		ctx := context.Background()
		gone := make([]lease.PodRef, 100)
		for i := range gone {
			gone[i] = lease.PodRef{Namespace: "ns", Name: fmt.Sprintf("gone-%d", i)}
		}
		ops := []struct {
			name string
			run  func() error
		}{
			{"acquire+release", func() error {
				h, err := s.Acquire(ctx, request("r", "t0001", "p", "bench", allCaps(1<<20, 1<<20, 1<<20, 1<<20)))
				if err != nil {
					return err
				}
				_, err = s.Release(ctx, h.Token)
				return err
			}},
			{"idle-sweep", func() error { _, err := s.ReapIdle(ctx, ""); return err }},
			// The scheduled sweep's round (sweeper.Sweep without the pods' liveness): one
			// read of the holders for the idle reap, the pods and reconcile's bookings,
			// then the counters. (Before: idle-sweep, a scan of the pods and reconcile,
			// three reads of the holders.)
			{"sweep-round", func() error {
				r, err := s.SweepRound(ctx)
				if err == nil {
					_, err = s.ReconcileRound(ctx, r)
				}
				return err
			}},
			{"100-gone-pods", func() error { _, err := s.HolderPodsOf(ctx, gone); return err }},
			{"reconcile", func() error { _, err := s.Reconcile(ctx); return err }},
			// The operator's views of one tenant (10 holders at 10 000): what `kubectl lease
			// list --tenant` and `counters --tenant` ask of the store through the live API,
			// and (-before) what they asked before the tenant reached the store's filter:
			// every page of holders, every counter with every holder's bookings.
			{"view-list-tenant", func() error {
				_, _, err := s.ListHoldersPage(ctx, leasestore.HolderFilter{Tenant: "t0001"}, "", 500)
				return err
			}},
			{"view-list-tenant-before", func() error {
				after := ""
				for {
					_, next, err := s.ListHoldersPage(ctx, leasestore.HolderFilter{}, after, 500)
					if err != nil || next == "" {
						return err
					}
					after = next
				}
			}},
			{"view-counters-tenant", func() error {
				_, err := s.ListCounters(ctx, leasestore.CounterFilter{Tenant: "t0001"})
				return err
			}},
			{"view-counters-tenant-before", func() error { _, err := s.ListCounters(ctx, leasestore.CounterFilter{}); return err }},
		}
		for _, op := range ops {
			b.Run(fmt.Sprintf("%s/holders=%d", op.name, n), func(b *testing.B) {
				tr.trips.Store(0)
				tr.docs.Store(0)
				stop := make(chan struct{})
				peak := peakHeap(stop)
				var once sync.Once
				for b.Loop() {
					if err := op.run(); err != nil {
						b.Fatal(err)
					}
				}
				once.Do(func() { close(stop) })
				b.ReportMetric(float64(tr.trips.Load())/float64(b.N), "trips/op")
				b.ReportMetric(float64(tr.docs.Load())/float64(b.N), "docs/op")
				b.ReportMetric(<-peak, "peakHeapMiB")
			})
		}
		// Acquisitions (each then released) while the scheduled sweep's reads of every
		// holder run back to back, and without them: on the development store, which runs
		// one command at a time, each round trip of an acquisition may wait for the batch
		// being read (readBatch).
		for _, sweeping := range []bool{false, true} {
			b.Run(fmt.Sprintf("acquire-latency/sweeping=%t/holders=%d", sweeping, n), func(b *testing.B) {
				var lat []time.Duration
				for b.Loop() {
					lat = append(lat, acquireLatencies(b, s, sweeping, 40)...)
				}
				slices.Sort(lat)
				ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))].Microseconds()) / 1000 }
				b.ReportMetric(ms(0.5), "p50ms")
				b.ReportMetric(ms(0.99), "p99ms")
			})
		}
	}
}

// acquireLatencies times n acquisitions (each released), with the idle sweep and the pod
// scan running back to back meanwhile when sweeping.
func acquireLatencies(b *testing.B, s *leasestore.Store, sweeping bool, n int) []time.Duration {
	ctx := context.Background()
	stop, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		for sweeping {
			select {
			case <-stop:
				return
			default:
			}
			r, _ := s.SweepRound(ctx)
			_, _ = s.ReconcileRound(ctx, r)
		}
	}()
	defer func() { close(stop); <-done }()
	out := make([]time.Duration, 0, n)
	for range n {
		t0 := time.Now()
		h, err := s.Acquire(ctx, request("r", "t0002", "p", "bench", allCaps(1<<20, 1<<20, 1<<20, 1<<20)))
		if err != nil {
			b.Fatal(err)
		}
		out = append(out, time.Since(t0))
		if _, err := s.Release(ctx, h.Token); err != nil {
			b.Fatal(err)
		}
	}
	return out
}
