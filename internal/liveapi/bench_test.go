package liveapi_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
