package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
	"github.com/vancetope/lease-operator/internal/waitq"
)

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

// commands counts the store's round trips by command name.
type commands struct {
	mu sync.Mutex
	n  map[string]int
	// inFlight and waves count round trips as the caller waits for them: a command sent
	// while another is in flight adds no wave.
	inFlight, waves int
}

func (c *commands) flight(started bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !started {
		c.inFlight--
		return
	}
	if c.inFlight == 0 {
		c.waves++
	}
	c.inFlight++
}

// roundTrips is the number of waves so far.
func (c *commands) roundTrips() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waves
}

func (c *commands) observe(cmd string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[cmd]++
}

// writes and reads split the commands the store sends.
func (c *commands) counts() (reads, writes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for cmd, n := range c.n {
		switch cmd {
		case "update", "findAndModify", "insert", "delete":
			writes += n
		default:
			reads += n
		}
	}
	return reads, writes
}

func (c *commands) total() int {
	r, w := c.counts()
	return r + w
}

// leaseDef is a system-layer definition document (the system layer owns every field).
type leaseDef struct {
	name, resource                string
	user, project, tenant, global int32
	ttlSeconds, waitMs            int32
	fairness                      definition.Fairness // unset: the default
	maxPriority, ageBoundSeconds  int32
	// borrowing switches borrowing on with graceSeconds (docs/borrowing.md).
	borrowing    bool
	graceSeconds int32
}

func (d leaseDef) layer() definition.Layer {
	l := definition.Layer{Kind: definition.KindSystem, Source: "test " + d.name, Name: d.name,
		Tenant: definition.SystemTenant, Project: definition.TenantProject}
	set := func(v int32) *int32 {
		if v == 0 {
			return nil
		}
		return &v
	}
	if d.resource != "" {
		l.Resource = &d.resource
	}
	l.Levels = definition.Levels{Global: set(d.global), Tenant: set(d.tenant), Project: set(d.project), User: set(d.user)}
	l.TTLSeconds = set(d.ttlSeconds)
	l.WaitMs = set(d.waitMs)
	if d.waitMs == 0 {
		zero := int32(0)
		l.WaitMs = &zero
	}
	if d.fairness != "" {
		l.Fairness = &d.fairness
	}
	l.MaxPriority, l.PriorityAgeBoundSeconds = set(d.maxPriority), set(d.ageBoundSeconds)
	if d.borrowing {
		on, grace := true, d.graceSeconds
		l.Borrowing = definition.BorrowingLayer{Enabled: &on, GraceSeconds: &grace}
	}
	return l
}

// memSource is an in-memory definition.LayerSource.
type memSource struct {
	mu   sync.Mutex
	docs map[definition.LayerKey][]definition.Layer
	err  error
}

func newMemSource(defs ...leaseDef) *memSource {
	m := &memSource{docs: map[definition.LayerKey][]definition.Layer{}}
	for _, d := range defs {
		l := d.layer()
		k := definition.LayerKey{Name: l.Name, Tenant: l.Tenant, Project: l.Project}
		m.docs[k] = append(m.docs[k], l)
	}
	return m
}

func (m *memSource) Layers(_ context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	return m.docs[key], nil
}

func (m *memSource) SystemLayers(context.Context) ([]definition.Layer, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.err != nil {
		return nil, m.err
	}
	var out []definition.Layer
	for k, docs := range m.docs {
		if k.Kind() == definition.KindSystem {
			out = append(out, docs...)
		}
	}
	return out, nil
}

// set replaces the documents of d's key by d.
func (m *memSource) set(d leaseDef) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := d.layer()
	m.docs[definition.LayerKey{Name: l.Name, Tenant: l.Tenant, Project: l.Project}] = []definition.Layer{l}
}

func (m *memSource) fail(err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.err = err
}

// revoked is one call of the listener.
type revoked struct {
	reason  string
	holders []lease.Holder
}

// chanListener records revocations; with block set, each call waits until block is closed.
type chanListener struct {
	calls chan revoked
	block chan struct{}
}

func newListener() *chanListener { return &chanListener{calls: make(chan revoked, 16)} }

func (l *chanListener) Revoked(_ context.Context, reason string, holders []lease.Holder) {
	l.calls <- revoked{reason: reason, holders: holders}
	if l.block != nil {
		<-l.block
	}
}

var _ leasing.RevocationListener = (*chanListener)(nil)

// env is a service over a real store in a fresh database.
type env struct {
	store    *leasestore.Store
	cmds     *commands
	source   *memSource
	svc      *leasing.Service
	metrics  *metrics.Metrics
	listener *chanListener

	mu    sync.Mutex
	queue *waitq.Queue // the queue the store's grant hook wakes (envOpts.grants)
}

// grantTo makes the store's grant hook wake q's waiters.
func (e *env) grantTo(q *waitq.Queue) {
	e.mu.Lock()
	e.queue = q
	e.mu.Unlock()
}

type envOpts struct {
	clock      clock.WithTicker
	storeOpts  []leasestore.Option
	svcOpts    []leasing.Option
	uri        string
	noListener bool
	// grants: the store wakes the service's waiters of the slots it hands over (as
	// cmd/manager wires it); otherwise they learn at their safety looks.
	grants bool
}

func newEnv(t testing.TB, defs []leaseDef, o envOpts) *env {
	t.Helper()
	e := &env{cmds: &commands{}, source: newMemSource(defs...), listener: newListener()}
	uri := o.uri
	if uri == "" {
		var err error
		if uri, err = mongotest.URI(); err != nil {
			t.Fatalf("test MongoDB: %v", err)
		}
	}
	opts := append([]leasestore.Option{leasestore.WithCommandObserver(e.cmds.observe), leasestore.WithInFlightObserver(e.cmds.flight)}, o.storeOpts...)
	q := waitq.New()
	e.grantTo(q)
	if o.grants {
		opts = append(opts, leasestore.WithGrantHook(func(grants []leasestore.Grant) {
			e.mu.Lock()
			q := e.queue
			e.mu.Unlock()
			for _, g := range grants {
				q.Granted(g.ID, g.Key)
			}
		}))
	}
	s, err := leasestore.Connect(uri, mongotest.DatabaseName(t), opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	e.store = s
	if o.uri == "" {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := s.EnsureIndexes(ctx); err != nil {
			t.Fatalf("indexes: %v", err)
		}
		e.cmds.mu.Lock()
		e.cmds.n = nil
		e.cmds.mu.Unlock()
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if o.uri == "" {
			_ = s.Drop(ctx)
		}
		_ = s.Close(ctx)
	})
	e.metrics = metrics.New(prometheus.NewRegistry())
	var l leasing.RevocationListener = e.listener
	if o.noListener {
		l = nil
	}
	svcOpts := append([]leasing.Option{leasing.WithRevocationListener(l), leasing.WithClock(o.clock), leasing.WithMetrics(e.metrics), leasing.WithWaitQueue(q)}, o.svcOpts...)
	e.svc = leasing.NewService(s, definition.NewResolver(nil, e.source), leasing.NewStaticTypes("tex", "mcp"), svcOpts...)
	return e
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// stuckAfter is how long an acquisition may go on after its context ended before acquire
// calls it stuck.
const stuckAfter = 5 * time.Second

// errStuck is acquire's error for an acquisition that did not return.
var errStuck = errors.New("the acquisition did not return after its context ended")

// acquire is svc.Acquire bounded by ctx: an acquisition still running stuckAfter after ctx
// ended (a wait that ignores its context) returns errStuck, which the caller's check of the
// error reports, instead of hanging the package until go test's timeout; its goroutine is
// left behind. It reports nothing itself, so it is safe in goroutines that outlive a failed
// test.
func acquire(ctx context.Context, svc *leasing.Service, r leasing.Request) (leasing.Lease, error) {
	type result struct {
		l   leasing.Lease
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := svc.Acquire(ctx, r)
		done <- result{l, err}
	}()
	stuck := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(stuckAfter, func() { close(stuck) }) })
	defer stop()
	select {
	case res := <-done:
		return res.l, res.err
	case <-stuck:
		return leasing.Lease{}, fmt.Errorf("acquire %s for %s/%s/%s: still running %v after its context ended: %w",
			r.Lease, r.Tenant, r.Project, r.User, stuckAfter, errStuck)
	}
}

func req(name, tenant, project, user string) leasing.Request {
	return leasing.Request{Type: "tex", Lease: name, Tenant: tenant, Project: project, User: user,
		HolderRef: "job-1", Pod: lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"}, PodBound: true}
}

func waitFor(d time.Duration) *time.Duration { return &d }

func mustAcquire(t testing.TB, svc *leasing.Service, r leasing.Request) leasing.Lease {
	t.Helper()
	l, err := acquire(ctxT(t), svc, r)
	if err != nil {
		t.Fatalf("acquire %s for %s/%s/%s: %v", r.Lease, r.Tenant, r.Project, r.User, err)
	}
	return l
}

func asBusy(t testing.TB, err error) *lease.BusyError {
	t.Helper()
	var b *lease.BusyError
	if !errors.As(err, &b) || !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("error = %v, want *BusyError satisfying ErrBusy", err)
	}
	if errors.Is(err, lease.ErrUnavailable) {
		t.Fatalf("busy error %v also reports unavailable", err)
	}
	return b
}

// holdersAndCounters reads the store's state.
func holdersAndCounters(t testing.TB, s *leasestore.Store) ([]lease.Holder, []lease.Counter) {
	t.Helper()
	ctx := ctxT(t)
	hs, err := s.ListHolders(ctx, leasestore.HolderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := s.ListCounters(ctx, leasestore.CounterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return hs, cs
}

// assertNoDrift fails when a counter differs from the holders that book it, or exceeds cap.
func assertNoDrift(t testing.TB, s *leasestore.Store) {
	t.Helper()
	// At rest: the caller that a release served (a waiter handed the slot) can answer before
	// the release's other levels are given back, so the counters are read until they agree,
	// within waitfor's bound (seen once under load: a reclaimed borrower's tenant slot).
	end := waitfor.Deadline(t)
	for {
		var drift []string
		_, cs := holdersAndCounters(t, s)
		for _, c := range cs {
			if c.Drift() {
				drift = append(drift, fmt.Sprintf("counter %s: count %d, booked %d", c.Key, c.Count, c.Booked))
			}
		}
		if len(drift) == 0 {
			return
		}
		if time.Now().After(end) {
			t.Errorf("drift at rest after %v:\n%s", waitfor.Bound, strings.Join(drift, "\n"))
			return
		}
		time.Sleep(20 * time.Millisecond) // real time: polling the store, which has no change feed here
	}
}

func counter(c *prometheus.CounterVec, labels ...string) float64 {
	return testutil.ToFloat64(c.WithLabelValues(labels...))
}
