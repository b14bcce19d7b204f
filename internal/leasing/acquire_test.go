package leasing_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

func ptr[T any](v T) *T { return &v }

func TestNoopLeaseHasNoStoreTraffic(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "uncapped", ttlSeconds: 60}}, envOpts{})
	cases := map[string]leasing.Request{
		"reference none":         req("none", "acme", "p", "u"),
		"empty reference":        req("", "acme", "p", "u"),
		"definition without cap": req("uncapped", "acme", "p", "u"),
		"name without documents": req("nowhere", "acme", "p", "u"),
		"inline without cap": func() leasing.Request {
			r := req("", "acme", "p", "u")
			r.Inline = &definition.InlineSpec{Name: "browser", TTLSeconds: ptr(int32(30))}
			return r
		}(),
	}
	for name, r := range cases {
		t.Run(name, func(t *testing.T) {
			l, err := acquire(ctxT(t), e.svc, r)
			if err != nil {
				t.Fatalf("acquire: %v", err)
			}
			if !l.NoOp || l.Token != "" || len(l.Levels) != 0 {
				t.Errorf("lease = %+v, want a NOOP lease", l)
			}
		})
	}
	if n := e.cmds.total(); n != 0 {
		t.Errorf("NOOP acquisitions sent %d store commands (%v), want none", n, e.cmds.n)
	}
	if got := counter(e.metrics.Acquire, leasing.LabelNone, metrics.AcquireNoop); got != 2 {
		t.Errorf("acquire{resource=none,outcome=noop} = %v, want 2", got)
	}
	if got := counter(e.metrics.Acquire, leasing.LabelInline, metrics.AcquireNoop); got != 1 {
		t.Errorf("acquire{resource=mcp-inline,outcome=noop} = %v, want 1", got)
	}
}

func TestBusyNamesTheFullLevel(t *testing.T) {
	// Each case caps one level at 1 and the others generously; the second acquisition
	// shares only the capped level's scope with the first.
	cases := map[string]struct {
		def        leaseDef
		second     leasing.Request
		wantLevel  lease.Level
		wantScope  string
		wantBooked []string
	}{
		"user": {
			def:       leaseDef{user: 1, project: 9, tenant: 9, global: 9},
			second:    req("r", "acme", "other-project", "alice"),
			wantLevel: lease.LevelUser, wantScope: "acme/alice",
		},
		"project": {
			def:       leaseDef{user: 9, project: 1, tenant: 9, global: 9},
			second:    req("r", "acme", "p1", "bob"),
			wantLevel: lease.LevelProject, wantScope: "acme/p1",
		},
		"tenant": {
			def:       leaseDef{user: 9, project: 9, tenant: 1, global: 9},
			second:    req("r", "acme", "p2", "bob"),
			wantLevel: lease.LevelTenant, wantScope: "acme",
		},
		"global": {
			def:       leaseDef{user: 9, project: 9, tenant: 9, global: 1},
			second:    req("r", "globex", "p1", "alice"),
			wantLevel: lease.LevelGlobal, wantScope: lease.GlobalScope,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			tc.def.name, tc.def.resource, tc.def.ttlSeconds = "r", "res-"+name, 60
			e := newEnv(t, []leaseDef{tc.def}, envOpts{})
			first := mustAcquire(t, e.svc, req("r", "acme", "p1", "alice"))
			if len(first.Levels) != 4 || first.Levels[0].Level != lease.LevelUser || first.Levels[3].Level != lease.LevelGlobal {
				t.Errorf("levels = %+v, want all four narrow to wide", first.Levels)
			}
			_, err := acquire(ctxT(t), e.svc, tc.second)
			b := asBusy(t, err)
			want := lease.BusyError{Resource: "res-" + name, Level: tc.wantLevel, Scope: tc.wantScope, Count: 1, Cap: 1, Explained: true}
			got := *b
			got.Waited, got.Err = 0, nil
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("busy diagnosis (-want +got):\n%s", diff)
			}
			hs, _ := holdersAndCounters(t, e.store)
			if len(hs) != 1 || hs[0].Token != first.Token {
				t.Errorf("holders after busy = %d, want only the first", len(hs))
			}
			assertNoDrift(t, e.store)
		})
	}
}

func TestCapOneIsExclusive(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "ws", global: 1, ttlSeconds: 60}}, envOpts{})
	const clients = 6
	var wg sync.WaitGroup
	var won, busy atomic.Int32
	tokens := make(chan string, clients)
	for i := range clients {
		wg.Go(func() {
			r := req("ws", "acme", "p", "u")
			r.HolderRef = string(rune('a' + i))
			l, err := acquire(ctxT(t), e.svc, r)
			switch {
			case err == nil:
				won.Add(1)
				tokens <- l.Token
			case errors.Is(err, lease.ErrBusy):
				busy.Add(1)
			default:
				t.Errorf("acquire: %v", err)
			}
		})
	}
	waitfor.Group(t, &wg, "the competing acquisitions")
	close(tokens)
	if won.Load() != 1 || busy.Load() != clients-1 {
		t.Fatalf("won %d, busy %d; want exactly one holder of a cap-1 lease", won.Load(), busy.Load())
	}
	assertNoDrift(t, e.store)
	tok := <-tokens
	if _, err := acquire(ctxT(t), e.svc, req("ws", "acme", "p", "u")); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire while held = %v, want busy", err)
	}
	if out, err := e.svc.Release(ctxT(t), tok); err != nil || out != leasing.ReleaseOK {
		t.Fatalf("release = %q, %v", out, err)
	}
	mustAcquire(t, e.svc, req("ws", "acme", "p", "u"))
}

func TestWaitingSucceedsWhenASlotFrees(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", project: 1, ttlSeconds: 60, waitMs: 10000}}, envOpts{})
	held := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))

	type result struct {
		l   leasing.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := acquire(ctxT(t), e.svc, req("tex", "acme", "p", "other"))
		done <- result{l, err}
	}()
	// Released once the acquisition waits (the gauge counts it), not after a guessed pause.
	waitfor.Until(t, "the second acquisition waits", func() bool {
		return testutil.ToFloat64(e.metrics.Waiting.WithLabelValues("tex2pdf")) == 1
	})
	select {
	case r := <-done:
		t.Fatalf("acquired while the slot was held: %+v %v", r.l, r.err)
	default:
	}
	if _, err := e.svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatalf("release: %v", err)
	}
	start := time.Now()
	r := waitfor.Receive(t, done, "the waiting acquisition")
	elapsed := time.Since(start)
	if r.err != nil {
		t.Fatalf("waiting acquire: %v", r.err)
	}
	if r.l.Token == "" || r.l.Token == held.Token || r.l.Resource != "tex2pdf" {
		t.Errorf("lease = %+v", r.l)
	}
	// The waiter is woken by the release, not by its safety timer (1 s by default, 10 s wait).
	if elapsed > 5*time.Second {
		t.Errorf("acquired %v after the release, want soon after it", elapsed)
	}
	assertNoDrift(t, e.store)
	if got := counter(e.metrics.Acquire, "tex2pdf", metrics.AcquireSuccess); got != 2 {
		t.Errorf("acquire success = %v, want 2", got)
	}
}

func TestWaitDeadline(t *testing.T) {
	const slack = 1500 * time.Millisecond
	cases := map[string]struct {
		defWait  int32
		reqWait  *time.Duration
		ctxAfter time.Duration // ctx deadline
		cancel   time.Duration // ctx cancelled after
		want     time.Duration // lower bound of the wait
		wantErr  error         // the busy error also wraps this
	}{
		"definition wait":             {defWait: 400, want: 400 * time.Millisecond},
		"request shortens":            {defWait: 10000, reqWait: waitFor(300 * time.Millisecond), want: 300 * time.Millisecond},
		"request cannot lengthen":     {defWait: 300, reqWait: waitFor(20 * time.Second), want: 300 * time.Millisecond},
		"zero wait is one attempt":    {defWait: 10000, reqWait: waitFor(0)},
		"context deadline shortens":   {defWait: 10000, ctxAfter: 400 * time.Millisecond, wantErr: context.DeadlineExceeded},
		"context cancel stops a wait": {defWait: 10000, cancel: 300 * time.Millisecond, wantErr: context.Canceled},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: tc.defWait}}, envOpts{})
			mustAcquire(t, e.svc, req("x", "acme", "p", "u"))
			ctx := ctxT(t)
			bound := tc.want
			if tc.ctxAfter > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithTimeout(ctx, tc.ctxAfter)
				defer cancel()
				bound = tc.ctxAfter
			}
			if tc.cancel > 0 {
				var cancel context.CancelFunc
				ctx, cancel = context.WithCancel(ctx)
				time.AfterFunc(tc.cancel, cancel)
				bound = tc.cancel
			}
			r := req("x", "acme", "p", "v")
			r.Wait = tc.reqWait
			start := time.Now()
			_, err := acquire(ctx, e.svc, r)
			elapsed := time.Since(start)
			b := asBusy(t, err)
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("busy error %v does not wrap %v", err, tc.wantErr)
			}
			if elapsed < tc.want || b.Waited < tc.want {
				t.Errorf("busy after %v (waited %v), want not before %v", elapsed, b.Waited, tc.want)
			}
			if elapsed > bound+slack {
				t.Errorf("busy after %v, want within %v", elapsed, bound+slack)
			}
			if b.Level != lease.LevelGlobal || b.Count != 1 || b.Cap != 1 {
				t.Errorf("diagnosis = %+v", b)
			}
			if got := counter(e.metrics.Acquire, "x", metrics.AcquireBusy); got != 1 {
				t.Errorf("acquire busy = %v, want 1", got)
			}
			assertNoDrift(t, e.store)
		})
	}
}

func TestUnavailableFailsClosed(t *testing.T) {
	t.Run("store down", func(t *testing.T) {
		e := newEnv(t, []leaseDef{{name: "x", global: 3, ttlSeconds: 60, waitMs: 5000}},
			envOpts{uri: "mongodb://127.0.0.1:1/?connectTimeoutMS=300", storeOpts: []leasestore.Option{leasestore.WithOpTimeout(300 * time.Millisecond)}})
		ctx := ctxT(t)
		start := time.Now()
		_, err := acquire(ctx, e.svc, req("x", "acme", "p", "u"))
		if !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrBusy) {
			t.Fatalf("acquire with the store down = %v, want unavailable", err)
		}
		var ue *lease.UnavailableError
		if !errors.As(err, &ue) {
			t.Errorf("error %T is not an *UnavailableError", err)
		}
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("acquire took %v with the store down; fail fast, not after the wait", d)
		}
		if err := e.svc.Check(ctx, "0123456789abcdef0123456789abcdef"); !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrLost) {
			t.Errorf("check with the store down = %v, want unavailable", err)
		}
		out, err := e.svc.Release(ctx, "0123456789abcdef0123456789abcdef")
		if out != leasing.ReleaseError || !errors.Is(err, lease.ErrUnavailable) {
			t.Errorf("release with the store down = %q, %v; want error, unavailable", out, err)
		}
		// Never booked here: no label value of its own (TestBoundedResourceLabels).
		if got := counter(e.metrics.Acquire, leasing.LabelOther, metrics.AcquireUnavailable); got != 1 {
			t.Errorf("acquire unavailable = %v, want 1", got)
		}
		if got := counter(e.metrics.Release, leasing.LabelUnknown, metrics.ReleaseError); got != 1 {
			t.Errorf("release error = %v, want 1", got)
		}
	})
	t.Run("definition unreadable", func(t *testing.T) {
		e := newEnv(t, []leaseDef{{name: "x", global: 3, ttlSeconds: 60}}, envOpts{})
		e.source.fail(errors.New("apiserver gone"))
		_, err := acquire(ctxT(t), e.svc, req("x", "acme", "p", "u"))
		var ue *definition.UnavailableError
		if !errors.Is(err, lease.ErrUnavailable) || !errors.As(err, &ue) {
			t.Fatalf("acquire with a broken layer = %v, want unavailable", err)
		}
		if n := e.cmds.total(); n != 0 {
			t.Errorf("sent %d store commands with a broken definition", n)
		}
		if got := counter(e.metrics.Acquire, leasing.LabelOther, metrics.AcquireUnavailable); got != 1 {
			t.Errorf("acquire unavailable = %v, want 1", got)
		}
	})
}

func TestInlineDefinition(t *testing.T) {
	e := newEnv(t, nil, envOpts{})
	r := req("", "acme", "p", "u")
	r.Type = "mcp"
	r.Inline = &definition.InlineSpec{Name: "browser", Levels: definition.Levels{User: ptr(int32(1))}, TTLSeconds: ptr(int32(30))}
	l := mustAcquire(t, e.svc, r)
	if l.Resource != "mcp-inline:acme/p/browser" || l.TTL != 30*time.Second {
		t.Errorf("inline lease = %+v", l)
	}
	r.Wait = waitFor(0)
	if _, err := acquire(ctxT(t), e.svc, r); !errors.Is(err, lease.ErrBusy) {
		t.Errorf("second inline acquire = %v, want busy", err)
	}
	// Tenant IDs never become label values.
	if got := counter(e.metrics.Acquire, leasing.LabelInline, metrics.AcquireSuccess); got != 1 {
		t.Errorf("acquire{mcp-inline,success} = %v, want 1", got)
	}
	if err := e.svc.Check(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}
	if got := counter(e.metrics.Check, leasing.LabelInline, metrics.CheckOK); got != 1 {
		t.Errorf("check{mcp-inline,ok} = %v, want 1", got)
	}
	// Priorities are the system layer's to allow: an inline definition, a project's, has
	// none (docs/design.md, "Inline definitions").
	r.Priority = 1
	_, err := acquire(ctxT(t), e.svc, r)
	var inv *lease.InvalidError
	if !errors.As(err, &inv) || inv.Field != "priority" || !strings.Contains(inv.Detail, "maximum 0") {
		t.Errorf("inline acquire with priority 1 = %v, want invalid priority naming the maximum 0", err)
	}
}

func TestLazyIdleSweepHandsHoldersToTheListener(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "idle", global: 1, ttlSeconds: 1, waitMs: 0}}, envOpts{})
	e.listener.block = make(chan struct{}) // a slow handler must not hold up the acquisition
	defer close(e.listener.block)
	stale := mustAcquire(t, e.svc, req("idle", "acme", "p", "u"))
	if _, err := acquire(ctxT(t), e.svc, req("idle", "acme", "p", "v")); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire before the TTL = %v, want busy", err)
	}
	firstSweep := time.Now() // after it: the gate recorded that sweep at or before this
	select {
	case c := <-e.listener.calls:
		t.Fatalf("listener called before the TTL: %+v", c)
	default:
	}
	untilIdle(ctxT(t), t, e.store, stale.Token, time.Second) // on the server's clock
	// The sweep gate lets the resource be swept again one interval after the first sweep, or
	// once the holder that sweep saw goes idle on this process's clock, which lags the
	// server's by that sweep's latency; the next attempt would sweep, but this one has no wait
	// (seen once under load: busy 13 ms after the holder went idle on the server).
	waitfor.Until(t, "a sweep interval since the first sweep", func() bool {
		return time.Since(firstSweep) > leasing.DefaultSweepInterval
	})

	start := time.Now()
	fresh, err := acquire(ctxT(t), e.svc, req("idle", "acme", "p", "v"))
	if err != nil {
		t.Fatalf("acquire after the TTL = %v, want the idle holder swept", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("acquire took %v: it must not wait for the handler", d)
	}
	select {
	case c := <-e.listener.calls:
		if c.reason != "idle" || len(c.holders) != 1 || c.holders[0].Token != stale.Token || c.holders[0].Type != "tex" || !c.holders[0].PodBound {
			t.Errorf("listener got %s %+v, want the idle holder", c.reason, c.holders)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the listener never got the swept holder")
	}
	if err := e.svc.Check(ctxT(t), stale.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("check of the swept lease = %v, want lost", err)
	}
	if err := e.svc.Check(ctxT(t), fresh.Token); err != nil {
		t.Errorf("check of the new lease: %v", err)
	}
	// The listener (the dispatcher) counts reaps; the service must not count them twice.
	if got := counter(e.metrics.Reap, metrics.ReapIdle); got != 0 {
		t.Errorf("reap{idle} counted by the service = %v, want 0 with a listener", got)
	}
	assertNoDrift(t, e.store)
}

func TestLazySweepWithoutListenerOnlyLogs(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "idle", global: 1, ttlSeconds: 1, waitMs: 3000}}, envOpts{noListener: true})
	mustAcquire(t, e.svc, req("idle", "acme", "p", "u"))
	// Waits past the TTL: a repeated sweep while waiting frees the slot.
	if _, err := acquire(ctxT(t), e.svc, req("idle", "acme", "p", "v")); err != nil {
		t.Fatalf("acquire waiting past the idle TTL: %v", err)
	}
	// The sweep that freed the slot may be the one tend started on its own goroutine, which
	// counts after the store has handed the slot over (seen once under load).
	waitfor.Until(t, "the lazy sweep counts its reap", func() bool { return counter(e.metrics.Reap, metrics.ReapIdle) >= 1 })
	if got := counter(e.metrics.Reap, metrics.ReapIdle); got != 1 {
		t.Errorf("reap{idle} = %v, want 1", got)
	}
}

// An injected idle reaper (the agent's relay to the manager) replaces the store's ReapIdle in
// the lazy sweep, and is told the lease reference as well as the resource (the relay names
// the reference); the holders it returns still go to the listener.
func TestLazySweepUsesTheInjectedReaper(t *testing.T) {
	var mu sync.Mutex
	var swept []leasing.SweepTarget
	var e *env
	reaper := func(ctx context.Context, target leasing.SweepTarget) (leasestore.IdleSweep, int, error) {
		mu.Lock()
		swept = append(swept, target)
		mu.Unlock()
		sw, err := e.store.SweepIdle(ctx, target.Resource)
		return sw, 0, err
	}
	e = newEnv(t, []leaseDef{{name: "idle", global: 1, ttlSeconds: 1, waitMs: 3000}},
		envOpts{svcOpts: []leasing.Option{leasing.WithIdleReaper(reaper)}})
	stale := mustAcquire(t, e.svc, req("idle", "acme", "p", "u"))
	if _, err := acquire(ctxT(t), e.svc, req("idle", "acme", "p", "v")); err != nil {
		t.Fatalf("acquire waiting past the idle TTL: %v", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := leasing.SweepTarget{Resource: "idle", Tenant: "acme", Project: "p", Lease: "idle"}
	if len(swept) == 0 || swept[0] != want {
		t.Errorf("injected reaper swept %+v, want the busy resource and its reference %+v", swept, want)
	}
	select {
	case c := <-e.listener.calls:
		if len(c.holders) != 1 || c.holders[0].Token != stale.Token {
			t.Errorf("listener got %+v, want the idle holder", c.holders)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the listener never got the swept holder")
	}
}

// An inline lease's lazy sweep names the inline definition: the manager's relay builds its
// resource from the caller's own tenant (docs/security.md, "The sweep relay").
func TestLazySweepNamesTheInlineLease(t *testing.T) {
	var mu sync.Mutex
	var swept []leasing.SweepTarget
	reaper := func(_ context.Context, target leasing.SweepTarget) (leasestore.IdleSweep, int, error) {
		mu.Lock()
		defer mu.Unlock()
		swept = append(swept, target)
		return leasestore.IdleSweep{}, 0, nil
	}
	e := newEnv(t, nil, envOpts{svcOpts: []leasing.Option{leasing.WithIdleReaper(reaper)}})
	r := req("", "acme", "p", "u")
	r.Type = "mcp"
	r.Inline = &definition.InlineSpec{Name: "browser", Levels: definition.Levels{User: ptr(int32(1))}, TTLSeconds: ptr(int32(30))}
	mustAcquire(t, e.svc, r)
	r.Wait = waitFor(0)
	if _, err := acquire(ctxT(t), e.svc, r); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("second inline acquire = %v, want busy", err)
	}
	mu.Lock()
	defer mu.Unlock()
	want := []leasing.SweepTarget{{Resource: "mcp-inline:acme/p/browser", Tenant: "acme", Project: "p", Lease: "browser", Inline: true}}
	if diff := cmp.Diff(want, swept); diff != "" {
		t.Errorf("swept (-want +got):\n%s", diff)
	}
}

// TestLazySweepElsewhereRetriesAtOnce: when the injected reaper (the agent's relay to the
// manager) freed slots whose holders it dispatched itself, the acquisition retries at once:
// with waitMs 0 it gets the slot instead of answering BUSY.
func TestLazySweepElsewhereRetriesAtOnce(t *testing.T) {
	var e *env
	reaper := func(ctx context.Context, target leasing.SweepTarget) (leasestore.IdleSweep, int, error) {
		hs, err := e.store.ReapIdle(ctx, target.Resource) // "the manager" reaps and dispatches
		return leasestore.IdleSweep{}, len(hs), err
	}
	e = newEnv(t, []leaseDef{{name: "idle", global: 1, ttlSeconds: 1, waitMs: 0}},
		envOpts{svcOpts: []leasing.Option{leasing.WithIdleReaper(reaper)}})
	ctx := ctxT(t)
	stale := mustAcquire(t, e.svc, req("idle", "acme", "p", "u"))
	untilIdle(ctx, t, e.store, stale.Token, time.Second)
	if _, err := acquire(ctx, e.svc, req("idle", "acme", "p", "v")); err != nil {
		t.Fatalf("acquire with waitMs 0 after the relay freed the slot: %v", err)
	}
}

// TestSafetyTimerLooksAtTheNextIdleExpiry: a waiter's own look comes no later than the next
// idle expiry the lazy sweep saw, even with an hour-long sweep interval; that look's sweep
// reaps the holder gone idle, the store hands its slot to the waiter, and the hand-over wakes
// it. The service's clock is fake and is stepped once, past the expiry.
func TestSafetyTimerLooksAtTheNextIdleExpiry(t *testing.T) {
	clk := testingclock.NewFakeClock(time.Now())
	e := newEnv(t, []leaseDef{{name: "idle", global: 1, ttlSeconds: 1, waitMs: 60000}}, envOpts{clock: clk, grants: true,
		svcOpts: []leasing.Option{leasing.WithSafetyTimer(time.Hour), leasing.WithSweepInterval(time.Hour)}})
	ctx := waitfor.Context(t)
	stale := mustAcquire(t, e.svc, req("idle", "acme", "p", "u"))
	got := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, e.svc, req("idle", "acme", "p", "v"))
		got <- err
	}()
	// Tried, swept (the holder still fresh), waiting on its timer.
	waitfor.Until(t, "the acquisition waits on the clock", clk.HasWaiters)
	untilIdle(ctx, t, e.store, stale.Token, time.Second)
	clk.Step(1100 * time.Millisecond) // past the expiry, nowhere near the safety timer
	if err := waitfor.Receive(t, got, "the waiter's answer"); err != nil {
		t.Fatalf("waiter: %v, want the slot of the holder gone idle", err)
	}
}

// untilIdle returns once the holder's TTL has passed on the store's clock.
func untilIdle(ctx context.Context, t *testing.T, s *leasestore.Store, token string, ttl time.Duration) {
	t.Helper()
	h, err := s.GetHolder(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	waitfor.UntilEvery(t, 10*time.Millisecond, "the holder is idle on the store's clock", func() bool {
		now, err := s.ServerTime(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return now.After(h.LastSeenAt.Add(ttl))
	})
}
