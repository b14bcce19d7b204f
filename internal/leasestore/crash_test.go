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
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
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
	opts := append([]leasestore.Option{leasestore.WithSafetyMargin(margin)}, cleanOpts...)
	clean = newStoreAt(t, uri, db, opts...)
	faulty = newStoreAt(t, uri, db, leasestore.WithSafetyMargin(margin), leasestore.WithOpTimeout(300*time.Millisecond), leasestore.WithFault(fault))
	return faulty, clean
}

// TestCrashBetweenBookingAndRecordIsReapedAfterTTL: a process that dies after it booked a
// level and before its holder records it leaves a PENDING holder whose entry names it: the
// level counts it (no drift: the holder exists), and the idle reap a TTL later gives back
// every entry it has, the unrecorded one included.
func TestCrashBetweenBookingAndRecordIsReapedAfterTTL(t *testing.T) {
	faulty, clean := pair(t, time.Minute, crashAt(leasestore.StepBooked, "r|tenant|", leasestore.ErrCrash))
	keep := mustAcquire(t, clean, request("r", "acme", "p", "keep", allCaps(5, 5, 5, 5)))
	req := request("r", "acme", "p", "u", allCaps(5, 5, 5, 5))
	req.TTL = 300 * time.Millisecond
	if _, err := faulty.Acquire(context.Background(), req); !errors.Is(err, leasestore.ErrCrash) {
		t.Fatalf("acquire = %v, want the simulated crash", err)
	}
	if got := counts(t, clean)["r|tenant|acme"]; got != [2]int{2, 2} {
		t.Errorf("tenant counter = %v, want count 2, booked 2 (the crashed holder's entry names it)", got)
	}
	time.Sleep(req.TTL + 100*time.Millisecond) // real time: the holder's TTL passes on the store's clock
	if reaped, err := clean.ReapIdle(context.Background(), "r"); err != nil || len(reaped) != 1 {
		t.Fatalf("reap = %v, %v", tokens(reaped), err)
	}
	for k, v := range counts(t, clean) {
		want := [2]int{1, 1}
		if k == key("r", lease.LevelUser, "acme", "p", "u") {
			want = [2]int{0, 0}
		}
		if v != want {
			t.Errorf("counter %s = %v after the reap, want %v", k, v, want)
		}
	}
	if _, err := clean.GetHolder(context.Background(), keep.Token); err != nil {
		t.Errorf("the healthy holder: %v", err)
	}
}

// TestCrashMidReleaseIsDoneAgainBySweep: a process that dies after it marked its holder
// released, before its give-back, leaves the slots booked by a released holder: busy until
// the released holder expires (the releaser's operation timeout and a second), then the
// sweep does the give-back again.
func TestCrashMidReleaseIsDoneAgainBySweep(t *testing.T) {
	faulty, clean := pair(t, time.Minute, crashAt(leasestore.StepHolderReleased, "", leasestore.ErrCrash))
	h := mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
	if _, err := faulty.Release(context.Background(), h.Token); !errors.Is(err, leasestore.ErrCrash) {
		t.Fatalf("release = %v, want the simulated crash", err)
	}
	if _, err := clean.Acquire(context.Background(), request("r", "acme", "p", "u", allCaps(1, 1, 1, 1))); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire before the released holder expires = %v, want busy", err)
	}
	waitfor.Until(t, "the sweep gives the released holder's slots back", func() bool {
		if _, err := clean.ReapIdle(context.Background(), ""); err != nil {
			t.Fatal(err)
		}
		for _, v := range counts(t, clean) {
			if v[0] != 0 {
				return false
			}
		}
		return true
	})
	mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
}

// A store error mid-funnel rolls the attempt back at once: no reconcile needed.
func TestStoreErrorMidFunnelRollsBack(t *testing.T) {
	for _, step := range []leasestore.Step{leasestore.StepBooked, leasestore.StepLevelPushed} {
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
// and gives back its entries.
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

// TestReconcileRemovesOnlyEntriesOfGoneHolders: reconcile removes the entries whose holder is
// gone (a booking that arrived after its holder's release), leaves every other entry alone,
// and deletes a counter nobody has booked for the safety margin.
func TestReconcileRemovesOnlyEntriesOfGoneHolders(t *testing.T) {
	const margin = 300 * time.Millisecond
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	ctx := ctxT(t)
	clean := newStoreAt(t, uri, db, leasestore.WithSafetyMargin(margin))
	h := mustAcquire(t, clean, request("r", "acme", "p", "u", allCaps(2, 2, 2, 2)))
	tenantKey := key("r", lease.LevelTenant, "acme", "p", "u")
	if err := storetest.LateEntry(ctx, uri, db, tenantKey, "lh-00000000000000000000dead"); err != nil {
		t.Fatal(err)
	}
	if err := storetest.LateEntry(ctx, uri, db, "other|global|*", "lh-00000000000000000000beef"); err != nil {
		t.Fatal(err)
	}
	cs, err := clean.ListCounters(ctx, leasestore.CounterFilter{Resource: "r", Level: lease.LevelTenant})
	if err != nil || len(cs) != 1 || cs[0].Count != 2 || cs[0].Booked != 1 || len(cs[0].Gone) != 1 || !cs[0].Drift() {
		t.Fatalf("the tenant counter with a late entry: %+v, %v; want 2 entries, 1 booked, 1 gone", cs, err)
	}
	res, err := clean.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (leasestore.ReconcileResult{Repaired: 2, Corrected: 2}); res != want {
		t.Errorf("reconcile = %+v, want %+v", res, want)
	}
	for k, v := range counts(t, clean) {
		if want := [2]int{1, 1}; k != "other|global|*" && v != want {
			t.Errorf("counter %s = %v, want %v", k, v, want)
		}
	}
	time.Sleep(margin + 100*time.Millisecond) // real time: the safety margin passes on the store's clock
	res, err = clean.Reconcile(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if want := (leasestore.ReconcileResult{Deleted: 1}); res != want {
		t.Errorf("reconcile after the margin = %+v, want the emptied counter deleted", res)
	}
	if _, err := clean.GetHolder(ctx, h.Token); err != nil {
		t.Error(err)
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
	clean := newStoreAt(t, uri, db, leasestore.WithSafetyMargin(300*time.Millisecond))
	puri, target := proxiedURI(t, uri)
	proxy := newCutProxy(t, target)
	purl, _ := url.Parse(puri)
	purl.Host = proxy.ln.Addr().String()

	var cutMidFunnel sync.Once
	fault := func(step leasestore.Step, key string) error {
		if step == leasestore.StepBooked && strings.HasPrefix(key, "mid|") {
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
	// What the cut left behind (a pending holder with an entry it has not recorded) goes
	// with the holder, after which the slot is free again.
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
	if _, err := clean.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	assertNoDrift(t, clean)
	if err := s.Touch(ctx, h.Token); err != nil {
		t.Errorf("touch after the outage: %v", err)
	}
	mustAcquire(t, s, request("mid", "acme", "p", "u", allCaps(1, 1, 1, 1)))
}

// TestReconcileDuringReleaseDoesNotTakeTheSlotTwice: a reconcile that runs while a release
// is between its mark and its give-back finds the released holder's entries naming a holder
// that exists (its document goes only after them), so it leaves them to the give-back: a
// count-based repair lowered the counter there and the release then gave the slot back a
// second time.
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
	faulty, c := pair(t, -time.Hour, reconcileInTheWindow)
	clean = c
	caps := allCaps(2, 2, 2, 2)
	h1 := mustAcquire(t, clean, request("r", "acme", "p", "u", caps))
	mustAcquire(t, clean, request("r", "acme", "p", "u", caps))

	if ok, err := faulty.Release(context.Background(), h1.Token); err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	if len(passes) != 2 || passes[0].Corrected+passes[0].Deleted != 0 || passes[1].Corrected+passes[1].Deleted != 0 {
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

// TestReapReturnsHoldersWhoseGiveBackFailed: a holder that a reap or revoke released is in
// its result even when giving its slots back then failed; otherwise its handler never runs
// and revoke-pod under-reports. The give-back is done again by the sweep.
func TestReapReturnsHoldersWhoseGiveBackFailed(t *testing.T) {
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
			failDecrement := errors.New("give-back lost")
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
				t.Fatalf("error = %v, want the failed give-back", err)
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
