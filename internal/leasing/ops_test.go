package leasing_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
	"github.com/vancetope/lease-operator/internal/waitq"
)

func TestCheckIsLostAfterRevoke(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", global: 2, ttlSeconds: 60}}, envOpts{})
	ctx := ctxT(t)
	l := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	if err := e.svc.Check(ctx, l.Token); err != nil {
		t.Fatalf("check of a held lease: %v", err)
	}
	if _, ok, err := e.store.Revoke(ctx, l.Token, ""); err != nil || !ok {
		t.Fatalf("revoke: %v %v", ok, err)
	}
	err := e.svc.Check(ctx, l.Token)
	if !errors.Is(err, lease.ErrLost) || errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("check after revoke = %v, want lost", err)
	}
	if err := e.svc.UpdatePayload(ctx, l.Token, map[string]string{"jobId": "1"}); !errors.Is(err, lease.ErrLost) {
		t.Errorf("payload after revoke = %v, want lost", err)
	}
	if out, err := e.svc.Release(ctx, l.Token); err != nil || out != leasing.ReleaseAlreadyReleased {
		t.Errorf("release after revoke = %q, %v; want already-released", out, err)
	}
	if got := counter(e.metrics.Check, "tex2pdf", metrics.CheckOK); got != 1 {
		t.Errorf("check{tex2pdf,ok} = %v, want 1", got)
	}
	if got := counter(e.metrics.Check, "tex2pdf", metrics.CheckLost); got != 1 {
		t.Errorf("check{tex2pdf,lost} = %v, want 1", got)
	}
	// The lost check forgot the token: the release is labelled unknown.
	if got := counter(e.metrics.Release, leasing.LabelUnknown, metrics.ReleaseAlreadyReleased); got != 1 {
		t.Errorf("release{unknown,already-released} = %v, want 1", got)
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", global: 1, ttlSeconds: 60}}, envOpts{})
	ctx := ctxT(t)
	l := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	var outs []string
	for range 3 {
		out, err := e.svc.Release(ctx, l.Token)
		if err != nil {
			t.Fatal(err)
		}
		outs = append(outs, out)
	}
	want := []string{leasing.ReleaseOK, leasing.ReleaseAlreadyReleased, leasing.ReleaseAlreadyReleased}
	if diff := cmp.Diff(want, outs); diff != "" {
		t.Errorf("release outcomes (-want +got):\n%s", diff)
	}
	hs, cs := holdersAndCounters(t, e.store)
	if len(hs) != 0 || len(cs) != 1 || cs[0].Count != 0 {
		t.Errorf("after release: %d holders, counters %+v; want none held", len(hs), cs)
	}
	if got := counter(e.metrics.Release, "tex2pdf", metrics.ReleaseOK); got != 1 {
		t.Errorf("release{tex2pdf,ok} = %v, want 1", got)
	}
	if got := counter(e.metrics.Release, leasing.LabelUnknown, metrics.ReleaseAlreadyReleased); got != 2 {
		t.Errorf("release{unknown,already-released} = %v, want 2", got)
	}
}

func TestUpdatePayload(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", global: 1, ttlSeconds: 60}}, envOpts{})
	ctx := ctxT(t)
	l := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	if err := e.svc.UpdatePayload(ctx, l.Token, map[string]string{"jobId": "j-42", "Mcp-Session-Id": "s"}); err != nil {
		t.Fatal(err)
	}
	h, err := e.store.GetHolder(ctx, l.Token)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(map[string]string{"jobId": "j-42", "Mcp-Session-Id": "s"}, h.Payload); diff != "" {
		t.Errorf("stored payload (-want +got):\n%s", diff)
	}
	bad := map[string]map[string]string{
		"dotted key":  {"a.b": "x"},
		"dollar key":  {"$set": "x"},
		"huge value":  {"k": strings.Repeat("x", leasing.MaxPayloadValueBytes+1)},
		"too many":    manyEntries(leasing.MaxPayloadEntries + 1),
		"invalid utf": {"k": "\xff"},
	}
	for name, p := range bad {
		err := e.svc.UpdatePayload(ctx, l.Token, p)
		var inv *lease.InvalidError
		if !errors.As(err, &inv) || inv.Field != "payload" {
			t.Errorf("%s: update = %v, want invalid payload", name, err)
		}
	}
	h2, err := e.store.GetHolder(ctx, l.Token)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(h.Payload, h2.Payload); diff != "" {
		t.Errorf("a rejected update changed the payload:\n%s", diff)
	}
}

func manyEntries(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m["k"+strings.Repeat("x", i)] = "v"
	}
	return m
}

func TestInvalidRequestsWriteNothing(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", global: 1, user: 1, ttlSeconds: 60}}, envOpts{})
	mod := func(f func(*leasing.Request)) leasing.Request {
		r := req("tex", "acme", "p", "u")
		f(&r)
		return r
	}
	cases := map[string]struct {
		req       leasing.Request
		wantField string
	}{
		"no type":             {mod(func(r *leasing.Request) { r.Type = "" }), "type"},
		"unregistered type":   {mod(func(r *leasing.Request) { r.Type = "pdf" }), "type"},
		"bad lease name":      {mod(func(r *leasing.Request) { r.Lease = "../etc" }), "lease"},
		"long lease name":     {mod(func(r *leasing.Request) { r.Lease = strings.Repeat("a", 65) }), "lease"},
		"lease and inline":    {mod(func(r *leasing.Request) { r.Inline = &definition.InlineSpec{Name: "x"} }), "inline"},
		"no tenant":           {mod(func(r *leasing.Request) { r.Tenant = "" }), "tenant"},
		"bad tenant":          {mod(func(r *leasing.Request) { r.Tenant = "a|b" }), "tenant"},
		"no project":          {mod(func(r *leasing.Request) { r.Project = "" }), "project"},
		"bad project":         {mod(func(r *leasing.Request) { r.Project = "p/q" }), "project"},
		"system tenant":       {mod(func(r *leasing.Request) { r.Tenant = definition.SystemTenant }), "tenant"},
		"tenant-wide project": {mod(func(r *leasing.Request) { r.Project = definition.TenantProject }), "project"},
		"inline, tenant-wide project": {mod(func(r *leasing.Request) {
			r.Lease, r.Project, r.Inline = "", definition.TenantProject, &definition.InlineSpec{Name: "b", Levels: definition.Levels{Project: ptr(int32(1))}}
		}), "project"},
		"bad user":           {mod(func(r *leasing.Request) { r.User = "u/v" }), "user"},
		"user level no user": {mod(func(r *leasing.Request) { r.User = "" }), "user"},
		"holderRef control":  {mod(func(r *leasing.Request) { r.HolderRef = "a\nb" }), "holderRef"},
		"holderRef long":     {mod(func(r *leasing.Request) { r.HolderRef = strings.Repeat("h", 257) }), "holderRef"},
		"bad pod":            {mod(func(r *leasing.Request) { r.Pod.Name = "Pod_A" }), "pod"},
		"payload key":        {mod(func(r *leasing.Request) { r.Payload = map[string]string{"a.b": "c"} }), "payload"},
		"payload too many":   {mod(func(r *leasing.Request) { r.Payload = manyEntries(33) }), "payload"},
		"negative wait":      {mod(func(r *leasing.Request) { r.Wait = waitFor(-time.Second) }), "waitMs"},
		"inline global cap": {mod(func(r *leasing.Request) {
			r.Lease, r.Inline = "", &definition.InlineSpec{Name: "b", Levels: definition.Levels{Global: ptr(int32(3))}}
		}), "inline.levels.global"},
		"inline resource": {mod(func(r *leasing.Request) {
			r.Lease, r.Inline = "", &definition.InlineSpec{Name: "b", Resource: ptr("tex2pdf")}
		}), "inline.resource"},
		"inline without name": {mod(func(r *leasing.Request) { r.Lease, r.Inline = "", &definition.InlineSpec{} }), "inline.name"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := acquire(ctxT(t), e.svc, tc.req)
			var inv *lease.InvalidError
			if !errors.As(err, &inv) || !errors.Is(err, lease.ErrInvalid) {
				t.Fatalf("acquire = %v, want *InvalidError", err)
			}
			if inv.Field != tc.wantField {
				t.Errorf("field = %q, want %q (%v)", inv.Field, tc.wantField, err)
			}
		})
	}
	if n := e.cmds.total(); n != 0 {
		t.Errorf("invalid requests sent %d store commands, want none", n)
	}
	if hs, cs := holdersAndCounters(t, e.store); len(hs) != 0 || len(cs) != 0 {
		t.Errorf("invalid requests left %d holders and %d counters", len(hs), len(cs))
	}
	for _, op := range []func(string) error{
		func(tok string) error { return e.svc.Check(ctxT(t), tok) },
		func(tok string) error { _, err := e.svc.Release(ctxT(t), tok); return err },
		func(tok string) error { return e.svc.UpdatePayload(ctxT(t), tok, nil) },
	} {
		if err := op("not a token!"); !errors.Is(err, lease.ErrInvalid) {
			t.Errorf("operation on a malformed token = %v, want invalid", err)
		}
	}
}

// lookCounter wraps the store and counts the waiters' looks (Resume with look) and the
// writes sent while they ran.
type lookCounter struct {
	leasing.Store
	cmds         *commands
	mu           sync.Mutex
	looks        int
	writesInLook int
	looked       chan struct{}
}

func (c *lookCounter) Resume(ctx context.Context, req leasestore.AcquireRequest, granted string, look bool) (lease.Holder, error) {
	_, w := c.cmds.counts()
	h, err := c.Store.Resume(ctx, req, granted, look)
	if look {
		_, w2 := c.cmds.counts()
		c.mu.Lock()
		c.looks++
		c.writesInLook += w2 - w
		c.mu.Unlock()
		select {
		case c.looked <- struct{}{}:
		default:
		}
	}
	return h, err
}

// TestWaitingCosts counts the commands of a waiting acquisition against the real store.
// While the level stays full, each safety look costs two writes (the waiter's renewal and
// one try of the level); the sweep and the repair of the level only read, at most once per
// sweep interval. A release hands the slot to the waiter, which is answered at once, not at
// its next look: the contended grant is four commands in three round trips, the release's
// mark and, beside it, the fence of the grant (docs/fencing.md), then naming the waiter, which
// completes its acquisition at its last level, and moving the releaser's entry to it
// (docs/waiting.md, "Cost"); the waiter, woken in this process, answers without a store call.
func TestWaitingCosts(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", global: 1, ttlSeconds: 3600, waitMs: 60000}}, envOpts{grants: true})
	lc := &lookCounter{Store: e.store, cmds: e.cmds, looked: make(chan struct{}, 1)}
	q := waitq.New()
	e.svc = leasing.NewService(lc, definition.NewResolver(nil, e.source), leasing.NewStaticTypes("tex"),
		leasing.WithWaitQueue(q), leasing.WithMetrics(e.metrics),
		leasing.WithSafetyTimer(200*time.Millisecond), leasing.WithSweepInterval(time.Hour))
	e.grantTo(q)
	held := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))

	type result struct {
		l   leasing.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := acquire(ctxT(t), e.svc, req("tex", "acme", "p", "v"))
		done <- result{l, err}
	}()
	const looks = 5
	for range looks {
		waitfor.Receive(t, lc.looked, "a safety look")
	}
	lc.mu.Lock()
	n, writes := lc.looks, lc.writesInLook
	lc.mu.Unlock()
	t.Logf("%d looks at a full level: %d writes", n, writes)
	if writes != 2*n {
		t.Errorf("%d looks wrote %d times, want 2 each (renewal, one try)", n, writes)
	}

	// Right after a look: the next one is at least 150 ms away, and the sweep is not due.
	waitfor.Receive(t, lc.looked, "a safety look")
	reads0, writes0 := e.cmds.counts()
	waves0 := e.cmds.roundTrips()
	if out, err := e.svc.Release(ctxT(t), held.Token); err != nil || out != leasing.ReleaseOK {
		t.Fatalf("release: %q %v", out, err)
	}
	r := waitfor.Receive(t, done, "the waiter answered after the hand-over")
	if r.err != nil {
		t.Fatalf("acquire after the slot was handed over: %v", r.err)
	}
	reads1, writes1 := e.cmds.counts()
	if n := reads1 - reads0 + writes1 - writes0; n != 4 {
		t.Errorf("release and hand-over sent %d commands (%d reads, %d writes), want 4", n, reads1-reads0, writes1-writes0)
	}
	if rt := e.cmds.roundTrips() - waves0; rt != 3 {
		t.Errorf("release and hand-over took %d round trips, want 3 (the fence beside the mark)", rt)
	}
	if r.l.Fence <= held.Fence {
		t.Errorf("the waiter's fence %d, its predecessor's %d: want it higher", r.l.Fence, held.Fence)
	}
	if len(r.l.Levels) != 1 || r.l.Levels[0].Level != lease.LevelGlobal {
		t.Errorf("the waiter's answer books %+v, want the global level", r.l.Levels)
	}
	if err := e.svc.Check(ctxT(t), r.l.Token); err != nil {
		t.Errorf("check of the lease handed over: %v", err)
	}
	assertNoDrift(t, e.store)
}

// TestAHundredYearWaitKeepsLooking: a pod waits for its lease without bound (podadmit: a
// hundred years). Its waiter looks at the store every safety period all the same, so that it
// renews its place and takes a slot freed without a hand-over. (Three quarters of a hundred
// years, computed as d*3/4, overflowed: the waiter looked once and then never again, its place
// lapsed, and a slot given back meanwhile stayed free while it waited; make run showed it.)
func TestAHundredYearWaitKeepsLooking(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", global: 1, ttlSeconds: 3600, waitMs: 60000}}, envOpts{grants: true})
	lc := &lookCounter{Store: e.store, cmds: e.cmds, looked: make(chan struct{}, 1)}
	q := waitq.New()
	e.svc = leasing.NewService(lc, definition.NewResolver(nil, e.source), leasing.NewStaticTypes("tex"),
		leasing.WithWaitQueue(q), leasing.WithSafetyTimer(100*time.Millisecond), leasing.WithSweepInterval(time.Hour))
	e.grantTo(q)
	mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	r := req("tex", "acme", "p", "v")
	r.WaitFor = waitFor(100 * 365 * 24 * time.Hour)
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	go func() { _, _ = e.svc.Acquire(ctx, r) }()
	for range 3 {
		waitfor.Receive(t, lc.looked, "a look of the waiter")
	}
}

func TestTokenLabelsNeedNoStoreRead(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", global: 3, ttlSeconds: 60}}, envOpts{})
	l := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	before := e.cmds.total()
	if err := e.svc.Check(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}
	if n := e.cmds.total() - before; n != 1 {
		t.Errorf("check sent %d commands, want exactly the touch", n)
	}
	if got := counter(e.metrics.Check, "tex2pdf", metrics.CheckOK); got != 1 {
		t.Errorf("check{tex2pdf,ok} = %v, want 1", got)
	}
	// Another process (service) did not hand out the token: label unknown.
	other := leasing.NewService(e.store, definition.NewResolver(nil, e.source), leasing.NewStaticTypes("tex"), leasing.WithMetrics(e.metrics))
	if err := other.Check(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}
	if got := counter(e.metrics.Check, leasing.LabelUnknown, metrics.CheckOK); got != 1 {
		t.Errorf("check{unknown,ok} = %v, want 1", got)
	}
}

// TestBoundedResourceLabels: only resources that were booked get a label value of their
// own; lease names a caller invents (NOOPs) cannot use up the slots of real resources.
func TestBoundedResourceLabels(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", global: 3, ttlSeconds: 60}},
		envOpts{svcOpts: []leasing.Option{leasing.WithMaxResourceLabels(2)}})
	for _, name := range []string{"a", "b", "c", "d", "a"} {
		mustAcquire(t, e.svc, req(name, "acme", "p", "u")) // no documents: NOOP
	}
	mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))
	for _, c := range []struct {
		label, outcome string
		want           float64
	}{
		{leasing.LabelOther, metrics.AcquireNoop, 5},
		{"a", metrics.AcquireNoop, 0},
		{"tex2pdf", metrics.AcquireSuccess, 1},
	} {
		if got := counter(e.metrics.Acquire, c.label, c.outcome); got != c.want {
			t.Errorf("acquire{%s,%s} = %v, want %v", c.label, c.outcome, got, c.want)
		}
	}
}
