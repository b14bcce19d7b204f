package leasestore_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// crashAt returns a fault hook that fails (with err) the first time step is reached for a
// key with the given prefix.
func crashAt(step leasestore.Step, keyPrefix string, err error) leasestore.FaultFunc {
	var once sync.Once
	return func(s leasestore.Step, key string) error {
		var out error
		if s == step && strings.HasPrefix(key, keyPrefix) {
			once.Do(func() { out = err })
		}
		return out
	}
}

// pair returns a store with a fault hook and a clean store on the same database, with a
// short reconcile safety margin.
func pair(t *testing.T, margin time.Duration, fault leasestore.FaultFunc, cleanOpts ...leasestore.Option) (faulty, clean *leasestore.Store) {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	// Reconcile lowers a counter only on a second sighting; no extra delay in these tests.
	opts := append([]leasestore.Option{leasestore.WithSafetyMargin(margin), leasestore.WithReconcileConfirm(0)}, cleanOpts...)
	clean = newStoreAt(t, uri, db, opts...)
	faulty = newStoreAt(t, uri, db, leasestore.WithSafetyMargin(margin), leasestore.WithFault(fault))
	return faulty, clean
}

// reconcileRepairs checks that reconcile leaves the drift alone before the safety margin
// and repairs it after.
func reconcileRepairs(t *testing.T, s *leasestore.Store, margin time.Duration) {
	t.Helper()
	ctx := ctxT(t)
	before := counts(t, s)
	drift := false
	for _, v := range before {
		drift = drift || v[0] != v[1]
	}
	if !drift {
		t.Fatalf("no drift to repair: %v", before)
	}
	res, err := s.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Corrected+res.Deleted+res.Created != 0 {
		t.Errorf("reconcile inside the safety margin changed counters: %+v", res)
	}
	time.Sleep(margin + 100*time.Millisecond) // real time: the reconcile safety margin passes on the store's clock
	first, err := s.Reconcile(ctx)            // a lowering is only noted on its first sighting
	if err != nil {
		t.Fatal(err)
	}
	res, err = s.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if res.Corrected+res.Deleted == 0 {
		t.Errorf("reconcile after the margin repaired nothing: %+v then %+v", first, res)
	}
	assertNoDrift(t, s)
}

func TestCrashBetweenIncrementAndPush(t *testing.T) {
	const margin = 500 * time.Millisecond
	faulty, clean := pair(t, margin, crashAt(leasestore.StepCounterIncremented, "r|tenant|", leasestore.ErrCrash))
	keep := mustAcquire(t, clean, request("r", "acme", "p", "keep", allCaps(5, 5, 5, 5)))

	_, err := faulty.Acquire(context.Background(), request("r", "acme", "p", "u", allCaps(5, 5, 5, 5)))
	if !errors.Is(err, leasestore.ErrCrash) {
		t.Fatalf("acquire = %v, want the simulated crash", err)
	}
	// The crashed attempt left a PENDING holder with user and project pushed, and the tenant
	// counter incremented without a holder that knows it.
	got := counts(t, clean)
	if got["r|tenant|acme"] != [2]int{2, 1} {
		t.Errorf("tenant counter = %v, want count 2 booked 1", got["r|tenant|acme"])
	}
	reconcileRepairs(t, clean, margin)
	if _, err := clean.GetHolder(context.Background(), keep.Token); err != nil {
		t.Errorf("the healthy holder: %v", err)
	}
}

func TestCrashBetweenDeleteAndDecrement(t *testing.T) {
	const margin = 500 * time.Millisecond
	faulty, clean := pair(t, margin, crashAt(leasestore.StepHolderReleased, "", leasestore.ErrCrash))
	h := mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))

	if _, err := faulty.Release(context.Background(), h.Token); !errors.Is(err, leasestore.ErrCrash) {
		t.Fatalf("release = %v, want the simulated crash", err)
	}
	// Every counter is still at 1 with nobody booking it: the cap-1 slot is blocked.
	if _, err := clean.Acquire(context.Background(), request("r", "acme", "p", "u", allCaps(1, 1, 1, 1))); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire before reconcile = %v, want busy", err)
	}
	reconcileRepairs(t, clean, margin)
	if len(counts(t, clean)) != 0 {
		t.Errorf("counters nobody books were not deleted: %v", counts(t, clean))
	}
	mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
}

// A store error mid-funnel rolls the attempt back at once: no reconcile needed.
func TestStoreErrorMidFunnelRollsBack(t *testing.T) {
	for _, step := range []leasestore.Step{leasestore.StepCounterIncremented, leasestore.StepLevelPushed} {
		t.Run(string(step), func(t *testing.T) {
			boom := errors.New("injected store error")
			faulty, clean := pair(t, time.Minute, crashAt(step, "r|tenant|", boom))
			_, err := faulty.Acquire(context.Background(), request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
			if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, boom) {
				t.Fatalf("acquire = %v, want unavailable caused by the injected error", err)
			}
			hs, err := clean.ListHolders(context.Background(), leasestore.HolderFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) != 0 {
				t.Errorf("%d holders left after rollback", len(hs))
			}
			for k, v := range counts(t, clean) {
				if v != [2]int{0, 0} {
					t.Errorf("counter %s = %v after rollback", k, v)
				}
			}
			mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
		})
	}
}

// A crash mid-funnel leaves a PENDING holder with some levels: the idle reap (TTL) takes it
// and returns its pushed levels; reconcile returns the unpushed one.
func TestCrashMidFunnelIsReapedAfterTTL(t *testing.T) {
	const margin = 300 * time.Millisecond
	faulty, clean := pair(t, margin, crashAt(leasestore.StepLevelPushed, "r|project|", leasestore.ErrCrash))
	req := request("r", "acme", "p", "u", allCaps(1, 1, 1, 1))
	req.TTL = 300 * time.Millisecond
	if _, err := faulty.Acquire(context.Background(), req); !errors.Is(err, leasestore.ErrCrash) {
		t.Fatalf("acquire = %v, want the simulated crash", err)
	}
	hs, err := clean.ListHolders(context.Background(), leasestore.HolderFilter{})
	if err != nil || len(hs) != 1 || hs[0].State != lease.StatePending || len(hs[0].Levels) != 2 {
		t.Fatalf("holders after crash = %+v, %v; want one PENDING with 2 levels", hs, err)
	}
	if err := clean.Touch(context.Background(), hs[0].Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("touch of a pending holder = %v, want lost", err)
	}
	time.Sleep(req.TTL + 100*time.Millisecond) // real time: the holder's TTL passes on the store's clock
	reaped, err := clean.ReapIdle(context.Background(), "r")
	if err != nil || len(reaped) != 1 {
		t.Fatalf("reap = %v, %v", tokens(reaped), err)
	}
	assertNoDrift(t, clean)
	mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
}

func TestReconcileCorrectsAndRecreates(t *testing.T) {
	const margin = 300 * time.Millisecond
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	clean := newStoreAt(t, uri, db, leasestore.WithSafetyMargin(margin), leasestore.WithReconcileConfirm(0))
	faulty := newStoreAt(t, uri, db, leasestore.WithSafetyMargin(margin),
		leasestore.WithFault(crashAt(leasestore.StepHolderReleased, "", leasestore.ErrCrash)))
	// Crash after deleting the first of two holders: the counters read 2 with 1 booked.
	h1 := mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(2, 2, 2, 2)))
	h2 := mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(2, 2, 2, 2)))
	if _, err := faulty.Release(context.Background(), h1.Token); !errors.Is(err, leasestore.ErrCrash) {
		t.Fatal(err)
	}
	time.Sleep(margin + 100*time.Millisecond) // real time: the reconcile safety margin passes on the store's clock
	for i, want := range []leasestore.ReconcileResult{{Skipped: 4}, {Corrected: 4, Lowered: 4}} {
		res, err := clean.Reconcile(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if res != want {
			t.Errorf("reconcile pass %d = %+v, want %+v", i+1, res, want)
		}
	}
	for k, v := range counts(t, clean) {
		if v != [2]int{1, 1} {
			t.Errorf("counter %s = %v, want 1 of 1", k, v)
		}
	}
	if _, err := clean.GetHolder(context.Background(), h2.Token); err != nil {
		t.Error(err)
	}

	// A counter lost while a holder books it (deleted by hand, a restore without it):
	// reconcile recreates it at once with the booked count, so its cap holds again.
	tenantKey := key("r", lease.LevelTenant, "acme", "p", "u")
	deleteCounter(t, uri, db, tenantKey)
	if _, ok := counts(t, clean)[tenantKey]; ok {
		t.Fatalf("counter %s still there", tenantKey)
	}
	res, err := clean.Reconcile(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if want := (leasestore.ReconcileResult{Created: 1}); res != want {
		t.Errorf("reconcile after the loss = %+v, want %+v", res, want)
	}
	cs, err := clean.ListCounters(context.Background(), leasestore.CounterFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var got []lease.Counter
	for _, c := range cs {
		if c.Key == tenantKey {
			got = append(got, c)
		}
	}
	if len(got) != 1 || got[0].Count != 1 || got[0].Booked != 1 || got[0].Level != lease.LevelTenant ||
		got[0].Scope != "acme" || got[0].Resource != "r" {
		t.Errorf("recreated counter = %+v, want %s at 1 of 1 (resource r, level tenant, scope acme)", got, tenantKey)
	}
	// The recreated counter enforces its cap: 2 at tenant level, one held.
	other := request("r", "acme", "p2", "w", allCaps(2, 2, 2, 2))
	mustAcquire(t, clean, other)
	other.User = "x"
	if _, err := clean.Acquire(context.Background(), other); !errors.Is(err, lease.ErrBusy) {
		t.Errorf("third holder of tenant acme (cap 2) = %v, want busy", err)
	}
}

// deleteCounter removes a counter behind the store's back, as a lost document.
func deleteCounter(t *testing.T, uri, db, key string) {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(context.Background()) }()
	r, err := c.Database(db).Collection(leasestore.CountersCollection).DeleteOne(context.Background(), bson.D{{Key: "_id", Value: key}})
	if err != nil || r.DeletedCount != 1 {
		t.Fatalf("deleting counter %s: %v, %+v", key, err, r)
	}
}

// cutProxy is a TCP forwarder in front of the test server whose connections can be cut,
// so a test can make the store unreachable mid-operation, on any server.
type cutProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	conns  []net.Conn
	cut    bool
}

func newCutProxy(t *testing.T, target string) *cutProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &cutProxy{ln: ln, target: target}
	go p.serve()
	t.Cleanup(func() { _ = ln.Close(); p.setCut(true) })
	return p
}

func (p *cutProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			_ = c.Close()
			continue
		}
		p.conns = append(p.conns, c, b)
		p.mu.Unlock()
		go func() { _, _ = io.Copy(b, c); _ = b.Close() }()
		go func() { _, _ = io.Copy(c, b); _ = c.Close() }()
	}
}

func (p *cutProxy) setCut(cut bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = cut
	if cut {
		for _, c := range p.conns {
			_ = c.Close()
		}
		p.conns = nil
	}
}

// proxiedURI rewrites uri to go through the proxy as a direct connection.
func proxiedURI(t *testing.T, uri string) (string, string) {
	t.Helper()
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	target := strings.Split(u.Host, ",")[0]
	if !strings.Contains(target, ":") {
		target += ":27017"
	}
	q := u.Query()
	q.Set("directConnection", "true")
	q.Del("replicaSet")
	u.RawQuery = q.Encode()
	return u.String(), target
}

func TestUnreachableStoreFailsClosed(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	clean := newStoreAt(t, uri, db, leasestore.WithSafetyMargin(300*time.Millisecond), leasestore.WithReconcileConfirm(0))
	puri, target := proxiedURI(t, uri)
	proxy := newCutProxy(t, target)
	purl, _ := url.Parse(puri)
	purl.Host = proxy.ln.Addr().String()

	var cutMidFunnel sync.Once
	fault := func(step leasestore.Step, key string) error {
		if step == leasestore.StepCounterIncremented && strings.HasPrefix(key, "mid|") {
			cutMidFunnel.Do(func() { proxy.setCut(true) })
		}
		return nil
	}
	s := newStoreAt(t, purl.String(), db, leasestore.WithOpTimeout(time.Second), leasestore.WithFault(fault))
	h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))

	proxy.setCut(true)
	ctx := context.Background()
	_, err = s.Acquire(ctx, request("r2", "acme", "p", "u", allCaps(1, 1, 1, 1)))
	if !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrBusy) {
		t.Errorf("acquire while unreachable = %v, want unavailable", err)
	}
	if err := s.Touch(ctx, h.Token); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("touch while unreachable = %v, want unavailable", err)
	}
	if _, err := s.Release(ctx, h.Token); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("release while unreachable = %v, want unavailable", err)
	}
	// Nothing was booked for r2, and the held lease is untouched.
	if got := counts(t, clean); len(got) != 4 {
		t.Errorf("counters after the outage = %v, want only r's four", got)
	}

	// The connection drops in the middle of the funnel: unavailable, never success or busy.
	proxy.setCut(false)
	_, err = s.Acquire(ctx, request("mid", "acme", "p", "u", allCaps(1, 1, 1, 1)))
	if !errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("acquire cut mid-funnel = %v, want unavailable", err)
	}
	proxy.setCut(false)
	// What the cut left behind (a pending holder, an unpushed increment) is repaired by the
	// idle reap and reconcile, after which the slot is free again.
	hs, err := clean.ListHolders(ctx, leasestore.HolderFilter{Resource: "mid"})
	if err != nil {
		t.Fatal(err)
	}
	for _, hh := range hs {
		if hh.State != lease.StatePending {
			t.Errorf("holder left by the cut is %s, want PENDING", hh.State)
		}
		if _, _, err := clean.Revoke(ctx, hh.Token, ""); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(400 * time.Millisecond) // real time: the reconcile safety margin passes on the store's clock
	for range 2 {                      // a lowering needs a second sighting
		if _, err := clean.Reconcile(ctx); err != nil {
			t.Fatal(err)
		}
	}
	assertNoDrift(t, clean)
	if err := s.Touch(ctx, h.Token); err != nil {
		t.Errorf("touch after the outage: %v", err)
	}
	mustAcquire(t, s, request("mid", "acme", "p", "u", allCaps(1, 1, 1, 1)))
}

// A release deletes its holder before it decrements: a reconcile that reads in between sees
// the counter above what is booked. Lowering it then would take the slot back twice and
// overbook the cap; reconcile must wait for a second sighting, later than any in-flight
// decrement can take.
func TestReconcileDuringReleaseDoesNotTakeTheSlotTwice(t *testing.T) {
	var clean *leasestore.Store
	var passes []leasestore.ReconcileResult
	reconcileInTheWindow := func(step leasestore.Step, _ string) error {
		if step == leasestore.StepHolderReleased {
			for range 2 {
				res, err := clean.Reconcile(context.Background())
				if err != nil {
					t.Error(err)
				}
				passes = append(passes, res)
			}
		}
		return nil
	}
	// Every counter qualifies at once (negative margin); only the confirmation protects.
	faulty, c := pair(t, -time.Hour, reconcileInTheWindow, leasestore.WithReconcileConfirm(time.Second))
	clean = c
	caps := allCaps(2, 2, 2, 2)
	h1 := mustAcquire(t, clean, request("r", "acme", "p", "u", caps))
	mustAcquire(t, clean, request("r", "acme", "p", "u", caps))

	if ok, err := faulty.Release(context.Background(), h1.Token); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if len(passes) != 2 || passes[0].Skipped != 4 || passes[1].Corrected+passes[1].Deleted != 0 {
		t.Errorf("reconcile passes inside the release = %+v, want both to leave the counters alone", passes)
	}
	for k, v := range counts(t, clean) {
		if v != [2]int{1, 1} {
			t.Errorf("counter %s = %v after the release, want 1 of 1", k, v)
		}
	}
	mustAcquire(t, clean, request("r", "acme", "p", "u", caps))
	if _, err := clean.Acquire(context.Background(), request("r", "acme", "p", "u", caps)); !errors.Is(err, lease.ErrBusy) {
		t.Errorf("third holder on cap 2: %v, want busy", err)
	}
}

// TestReapReturnsHoldersWhoseDecrementFailed: a holder that a reap or revoke deleted is in
// its result even when returning its slots then failed; otherwise its handler never runs
// and revoke-pod under-reports. The slots are reconcile's to return.
func TestReapReturnsHoldersWhoseDecrementFailed(t *testing.T) {
	pod := lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"}
	cases := map[string]func(ctx context.Context, s *leasestore.Store) ([]lease.Holder, error){
		"reap idle": func(ctx context.Context, s *leasestore.Store) ([]lease.Holder, error) { return s.ReapIdle(ctx, "r") },
		"reap pod":  func(ctx context.Context, s *leasestore.Store) ([]lease.Holder, error) { return s.ReapPod(ctx, pod) },
		"revoke pod": func(ctx context.Context, s *leasestore.Store) ([]lease.Holder, error) {
			return s.RevokePod(ctx, pod.Namespace, pod.Name)
		},
	}
	for name, op := range cases {
		t.Run(name, func(t *testing.T) {
			failDecrement := errors.New("decrement lost")
			faulty, clean := pair(t, time.Hour, crashAt(leasestore.StepHolderReleased, "", failDecrement))
			ctx := ctxT(t)
			req := request("r", "acme", "p", "u", allCaps(5, 5, 5, 5))
			req.Pod, req.TTL = pod, time.Second
			var acquired []string
			for range 3 {
				acquired = append(acquired, mustAcquire(t, clean, req).Token)
			}
			if name == "reap idle" { // wait until the store's clock has passed the TTL
				h, err := clean.GetHolder(ctx, acquired[len(acquired)-1])
				if err != nil {
					t.Fatal(err)
				}
				for now, err := clean.ServerTime(ctx); !now.After(h.LastSeenAt.Add(req.TTL)); now, err = clean.ServerTime(ctx) {
					if err != nil {
						t.Fatal(err)
					}
				}
			}

			got, err := op(ctx, faulty)
			if !errors.Is(err, failDecrement) {
				t.Fatalf("error = %v, want the failed decrement", err)
			}
			var gone []string
			for _, tok := range acquired {
				if _, err := clean.GetHolder(ctx, tok); errors.Is(err, lease.ErrLost) {
					gone = append(gone, tok)
				}
			}
			if len(gone) == 0 {
				t.Fatal("nothing was deleted")
			}
			if diff := cmp.Diff(gone, tokens(got), sorted); diff != "" {
				t.Errorf("deleted holders missing from the result (-deleted +returned):\n%s", diff)
			}
		})
	}
}
