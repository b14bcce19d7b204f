package leasestore_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// ledger is the test's own record of who holds what: a holder is counted from the moment
// its Acquire returned until just before its Release is called. It can only undercount the
// store, so a ledger above a cap proves an overbooking.
type ledger struct {
	mu    sync.Mutex
	held  map[string]int
	caps  map[string]int
	peaks map[string]int
}

func (l *ledger) add(t *testing.T, keys []string, caps map[string]int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.held[k]++
		l.caps[k] = caps[k]
		if l.held[k] > l.peaks[k] {
			l.peaks[k] = l.held[k]
		}
		if l.held[k] > caps[k] {
			t.Errorf("overbooked %s: %d holders, cap %d", k, l.held[k], caps[k])
		}
	}
}

func (l *ledger) remove(keys []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, k := range keys {
		l.held[k]--
	}
}

// TestConcurrencyInvariant runs several clients (as separate pods) and many goroutines
// against small caps at all four levels, mixing acquire, check, payload, release, idle reap,
// pod reap and reconcile. At no moment may a level hold more than its cap (an in-test
// ledger, and a sampler reading the counters), and at rest every counter equals the holders
// that book it. LEASE_STRESS_SECONDS sets the duration (default 10).
func TestConcurrencyInvariant(t *testing.T) {
	if testing.Short() {
		t.Skip("long-running")
	}
	duration := 10 * time.Second
	if v := os.Getenv("LEASE_STRESS_SECONDS"); v != "" {
		if d, err := time.ParseDuration(v + "s"); err == nil {
			duration = d
		}
	}
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	const clients, workers = 4, 32
	stores := make([]*leasestore.Store, clients)
	for i := range stores {
		// Correctness, not latency, is under test: a generous operation timeout keeps a
		// loaded machine from turning slowness into failures.
		stores[i] = newStoreAt(t, uri, db, leasestore.WithSafetyMargin(2*time.Second), leasestore.WithOpTimeout(time.Minute))
	}

	// Two resources; caps 1-3 at every level; tenants, projects and users drawn from small sets.
	type res struct {
		name string
		caps []lease.LevelCap
	}
	resources := []res{
		{"pdf", allCaps(1, 2, 2, 3)},
		{"browser", allCaps(1, 1, 2, 2)},
	}
	capOf := func(r res, tenant, project, user string) map[string]int {
		m := map[string]int{}
		for _, c := range r.caps {
			m[key(r.name, c.Level, tenant, project, user)] = c.Cap
		}
		return m
	}
	tenants := []string{"acme", "globex"}
	projects := []string{"p1", "p2"}
	users := []string{"ann", "bob", "cid"}

	l := &ledger{held: map[string]int{}, caps: map[string]int{}, peaks: map[string]int{}}
	var ops, acquired, busy, lost atomic.Int64
	ctx, cancel := context.WithTimeout(context.Background(), duration)
	defer cancel()
	var wg sync.WaitGroup

	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 7))
			s := stores[w%clients]
			for ctx.Err() == nil {
				r := resources[rng.IntN(len(resources))]
				tenant, project, user := tenants[rng.IntN(2)], projects[rng.IntN(2)], users[rng.IntN(3)]
				req := request(r.name, tenant, project, user, r.caps)
				req.Pod = lease.PodRef{Namespace: "ns", Name: uniq("pod-", w%clients), UID: uniq("uid-", w%clients)}
				mode := rng.IntN(10)
				switch mode {
				case 0: // will be abandoned: short TTL, never touched; an idle reap takes it
					req.TTL = time.Second
				case 1: // its pod is about to die; a pod reap takes it
					req.Pod = lease.PodRef{Namespace: "ns", Name: "dying", UID: uniq("dead-", w)}
				}
				h, err := s.Acquire(context.Background(), req)
				ops.Add(1)
				switch {
				case errors.Is(err, lease.ErrBusy):
					busy.Add(1)
					continue
				case mode <= 1 && errors.Is(err, lease.ErrUnavailable) && strings.Contains(err.Error(), "reaped while booking"):
					continue // its short TTL ran out, or its pod was reaped, before the funnel finished
				case err != nil:
					t.Errorf("acquire: %v", err)
					return
				}
				acquired.Add(1)
				if mode <= 1 {
					continue // never in the ledger: the store may free it at any moment
				}
				caps := capOf(r, tenant, project, user)
				l.add(t, h.Levels, caps)
				for range rng.IntN(3) {
					if err := s.Touch(context.Background(), h.Token); err != nil {
						lost.Add(1)
						t.Errorf("check of a held lease: %v", err)
					}
					if rng.IntN(4) == 0 {
						if err := s.UpdatePayload(context.Background(), h.Token, map[string]string{"step": "x"}); err != nil {
							t.Errorf("payload: %v", err)
						}
					}
					ops.Add(1)
				}
				l.remove(h.Levels)
				if ok, err := s.Release(context.Background(), h.Token); err != nil || !ok {
					t.Errorf("release = %v, %v", ok, err)
				}
				ops.Add(1)
			}
		}()
	}
	// Reapers on every client: idle, dead pods, reconcile.
	for i, s := range stores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := s.ReapIdle(context.Background(), ""); err != nil {
					t.Errorf("reap idle: %v", err)
				}
				pods, err := s.HolderPods(context.Background())
				if err != nil {
					t.Errorf("holder pods: %v", err)
				}
				for _, p := range pods {
					if p.Name == "dying" {
						if _, err := s.ReapPod(context.Background(), p); err != nil {
							t.Errorf("reap pod: %v", err)
						}
					}
				}
				if i == 0 {
					if _, err := s.Reconcile(context.Background()); err != nil {
						t.Errorf("reconcile: %v", err)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
		}()
	}
	// A sampler reads the counters: none may ever exceed its cap.
	var samples atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			cs, err := stores[0].ListCounters(context.Background(), leasestore.CounterFilter{})
			if err != nil {
				t.Errorf("sample: %v", err)
				return
			}
			samples.Add(1)
			for _, c := range cs {
				for _, r := range resources {
					for _, lc := range r.caps {
						if c.Resource == r.name && c.Level == lc.Level && c.Count > lc.Cap {
							t.Errorf("counter %s at %d, cap %d", c.Key, c.Count, lc.Cap)
						}
					}
				}
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()
	wg.Wait()

	// At rest: reap what was abandoned, then every counter equals its booked holders (no
	// reconcile involved) and nothing is held.
	// The abandoned holders expire one TTL (1 s) after their acquire; reap until none is left.
	rest := context.Background()
	var hs []lease.Holder
	for deadline := time.Now().Add(15 * time.Second); ; {
		if _, err := stores[1].ReapIdle(rest, ""); err != nil {
			t.Fatal(err)
		}
		if _, err := stores[1].RevokePod(rest, "ns", "dying"); err != nil {
			t.Fatal(err)
		}
		if hs, err = stores[3].ListHolders(rest, leasestore.HolderFilter{}); err != nil {
			t.Fatal(err)
		}
		if len(hs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	if len(hs) != 0 {
		t.Errorf("%d holders left at rest: %+v", len(hs), hs)
	}
	assertNoDrift(t, stores[2])
	full := 0
	for k, p := range l.peaks {
		if p == l.caps[k] {
			full++
		}
	}
	t.Logf("%v: %d operations, %d acquired, %d busy, %d counter samples; %d of %d counters reached their cap",
		duration, ops.Load(), acquired.Load(), busy.Load(), samples.Load(), full, len(l.peaks))
	if busy.Load() == 0 || full == 0 {
		t.Errorf("the run never filled a level: the invariant was not exercised")
	}
}
