package leasing_test

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// slotMeter integrates a count of held slots over time: the time-weighted mean and the peak
// since the last mark.
type slotMeter struct {
	mu         sync.Mutex
	n, peak    int
	last, from time.Time
	area       time.Duration // slot-time held since from
}

func newSlotMeter() *slotMeter {
	now := time.Now()
	return &slotMeter{last: now, from: now}
}

func (m *slotMeter) add(d int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	m.area += time.Duration(m.n) * now.Sub(m.last)
	m.last, m.n = now, m.n+d
	m.peak = max(m.peak, m.n)
}

// mark returns the mean held slots and the peak since the previous mark (or the start), and
// starts a new window.
func (m *slotMeter) mark() (mean float64, peak int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	m.area += time.Duration(m.n) * now.Sub(m.last)
	mean, peak = float64(m.area)/float64(now.Sub(m.from)), m.peak
	m.area, m.last, m.from, m.peak = 0, now, now, m.n
	return mean, peak
}

// BenchmarkBorrowing is the measurement of issue 21 (docs/borrowing.md, "Figures"), through
// the HTTP API of one process: three tenants, tenant cap 2, global cap 6, waits of 30 s.
//
// Phase 1 (4 s): acme's 12 holders loop acquire → hold → release while globex and initech
// are quiet; the figures are the slot utilisation (the time-weighted mean of the slots acme's
// holders hold, as their answers show, over 6) and the peak. Phase 2: globex and initech each
// start 2 holders that acquire and hold to the end while acme goes on; the figure is the time
// from their start until both hold 2 each, and how many of acme's holders were reclaimed
// (their release answers already-released).
//
// Borrowing is off, or on with a grace of 1 s. acme's holds are 200–400 ms, or 2.5–3.5 s: with
// short holds acme's releases hand the global slots to the returning tenants' waiters before
// the grace ends; with long ones the reclaim does.
func BenchmarkBorrowing(b *testing.B) {
	const (
		tenantCap, globalCap, acmeHolders = 2, 6, 12
		burst                             = 4 * time.Second
		waitMs                            = 30000
		fairBy                            = 15 * time.Second // the returning tenants' wait
	)
	for _, tc := range []struct {
		borrow     bool
		hold, jitt time.Duration
	}{
		{false, 200 * time.Millisecond, 200 * time.Millisecond},
		{true, 200 * time.Millisecond, 200 * time.Millisecond},
		{false, 2500 * time.Millisecond, time.Second},
		{true, 2500 * time.Millisecond, time.Second},
	} {
		name := fmt.Sprintf("borrowing=%t/hold=%v-%v", tc.borrow, tc.hold, tc.hold+tc.jitt)
		b.Run(name, func(b *testing.B) {
			ps := startBenchProcesses(b, 1, definition.FairProcess, &storeCmds{},
				leaseDef{name: "burst", tenant: tenantCap, global: globalCap, ttlSeconds: 60, waitMs: waitMs,
					borrowing: tc.borrow, graceSeconds: 1})
			base := ps[0].srv.URL
			stop := make(chan struct{})
			var reclaimed atomic.Int64
			meter := newSlotMeter()
			b.ResetTimer()

			var wg sync.WaitGroup
			for h := range acmeHolders {
				wg.Go(func() {
					rng := rand.New(rand.NewPCG(uint64(h), 21))
					for {
						select {
						case <-stop:
							return
						default:
						}
						tok, code, err := acquireHTTPAs(base, "burst", "acme", fmt.Sprintf("a%d", h), waitMs)
						if err != nil || tok == "" {
							b.Errorf("acme acquire: %d %v", code, err)
							return
						}
						meter.add(1)
						hold := tc.hold + time.Duration(rng.Int64N(int64(tc.jitt)))
						// real time: benchmark workload, the holder's hold (cut short at the end)
						select {
						case <-time.After(hold):
						case <-stop:
						}
						meter.add(-1)
						outcome, err := releaseOutcomeHTTP(base, tok)
						if err != nil {
							b.Error(err)
							return
						}
						if outcome == leasing.ReleaseAlreadyReleased {
							reclaimed.Add(1) // nothing else revokes here: the TTL is 60 s
						}
					}
				})
			}
			time.Sleep(burst) // real time: benchmark workload, the burst's length
			utilisation, peak := meter.mark()

			// Phase 2: the quiet tenants return.
			returned := time.Now()
			got := make(chan time.Duration, 4)
			var toks []string
			var mu sync.Mutex
			for i := range 4 {
				tenant := []string{"globex", "initech"}[i%2]
				wg.Go(func() {
					tok, code, err := acquireHTTPAs(base, "burst", tenant, fmt.Sprintf("r%d", i), fairBy.Milliseconds())
					if err != nil || tok == "" {
						b.Errorf("%s acquire: %d %v", tenant, code, err)
						got <- fairBy
						return
					}
					mu.Lock()
					toks = append(toks, tok)
					mu.Unlock()
					got <- time.Since(returned)
				})
			}
			var fair time.Duration
			for range 4 {
				fair = max(fair, <-got) // both tenants hold 2 each once the last of the four is in
			}
			b.StopTimer()
			close(stop)
			for _, tok := range toks {
				if err := releaseHTTP(base, tok); err != nil {
					b.Error(err)
				}
			}
			wg.Wait()
			if fair >= fairBy {
				b.Fatalf("the returning tenants did not hold 2 each within %v", fairBy)
			}
			b.ReportMetric(utilisation/globalCap, "utilisation")
			b.ReportMetric(float64(peak), "peak-slots")
			b.ReportMetric(ms(fair), "time-to-fair-share-ms")
			b.ReportMetric(float64(reclaimed.Load()), "reclaims")
		})
	}
}
