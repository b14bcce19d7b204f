package liveapi_test

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// benchHolders is the size of the benchmarked namespace.
const benchHolders = 1000

// BenchmarkLiveAPI measures, through the real kube-apiserver and aggregation layer as a
// cluster operator, listing a namespace of 1000 holders in pages of 500 and getting one
// holder by token: latency per operation and store round trips per operation.
func BenchmarkLiveAPI(b *testing.B) {
	first := ""
	for i := range benchHolders {
		h := acquire(b, "bench", "bench", "u"+string(rune('a'+i%26)))
		if i == 0 {
			first = h.Token
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
}
