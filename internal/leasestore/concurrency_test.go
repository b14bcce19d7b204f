package leasestore_test

import (
	"context"
	"errors"
	"maps"
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
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// ledger is the test's own record of who holds what: a holder is counted from the moment
// its Acquire returned until just before its Release is called. It can only undercount the
// store, so a ledger above a cap proves an overbooking.
type ledger struct {
	mu    sync.Mutex
	held  map[string]int
	caps  map[string]int
	peaks map[string]int
	// lows, while a sampler reads, is the fewest holders each key had since the read began.
	lows map[string]int
}

// watch starts a read of the counters: from now on lows tracks the fewest holders per key.
func (l *ledger) watch() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lows = maps.Clone(l.held)
}

// unwatch ends the read and returns, per key, the fewest holders the ledger had during it.
// A counter read in that time can never be below it: a slot is in the ledger only between
// its increment and its decrement.
func (l *ledger) unwatch() map[string]int {
	l.mu.Lock()
	defer l.mu.Unlock()
	lows := l.lows
	l.lows = nil
	return lows
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
		if low, ok := l.lows[k]; ok && l.held[k] < low {
			l.lows[k] = l.held[k]
		}
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
	// Releases sometimes crash between their mark and their give-back (the sweep does the
	// give-back again once the released holder expires) and otherwise pause there: the
	// window in which a repair that took the released holder's entries for lost would give
	// the slot back twice. A quarter of them hold the give-back until a whole reconcile pass
	// has run inside the window, which the ledger and the sampler would see.
	var crashed, paused, spanned, repaired, passes atomic.Int64
	var releasing sync.Map // tokens whose Release is running (not rollbacks, not reaps)
	fault := func(step leasestore.Step, token string) error {
		if _, ok := releasing.Load(token); !ok || step != leasestore.StepHolderReleased {
			return nil
		}
		switch n := rand.IntN(100); {
		case n < 5:
			crashed.Add(1)
			return leasestore.ErrCrash
		case n < 30:
			paused.Add(1)
			from, deadline := passes.Load(), time.Now().Add(maxReleaseWindow)
			for passes.Load() < from+2 && time.Now().Before(deadline) {
				time.Sleep(10 * time.Millisecond) // real time: polling the reconcile passes of the stress run (bounded by maxReleaseWindow)
			}
			if passes.Load() >= from+2 {
				spanned.Add(1)
			}
			time.Sleep(releasePause) // real time: let the stress workers take what was freed
		default:
			paused.Add(1)
			time.Sleep(releasePause) // real time: pacing the stress run against the store
		}
		return nil
	}
	stores := make([]*leasestore.Store, clients)
	for i := range stores {
		// Correctness, not latency, is under test: the default operation timeout keeps a
		// loaded machine from turning slowness into failures, and a crashed release's
		// holder expires within the run.
		stores[i] = newStoreAt(t, uri, db, leasestore.WithSafetyMargin(0), leasestore.WithFault(fault))
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
	// A drift from the start (an entry whose holder is gone, on a resource of its own) gives
	// reconcile an entry to remove during the run whatever the load.
	if err := storetest.LateEntry(context.Background(), uri, db, key("seed", lease.LevelGlobal, "acme", "p1", "ann"), "lh-00000000000000000000dead"); err != nil {
		t.Fatalf("seeding a drift: %v", err)
	}

	// The run lasts the duration, and longer (up to 6 times) until reconcile has repaired a
	// counter while the workers run: on a loaded machine a pass takes seconds.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	go func() {
		for ctx.Err() == nil {
			if d := time.Since(start); d >= duration && (repaired.Load() > 0 || d >= 6*duration) {
				cancel()
				return
			}
			time.Sleep(50 * time.Millisecond) // real time: pacing the stress run's stop check
		}
	}()
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
				// A release that crashes leaves its lease to the idle reap: its TTL is short
				// enough for the run's end, and long above a hold (300 ms at most, touched).
				req.TTL = 3 * time.Second
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
				// Hold a while: a counter given back twice stays below its holders (the
				// sampler's check) until they leave or reconcile raises it again.
				time.Sleep(time.Duration(rng.IntN(300)) * time.Millisecond) // real time: random holds of the stress workload on the store
				l.remove(h.Levels)
				releasing.Store(h.Token, true)
				if ok, err := s.Release(context.Background(), h.Token); (err != nil && !errors.Is(err, leasestore.ErrCrash)) || (!ok && err == nil) {
					t.Errorf("release = %v, %v", ok, err)
				}
				releasing.Delete(h.Token)
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
				// A reap's delete meets the crash fault too: the holder is gone, its slots
				// are reconcile's to return.
				// The scheduled sweep's round: one read of the holders for the idle reap,
				// the pods and reconcile's bookings.
				round, err := s.SweepRound(context.Background())
				if err != nil && !errors.Is(err, leasestore.ErrCrash) {
					t.Errorf("sweep round: %v", err)
				}
				for _, p := range round.Pods {
					if p.Name == "dying" {
						if _, err := s.ReapPod(context.Background(), p); err != nil && !errors.Is(err, leasestore.ErrCrash) {
							t.Errorf("reap pod: %v", err)
						}
					}
				}
				if i == 0 {
					res, err := s.ReconcileRound(context.Background(), round)
					if err != nil {
						t.Errorf("reconcile: %v", err)
					}
					repaired.Add(int64(res.Repaired))
					passes.Add(1)
				}
				time.Sleep(50 * time.Millisecond) // real time: pacing the reconciler of the stress run
			}
		}()
	}
	// A sampler reads the counters: none may ever exceed its cap, nor fall below the holders
	// the ledger had throughout the read (a slot given back twice shows there at once, before
	// any third party takes it).
	var samples atomic.Int64
	wg.Add(1)
	go func() {
		defer wg.Done()
		for ctx.Err() == nil {
			l.watch()
			cs, err := stores[0].ListCounters(context.Background(), leasestore.CounterFilter{})
			lows := l.unwatch()
			if err != nil {
				t.Errorf("sample: %v", err)
				return
			}
			samples.Add(1)
			counted := map[string]int{}
			for _, c := range cs {
				counted[c.Key] = c.Count
			}
			for k, low := range lows {
				if counted[k] < low {
					t.Errorf("counter %s at %d while %d holders held it throughout the read: a slot was given back twice", k, counted[k], low)
				}
			}
			for _, c := range cs {
				for _, r := range resources {
					for _, lc := range r.caps {
						if c.Resource == r.name && c.Level == lc.Level && c.Count > lc.Cap {
							t.Errorf("counter %s at %d, cap %d", c.Key, c.Count, lc.Cap)
						}
					}
				}
			}
			time.Sleep(20 * time.Millisecond) // real time: pacing the counter sampler of the stress run
		}
	}()
	wg.Wait()

	// At rest: reap what was abandoned, then every counter equals its booked holders (no
	// reconcile involved) and nothing is held.
	// The abandoned holders expire one TTL (1 s) after their acquire, those whose release
	// crashed 3 s after their last touch; reap until none is left.
	rest := context.Background()
	var hs []lease.Holder
	for deadline := time.Now().Add(15 * time.Second); ; {
		if _, err := stores[1].ReapIdle(rest, ""); err != nil && !errors.Is(err, leasestore.ErrCrash) {
			t.Fatal(err)
		}
		if _, err := stores[1].RevokePod(rest, "ns", "dying"); err != nil && !errors.Is(err, leasestore.ErrCrash) {
			t.Fatal(err)
		}
		if hs, err = stores[3].ListHolders(rest, leasestore.HolderFilter{}); err != nil {
			t.Fatal(err)
		}
		if len(hs) == 0 || time.Now().After(deadline) {
			break
		}
		time.Sleep(200 * time.Millisecond) // real time: polling the store until the holders left (bounded by deadline)
	}
	if len(hs) != 0 {
		t.Errorf("%d holders left at rest: %+v", len(hs), hs)
	}
	// Nothing is left to repair: a crashed release's give-back was done again by the sweep.
	for deadline := time.Now().Add(15 * time.Second); drifted(t, stores[0]) && time.Now().Before(deadline); {
		if _, err := stores[0].Reconcile(rest); err != nil {
			t.Fatal(err)
		}
		time.Sleep(200 * time.Millisecond) // real time: reconcile passes on the store's clock (bounded by deadline)
	}
	assertNoDrift(t, stores[2])
	full := 0
	for k, p := range l.peaks {
		if p == l.caps[k] {
			full++
		}
	}
	t.Logf("%v: %d operations, %d acquired, %d busy, %d counter samples; %d of %d counters reached their cap; "+
		"%d releases crashed, %d paused before the decrement (%d across a whole reconcile pass); "+
		"reconcile ran %d passes and removed %d entries of gone holders during the run",
		duration, ops.Load(), acquired.Load(), busy.Load(), samples.Load(), full, len(l.peaks),
		crashed.Load(), paused.Load(), spanned.Load(), passes.Load(), repaired.Load())
	if busy.Load() == 0 || full == 0 {
		t.Errorf("the run never filled a level: the invariant was not exercised")
	}
	if repaired.Load() == 0 {
		t.Errorf("reconcile never removed an entry during the run: the repair was not exercised")
	}
	if spanned.Load() == 0 {
		t.Errorf("no release window spanned a whole reconcile pass: its overbooking window was not exercised")
	}
}

const (
	// releasePause widens the window between a release's mark and its give-back.
	releasePause = 150 * time.Millisecond
	// maxReleaseWindow bounds how long a release waits there for a reconcile pass.
	maxReleaseWindow = 2 * time.Second
)

// drifted reports whether a counter differs from the holders that book it.
func drifted(t *testing.T, s *leasestore.Store) bool {
	t.Helper()
	for _, v := range counts(t, s) {
		if v[0] != v[1] {
			return true
		}
	}
	return false
}
