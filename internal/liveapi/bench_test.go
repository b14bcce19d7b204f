package liveapi_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// benchHolders is the size of the benchmarked namespace.
const benchHolders = 1000

// BenchmarkLiveAPI measures, through the real kube-apiserver and aggregation layer as a
// cluster operator, listing a namespace of 1000 holders in pages of 500, getting one holder
// by ID and listing the namespace's counters with their caps: latency per operation,
// store round trips and definition resolutions per operation.
func BenchmarkLiveAPI(b *testing.B) {
	first := ""
	for i := range benchHolders {
		h := acquire(b, "bench", "bench", "u"+string(rune('a'+i%26)))
		if i == 0 {
			first = h.ID
		}
	}
	c := client(b, operator).Resource(holders).Namespace(nsBench)
	b.Run("list-1000-pages-of-500", func(b *testing.B) {
		var items, pages int
		rt0 := storeCommands.Load()
		t0 := time.Now()
		for b.Loop() {
			opts := metav1.ListOptions{Limit: 500}
			for {
				list, err := c.List(ctxT(b), opts)
				if err != nil {
					b.Fatal(err)
				}
				items += len(list.Items)
				pages++
				if list.GetContinue() == "" {
					break
				}
				opts.Continue = list.GetContinue()
			}
		}
		b.ReportMetric(float64(storeCommands.Load()-rt0)/float64(b.N), "storeRT/list")
		b.ReportMetric(float64(pages)/float64(b.N), "pages/list")
		b.ReportMetric(float64(time.Since(t0).Milliseconds())/float64(b.N), "ms/list")
		if items != benchHolders*b.N {
			b.Fatalf("listed %d holders in %d lists, want %d each", items, b.N, benchHolders)
		}
	})
	b.Run("get-by-token", func(b *testing.B) {
		rt0 := storeCommands.Load()
		for b.Loop() {
			if _, err := c.Get(ctxT(b), first, metav1.GetOptions{}); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(storeCommands.Load()-rt0)/float64(b.N), "storeRT/get")
	})
	// 28 counters (tenant, project, 26 users) booked by 1000 holders of one lease in one
	// project: one resolution per list, not one per holder or counter.
	b.Run("list-counters-with-caps", func(b *testing.B) {
		cc := client(b, operator).Resource(counters).Namespace(nsBench)
		rt0, res0 := storeCommands.Load(), resolutions.Load()
		for b.Loop() {
			list, err := cc.List(ctxT(b), metav1.ListOptions{})
			if err != nil {
				b.Fatal(err)
			}
			if len(list.Items) != 28 {
				b.Fatalf("listed %d counters, want 28", len(list.Items))
			}
		}
		b.ReportMetric(float64(storeCommands.Load()-rt0)/float64(b.N), "storeRT/list")
		b.ReportMetric(float64(resolutions.Load()-res0)/float64(b.N), "resolutions/list")
	})
}

// BenchmarkWatch measures watches through the real kube-apiserver and aggregation layer: with
// 1 and 1000 watchers of leaseholders, the latency from a grant's store write to each
// watcher's ADDED event (p50, p99 over every watcher and grant; the suite's feed reads every
// feedInterval, 50 ms, where the manager's default is 500 ms), the feed's store round trips
// per second while nothing changes (the same whatever the number of watchers) and the heap per
// watcher (client and server in this one process: an upper bound of the server's part).
func BenchmarkWatch(b *testing.B) {
	for _, n := range []int{1, 1000} {
		b.Run(fmt.Sprintf("watchers-%d", n), func(b *testing.B) { benchWatchers(b, n) })
	}
}

func benchWatchers(b *testing.B, n int) {
	res := fmt.Sprintf("kbench%d", n)
	cfg := rest.CopyConfig(operator)
	cfg.QPS, cfg.Burst = -1, 0 // no client-side rate limit: n watches open at once
	c := client(b, cfg).Resource(holders).Namespace(nsAcme)
	heap0 := heapInUse()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var mu sync.Mutex
	granted := map[string]time.Time{} // holder ID → when its grant was written
	var latencies []time.Duration
	var opened sync.WaitGroup
	for range n {
		opened.Add(1)
		go func() {
			w, err := c.Watch(ctx, metav1.ListOptions{LabelSelector: livev1alpha1.LabelResource + "=" + res, ResourceVersion: feed.RV()})
			opened.Done()
			if err != nil {
				b.Error(err)
				return
			}
			defer w.Stop()
			for e := range w.ResultChan() {
				if e.Type != watch.Added {
					continue
				}
				at := time.Now()
				id := e.Object.(*unstructured.Unstructured).GetName()
				mu.Lock()
				latencies = append(latencies, at.Sub(granted[id]))
				mu.Unlock()
			}
		}()
	}
	opened.Wait()
	for feedWatchers() < n {
		time.Sleep(10 * time.Millisecond) // real time: the watches reach the server
	}
	heapPerWatcher := float64(heapInUse()-heap0) / float64(n) / 1024
	rt0, t0 := feedCommands.Load(), time.Now()
	time.Sleep(2 * time.Second) // real time: the feed reads on its own
	feedRate := float64(feedCommands.Load()-rt0) / time.Since(t0).Seconds()

	grants := 0
	jitter := rand.New(rand.NewPCG(1, 2))
	for b.Loop() {
		// A grant at a random moment of the feed's cycle, not just after its last read.
		time.Sleep(time.Duration(jitter.Int64N(int64(2 * feedInterval)))) // real time: the feed runs on its own
		mu.Lock()
		h, err := store.Acquire(ctxT(b), leasestore.AcquireRequest{LeaseName: res, Resource: res, Tenant: "acme", Project: "p1", User: "u",
			Type: "tex", Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1 << 20}}, Pod: self, TTL: time.Hour})
		granted[lease.HolderID(h.Token)] = time.Now()
		mu.Unlock()
		if err != nil {
			b.Fatal(err)
		}
		grants++
		for deadline := time.Now().Add(10 * time.Second); ; {
			mu.Lock()
			got := len(latencies)
			mu.Unlock()
			if got >= grants*n {
				break
			}
			if time.Now().After(deadline) {
				b.Fatalf("%d of %d ADDED events in 10 s", got-(grants-1)*n, n)
			}
			time.Sleep(5 * time.Millisecond) // real time: the watchers are other goroutines
		}
		if _, err := store.Release(ctxT(b), h.Token); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(heapPerWatcher, "heap-KiB/watcher")
	b.ReportMetric(feedRate, "feedRT/s")
	slices.Sort(latencies)
	b.ReportMetric(float64(latencies[len(latencies)/2].Microseconds())/1000, "ms-p50")
	b.ReportMetric(float64(latencies[len(latencies)*99/100].Microseconds())/1000, "ms-p99")
}

func heapInUse() int64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return int64(m.HeapInuse)
}

func feedWatchers() int { return feed.Watchers() }
