package leasestore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// roundTrips counts the commands a store sends (one per round trip): n on the callers' path,
// off those it sends with no caller waiting (the batched deletes of release marks).
type roundTrips struct{ n, off atomic.Int64 }

func (r *roundTrips) observe(string)        { r.n.Add(1) }
func (r *roundTrips) observeOffPath(string) { r.off.Add(1) }

func benchStore(b *testing.B, db string, rt *roundTrips) *leasestore.Store {
	b.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		b.Fatal(err)
	}
	opts := []leasestore.Option{}
	if rt != nil {
		opts = append(opts, leasestore.WithCommandObserver(rt.observe), leasestore.WithOffPathObserver(rt.observeOffPath))
	}
	return newStoreAt(b, uri, db, opts...)
}

// BenchmarkUncontended measures acquire, check and release at 1 to 4 levels, in store round
// trips per operation (targets: acquire <= 2L+2, release <= L+1) and time; offpath-rt is the
// round trips the store sent with no caller waiting, per release.
func BenchmarkUncontended(b *testing.B) {
	all := allCaps(1<<20, 1<<20, 1<<20, 1<<20)
	for levels := 1; levels <= 4; levels++ {
		caps := all[4-levels:] // user, then project, tenant, global added
		b.Run(fmt.Sprintf("levels=%d", levels), func(b *testing.B) {
			rt := &roundTrips{}
			s := benchStore(b, mongotest.DatabaseName(b), rt)
			req := request("bench", "acme", "p", "u", caps)
			// Warm up: the counters exist in steady state.
			h := mustAcquire(b, s, req)
			if _, err := s.Release(context.Background(), h.Token); err != nil {
				b.Fatal(err)
			}
			var acquireRT, checkRT, releaseRT int64
			var acquireNs, releaseNs int64
			off0 := rt.off.Load()
			b.ResetTimer()
			for b.Loop() {
				n0 := rt.n.Load()
				t0 := time.Now()
				h, err := s.Acquire(context.Background(), req)
				if err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				n1 := rt.n.Load()
				if err := s.Touch(context.Background(), h.Token); err != nil {
					b.Fatal(err)
				}
				n2 := rt.n.Load()
				t2 := time.Now()
				if _, err := s.Release(context.Background(), h.Token); err != nil {
					b.Fatal(err)
				}
				acquireNs += t1.Sub(t0).Nanoseconds()
				releaseNs += time.Since(t2).Nanoseconds()
				acquireRT += n1 - n0
				checkRT += n2 - n1
				releaseRT += rt.n.Load() - n2
			}
			n := float64(b.N)
			b.ReportMetric(float64(acquireRT)/n, "acquire-rt/op")
			b.ReportMetric(float64(checkRT)/n, "check-rt/op")
			b.ReportMetric(float64(releaseRT)/n, "release-rt/op")
			b.ReportMetric(float64(rt.off.Load()-off0)/n, "offpath-rt/op")
			b.ReportMetric(float64(acquireNs)/n/1e6, "acquire-ms/op")
			b.ReportMetric(float64(releaseNs)/n/1e6, "release-ms/op")
		})
	}
}

// BenchmarkContended runs N clients against one resource with global cap k: every client
// loops acquire (one attempt), and on success a check and a release. It reports successful
// acquires per second and round trips per successful acquire and per busy attempt.
func BenchmarkContended(b *testing.B) {
	for _, tc := range []struct{ clients, capacity int }{{8, 1}, {8, 4}, {32, 4}} {
		b.Run(fmt.Sprintf("clients=%d/cap=%d", tc.clients, tc.capacity), func(b *testing.B) {
			db := mongotest.DatabaseName(b)
			caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: tc.capacity}, {Level: lease.LevelTenant, Cap: tc.capacity}}
			var okRT, busyRT, okN, busyN atomic.Int64
			stores := make([]*leasestore.Store, tc.clients)
			counters := make([]*roundTrips, tc.clients)
			for i := range stores {
				counters[i] = &roundTrips{}
				stores[i] = benchStore(b, db, counters[i])
			}
			b.ResetTimer()
			start := time.Now()
			var wg sync.WaitGroup
			var remaining atomic.Int64
			remaining.Store(int64(b.N))
			for i, s := range stores {
				wg.Add(1)
				go func() {
					defer wg.Done()
					rt := counters[i]
					req := request("hot", "acme", "p", uniq("u", i), caps)
					for remaining.Add(-1) >= 0 {
						n0 := rt.n.Load()
						h, err := s.Acquire(context.Background(), req)
						switch {
						case errors.Is(err, lease.ErrBusy):
							busyRT.Add(rt.n.Load() - n0)
							busyN.Add(1)
							continue
						case err != nil:
							b.Error(err)
							return
						}
						okRT.Add(rt.n.Load() - n0)
						okN.Add(1)
						if err := s.Touch(context.Background(), h.Token); err != nil {
							b.Error(err)
						}
						if _, err := s.Release(context.Background(), h.Token); err != nil {
							b.Error(err)
						}
					}
				}()
			}
			wg.Wait()
			elapsed := time.Since(start).Seconds()
			b.ReportMetric(float64(okN.Load())/elapsed, "acquires/s")
			if okN.Load() > 0 {
				b.ReportMetric(float64(okRT.Load())/float64(okN.Load()), "rt/acquire")
			}
			if busyN.Load() > 0 {
				b.ReportMetric(float64(busyRT.Load())/float64(busyN.Load()), "rt/busy")
			}
			b.ReportMetric(float64(busyN.Load())/float64(b.N), "busy-ratio")
		})
	}
}

// threadCPU is the CPU, in µs, this process's threads have spent, from the kernel's per-thread
// accounting (schedstat).
func threadCPU(b *testing.B) float64 {
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		b.Skip("needs /proc")
	}
	var ns int64
	for _, t := range tasks {
		raw, _ := os.ReadFile("/proc/self/task/" + t.Name() + "/schedstat")
		if f := strings.Fields(string(raw)); len(f) > 0 {
			n, _ := strconv.ParseInt(f[0], 10, 64)
			ns += n
		}
	}
	return float64(ns) / 1e3
}

// BenchmarkCommandCPU is the reference for CPU figures of processes that use the store (the
// agent's, docs/figures.md "Agent footprint"): the CPU this process spends per store command,
// a touch (one findAndModify), sent one after another from one thread, as read from the
// kernel's per-thread accounting. What a process spends per operation beyond this times its
// commands is its own.
func BenchmarkCommandCPU(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	s := benchStore(b, mongotest.DatabaseName(b), nil)
	h := mustAcquire(b, s, request("bench", "acme", "p", "u", allCaps(1<<20, 1<<20, 1<<20, 1<<20)[:1]))
	c0 := threadCPU(b)
	for b.Loop() {
		if err := s.Touch(context.Background(), h.Token); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((threadCPU(b)-c0)/float64(b.N), "cpu-µs/command")
}

// BenchmarkRoundTripCPU is the floor under BenchmarkCommandCPU: the CPU of one round trip to
// the store with no client library, a ping written as a wire message on a plain connection and
// its answer read back ("bare"), and the same ping through the driver ("driver"). "bare" is
// what the kernel and Go's scheduler cost a process per round trip on this machine whatever
// the client does; a process that sends n commands per operation spends at least n times it.
func BenchmarkRoundTripCPU(b *testing.B) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	uri, err := mongotest.URI()
	if err != nil {
		b.Fatal(err)
	}
	b.Run("bare", func(b *testing.B) {
		u, err := url.Parse(uri)
		if err != nil {
			b.Fatal(err)
		}
		conn, err := net.Dial("tcp", u.Host)
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = conn.Close() }()
		msg := pingMessage(b)
		buf := make([]byte, 64<<10)
		c0 := threadCPU(b)
		for b.Loop() {
			if _, err := conn.Write(msg); err != nil {
				b.Fatal(err)
			}
			if _, err := io.ReadFull(conn, buf[:4]); err != nil {
				b.Fatal(err)
			}
			n := int(binary.LittleEndian.Uint32(buf))
			if n < 4 || n > len(buf) {
				b.Fatalf("answer of %d bytes", n)
			}
			if _, err := io.ReadFull(conn, buf[4:n]); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric((threadCPU(b)-c0)/float64(b.N), "cpu-µs/round-trip")
	})
	b.Run("driver", func(b *testing.B) {
		c, err := mongo.Connect(options.Client().ApplyURI(uri))
		if err != nil {
			b.Fatal(err)
		}
		defer func() { _ = c.Disconnect(context.Background()) }()
		db := c.Database(mongotest.DatabaseName(b))
		ping := bson.D{{Key: "ping", Value: 1}}
		if err := db.RunCommand(context.Background(), ping).Err(); err != nil {
			b.Fatal(err)
		}
		c0 := threadCPU(b)
		for b.Loop() {
			if err := db.RunCommand(context.Background(), ping).Err(); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric((threadCPU(b)-c0)/float64(b.N), "cpu-µs/round-trip")
	})
}

// pingMessage is an OP_MSG (opcode 2013) with one body section, {ping: 1, $db: "admin"}.
func pingMessage(b *testing.B) []byte {
	body, err := bson.Marshal(bson.D{{Key: "ping", Value: 1}, {Key: "$db", Value: "admin"}})
	if err != nil {
		b.Fatal(err)
	}
	const header = 16 + 4 + 1 // length, request ID, response to, opcode; flags; section kind 0
	msg := make([]byte, header+len(body))
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.LittleEndian.PutUint32(msg[4:], 1)
	binary.LittleEndian.PutUint32(msg[12:], 2013)
	copy(msg[header:], body)
	return msg
}
