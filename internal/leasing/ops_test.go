package leasing_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
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
			_, err := e.svc.Acquire(ctxT(t), tc.req)
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

// TestWaitingCostsReadsNotWrites drives a waiting acquisition on a fake clock against the real
// store: while the level stays full every poll only reads; once the slot frees, one write
// attempt books it.
func TestWaitingCostsReadsNotWrites(t *testing.T) {
	fc := testingclock.NewFakeClock(time.Now())
	e := newEnv(t, []leaseDef{{name: "tex", project: 1, global: 5, ttlSeconds: 3600, waitMs: 60000}},
		envOpts{clock: fc, svcOpts: []leasing.Option{leasing.WithSafetyTimer(80 * time.Millisecond),
			// No renewal of the waiter's reservation within the test's 2.5 s of fake time.
			leasing.WithReservationTTL(time.Hour)}})
	held := mustAcquire(t, e.svc, req("tex", "acme", "p", "u"))

	type result struct {
		l   leasing.Lease
		err error
	}
	done := make(chan result, 1)
	_, writes0 := e.cmds.counts()
	go func() {
		l, err := e.svc.Acquire(ctxT(t), req("tex", "acme", "p", "v"))
		done <- result{l, err}
	}()
	// advance fires the pending poll timer once the acquisition sleeps on it.
	advance := func() {
		t.Helper()
		waitfor.Until(t, "the acquisition waits on the clock", fc.HasWaiters)
		fc.Step(100 * time.Millisecond)
	}
	advance() // first poll, after the first attempt and the first sweep
	reads1, writes1 := e.cmds.counts()
	firstAttemptWrites := writes1 - writes0
	const polls = 25 // 2.5 s of fake time: the sweep repeats twice in between
	for range polls {
		advance()
	}
	waitfor.Until(t, "the acquisition waits on the clock", fc.HasWaiters)
	reads2, writes2 := e.cmds.counts()
	t.Logf("first attempt: %d writes; %d polls of a full level: %d reads, %d writes", firstAttemptWrites, polls, reads2-reads1, writes2-writes1)
	if writes2 != writes1 {
		t.Errorf("%d polls of a full level wrote %d times, want 0", polls, writes2-writes1)
	}
	if perPoll := float64(reads2-reads1) / polls; perPoll < 1 || perPoll > 1.5 {
		t.Errorf("%.2f reads per poll, want about one probe (plus the periodic sweep)", perPoll)
	}
	if firstAttemptWrites == 0 {
		t.Errorf("the first attempt wrote nothing; it must try the funnel")
	}

	if out, err := e.svc.Release(ctxT(t), held.Token); err != nil || out != leasing.ReleaseOK {
		t.Fatalf("release: %q %v", out, err)
	}
	select {
	case r := <-done:
		t.Fatalf("acquisition ended before the next poll: %+v", r)
	default:
	}
	advance()
	if r := waitfor.Receive(t, done, "the acquisition taking the freed slot at the next poll"); r.err != nil {
		t.Fatalf("acquire after the slot freed: %v", r.err)
	}
	assertNoDrift(t, e.store)
	if n := counter(e.metrics.Acquire, "tex", metrics.AcquireSuccess); n != 2 {
		t.Errorf("acquire success = %v, want 2", n)
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
