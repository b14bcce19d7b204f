package leasing

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// cmdCount counts one store's round trips, split into reads and writes.
type cmdCount struct{ reads, writes atomic.Int64 }

func (c *cmdCount) observe(cmd string) {
	switch cmd {
	case "update", "findAndModify", "insert", "delete":
		c.writes.Add(1)
	default:
		c.reads.Add(1)
	}
}

func (c *cmdCount) total() int64 { return c.reads.Load() + c.writes.Load() }

// countingStore counts the calls of one client (pod) and the round trips each kind costs.
// One client calls it sequentially, so the command deltas around a call are exact. first
// is set before each acquisition: the first write attempt of an acquisition is counted
// apart from the attempts made while waiting (polls).
type countingStore struct {
	Store
	cmds            *cmdCount
	first           bool
	firstAttempts   int64
	firstWrites     int64
	polls           int64 // probes, or write attempts after the first without probe
	pollReads       int64
	pollWrites      int64
	pollAttempts    int64
	sweeps, sweepRT int64
}

func (c *countingStore) Resume(ctx context.Context, req leasestore.AcquireRequest, granted string, look bool) (lease.Holder, error) {
	r, w := c.cmds.reads.Load(), c.cmds.writes.Load()
	h, err := c.Store.Resume(ctx, req, granted, look)
	c.polls++
	c.pollReads += c.cmds.reads.Load() - r
	c.pollWrites += c.cmds.writes.Load() - w
	return h, err
}

func (c *countingStore) Acquire(ctx context.Context, req leasestore.AcquireRequest) (lease.Holder, error) {
	r, w := c.cmds.reads.Load(), c.cmds.writes.Load()
	h, err := c.Store.Acquire(ctx, req)
	dr, dw := c.cmds.reads.Load()-r, c.cmds.writes.Load()-w
	switch {
	case c.first:
		c.first = false
		c.firstAttempts++
		c.firstWrites += dw
	default:
		c.pollAttempts++
		c.pollReads += dr
		c.pollWrites += dw
	}
	return h, err
}

func (c *countingStore) SweepIdle(ctx context.Context, resource string) (leasestore.IdleSweep, error) {
	n := c.cmds.total()
	sw, err := c.Store.SweepIdle(ctx, resource)
	c.sweeps++
	c.sweepRT += c.cmds.total() - n
	return sw, err
}

// fixedResolver resolves every reference to one definition.
type fixedResolver struct{ def definition.Definition }

func (f fixedResolver) Resolve(context.Context, string, string, string) (definition.Definition, error) {
	return f.def, nil
}

func (f fixedResolver) ResolveInline(string, string, definition.InlineSpec) (definition.Definition, error) {
	return definition.Definition{}, errors.New("not used")
}

// BenchmarkContendedWaiting runs N clients (each its own store connection and service, as
// separate pods would) against one resource with global cap k. Every client loops: acquire
// with waiting, hold the lease (short: slots turn over about as fast as the store answers;
// long: most polls find the level full), release. b.N counts successful acquisitions. It
// reports, per successful acquisition, the waiting polls, the write attempts and the store
// round trips (reads and writes) spent inside Acquire, and the round trips of one poll (a
// waiter's Resume: after a hand-over, or at its safety look).
func BenchmarkContendedWaiting(b *testing.B) {
	uri, err := mongotest.URI()
	if err != nil {
		b.Fatal(err)
	}
	for _, tc := range []struct {
		clients, capacity int
		hold              time.Duration
	}{
		{8, 2, 20 * time.Millisecond}, {8, 2, 200 * time.Millisecond}, {16, 4, 200 * time.Millisecond},
	} {
		name := fmt.Sprintf("clients=%d/cap=%d/hold=%v", tc.clients, tc.capacity, tc.hold)
		b.Run(name, func(b *testing.B) {
			db := mongotest.DatabaseName(b)
			def := definition.Definition{Name: "hot", Resource: "hot", Caps: definition.Caps{Global: tc.capacity},
				TTL: time.Minute, Wait: time.Minute}
			clients := make([]*countingStore, tc.clients)
			svcs := make([]*Service, tc.clients)
			for i := range clients {
				cc := &cmdCount{}
				s, err := leasestore.Connect(uri, db, leasestore.WithCommandObserver(cc.observe))
				if err != nil {
					b.Fatal(err)
				}
				b.Cleanup(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
					defer cancel()
					if i == 0 {
						_ = s.Drop(ctx)
					}
					_ = s.Close(ctx)
				})
				if i == 0 {
					if err := s.EnsureIndexes(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
				clients[i] = &countingStore{Store: s, cmds: cc}
				svcs[i] = NewService(clients[i], fixedResolver{def}, NewStaticTypes("tex"), nil, nil, nil,
					WithSafetyTimer(50*time.Millisecond))
			}
			var acquireRT, acquireReads, acquireWrites, okN atomic.Int64
			var remaining atomic.Int64
			remaining.Store(int64(b.N))
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			for i, svc := range svcs {
				wg.Go(func() {
					cc := clients[i].cmds
					r := Request{Type: "tex", Lease: "hot", Tenant: "acme", Project: "p", User: fmt.Sprintf("u%d", i)}
					for remaining.Add(-1) >= 0 {
						clients[i].first = true
						n, rd, wr := cc.total(), cc.reads.Load(), cc.writes.Load()
						l, err := svc.Acquire(context.Background(), r)
						if err != nil {
							b.Error(err)
							return
						}
						acquireRT.Add(cc.total() - n)
						acquireReads.Add(cc.reads.Load() - rd)
						acquireWrites.Add(cc.writes.Load() - wr)
						okN.Add(1)
						time.Sleep(tc.hold) // real time: benchmark workload, the holder's hold
						if _, err := svc.Release(context.Background(), l.Token); err != nil {
							b.Error(err)
							return
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			var c countingStore
			for _, cl := range clients {
				c.firstAttempts += cl.firstAttempts
				c.firstWrites += cl.firstWrites
				c.polls += cl.polls
				c.pollReads += cl.pollReads
				c.pollWrites += cl.pollWrites
				c.pollAttempts += cl.pollAttempts
				c.sweeps += cl.sweeps
				c.sweepRT += cl.sweepRT
			}
			ok := float64(okN.Load())
			if ok == 0 {
				return
			}
			polls := c.polls
			b.ReportMetric(ok/elapsed.Seconds(), "acquires/s")
			b.ReportMetric(float64(acquireRT.Load())/ok, "rt/acquire")
			b.ReportMetric(float64(acquireReads.Load())/ok, "reads/acquire")
			b.ReportMetric(float64(acquireWrites.Load())/ok, "writes/acquire")
			b.ReportMetric(float64(c.firstWrites)/ok, "first-attempt-writes/acquire")
			b.ReportMetric(float64(polls)/ok, "polls/acquire")
			b.ReportMetric(float64(c.sweepRT)/ok, "sweep-rt/acquire")
			if polls > 0 {
				b.ReportMetric(float64(c.pollReads)/float64(polls), "reads/poll")
				b.ReportMetric(float64(c.pollWrites)/float64(polls), "writes/poll")
				b.ReportMetric(float64(c.pollReads+c.pollWrites)/float64(polls), "rt/poll")
			}
		})
	}
}
