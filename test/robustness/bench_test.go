//go:build robustness

package robustness

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// BenchmarkPeerWorkloadDeployed is the peer workload of issue 18 on the deployed shape: 24
// holders loop acquire → hold 0–30 ms → release on one resource capped at 6 (waitMs 10 s)
// for 10 s, through HTTP, against the real manager alone ("processes=1") or against the
// manager and two real agents, holder i calling process i mod 3 ("processes=3"). The
// in-process figures are BenchmarkPeerWorkload in internal/leasing. Run it alone with
//
//	make mongodev && KUBEBUILDER_ASSETS="$(hack/envtest-bins.sh)" MONGODEV_BIN=$PWD/bin/mongodev \
//	  go test -tags robustness -run '^$' -bench PeerWorkloadDeployed -benchtime 1x ./test/robustness/
func BenchmarkPeerWorkloadDeployed(b *testing.B) {
	const holders, capacity, waitMs, run = 24, 6, 10000, 10 * time.Second
	assets := testenv.AssetsOrSkip(b)
	ctx := context.Background()
	c := startCluster(ctx, b, assets)
	for _, fairness := range []string{"process", "global"} {
		for _, n := range []int{1, 3} {
			b.Run(fmt.Sprintf("processes=%d/fairness=%s", n, fairness), func(b *testing.B) {
				rec := &recorder{origin: time.Now()}
				resource := fmt.Sprintf("peer-%s-%d-%d", fairness, n, time.Now().UnixNano()%100000)
				if err := c.define(ctx, resource, fairness, capacity, 60); err != nil {
					b.Fatal(err)
				}
				if err := waitDefined(ctx, c, rec, resource); err != nil {
					b.Fatal(err)
				}
				var (
					mu                sync.Mutex
					waits             []time.Duration
					held              time.Duration
					busy, unavailable int
					perHolder         = make([]int, holders)
				)
				b.ResetTimer()
				start := time.Now()
				end := start.Add(run)
				var wg sync.WaitGroup
				for h := range holders {
					p := h % n
					cl := newCaller(h, p, c.apiAddrs[p], callerIP, rec)
					wg.Go(func() {
						rng := rand.New(rand.NewPCG(uint64(h), 42))
						for time.Now().Before(end) {
							ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
							t0 := time.Now()
							a := cl.send(ctx, http.MethodPost, "/v1/leases", fmt.Appendf(nil,
								`{"type":"tex","lease":%q,"project":"p%d","waitMs":%d}`, resource, p, waitMs))
							wait := time.Since(t0)
							cancel()
							if a.Status != http.StatusOK || a.Token == "" {
								mu.Lock()
								if a.Status == http.StatusConflict {
									busy++
								} else {
									unavailable++
								}
								mu.Unlock()
								if a.Status != http.StatusConflict && a.Status != http.StatusServiceUnavailable {
									b.Errorf("acquire: %+v", a)
									return
								}
								continue
							}
							from := time.Now()
							time.Sleep(time.Duration(rng.Int64N(int64(30 * time.Millisecond)))) // real time: the holder's hold
							heldFor := time.Since(from)
							ctx, cancel = context.WithTimeout(context.Background(), 15*time.Second)
							r := cl.send(ctx, http.MethodDelete, "/v1/leases/"+a.Token, nil)
							cancel()
							if r.Status != http.StatusOK {
								b.Errorf("release: %+v", r)
								return
							}
							mu.Lock()
							waits = append(waits, wait)
							held += heldFor
							perHolder[h]++
							mu.Unlock()
						}
					})
				}
				wg.Wait()
				wall := time.Since(start)
				b.StopTimer()
				slices.Sort(waits)
				pct := func(q float64) float64 {
					if len(waits) == 0 {
						return 0
					}
					return float64(waits[int(q*float64(len(waits)-1))]) / float64(time.Millisecond)
				}
				b.ReportMetric(float64(len(waits))/wall.Seconds(), "acquires/s")
				b.ReportMetric(held.Seconds()/(capacity*wall.Seconds()), "utilization")
				b.ReportMetric(pct(0.5), "wait-p50-ms")
				b.ReportMetric(pct(0.99), "wait-p99-ms")
				lo, hi := slices.Min(perHolder), slices.Max(perHolder)
				b.ReportMetric(float64(lo), "per-holder-min")
				b.ReportMetric(float64(hi), "per-holder-max")
				if lo > 0 {
					b.ReportMetric(float64(hi)/float64(lo), "per-holder-spread")
				}
				b.ReportMetric(float64(busy), "busy")
				b.ReportMetric(float64(unavailable), "unavailable")
			})
		}
	}
}
