package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
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

// process is one manager or agent: its own store client, wait queue, notifier and service,
// on a database shared with the other processes of the test.
type process struct {
	store    *leasestore.Store
	queue    *waitq.Queue
	source   *memSource // shared by the processes of a test
	resolver *definition.Resolver
	svc      *leasing.Service
	notifier *leasestore.Notifier
	stop     context.CancelFunc
	stopped  chan struct{}
}

type processOpts struct {
	// noEvents: the store neither wakes its own queue nor publishes (every wake-up is lost:
	// waiters learn of hand-overs at their safety looks).
	noEvents bool
	// noNotifier: no notifier follows the other processes' events.
	noNotifier bool
	safety     time.Duration
	clock      clock.WithTicker // nil: real
	storeOpts  []leasestore.Option
	// svcOpts adds service options to process i.
	svcOpts func(i int) []leasing.Option
}

// newProcesses starts n processes on one fresh database serving defs, each with its
// notifier following (unless disabled) before it returns.
func newProcesses(t *testing.T, n int, defs []leaseDef, o processOpts) []*process {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	return newProcessesAt(t, uri, mongotest.DatabaseName(t), n, defs, o)
}

func newProcessesAt(t *testing.T, uri, db string, n int, defs []leaseDef, o processOpts) []*process {
	t.Helper()
	source := newMemSource(defs...)
	ps := make([]*process, n)
	for i := range ps {
		p := &process{queue: waitq.New(), source: source, stopped: make(chan struct{})}
		opts := append([]leasestore.Option{}, o.storeOpts...)
		if !o.noEvents {
			opts = append(opts, leasestore.WithGrantHook(p.granted), leasestore.WithGrantEvents())
		}
		s, err := leasestore.Connect(uri, db, opts...)
		if err != nil {
			t.Fatal(err)
		}
		p.store = s
		if i == 0 {
			// With the store's default timeout: a test that shortens the processes' timeout
			// (to see the store cut) must not fail its setup on a loaded machine.
			setup, err := leasestore.Connect(uri, db)
			if err != nil {
				t.Fatal(err)
			}
			if err := setup.EnsureIndexes(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			_ = setup.Close(ctxT(t))
		}
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if i == 0 {
				_ = s.Drop(ctx)
			}
			_ = s.Close(ctx)
		})
		svcOpts := []leasing.Option{leasing.WithWaitQueue(p.queue)}
		if o.clock != nil {
			svcOpts = append(svcOpts, leasing.WithClock(o.clock))
		}
		if o.safety > 0 {
			svcOpts = append(svcOpts, leasing.WithSafetyTimer(o.safety))
		}
		if o.svcOpts != nil {
			svcOpts = append(svcOpts, o.svcOpts(i)...)
		}
		// As cmd/manager wires it: a definition change wakes the process's waiters.
		p.resolver = definition.NewResolver(nil, source)
		p.resolver.OnChange(func() { p.queue.WakeAll() })
		p.svc = leasing.NewService(s, p.resolver, leasing.NewStaticTypes("tex"),
			append(svcOpts, leasing.WithMetrics(metrics.New(prometheus.NewRegistry())))...)
		ctx, cancel := context.WithCancel(context.Background())
		p.stop = cancel
		if o.noNotifier {
			close(p.stopped)
		} else {
			p.notifier = leasestore.NewNotifier(s, p.granted, func() { p.queue.WakeAll() })
			go func() {
				defer close(p.stopped)
				p.notifier.Run(ctx)
			}()
		}
		t.Cleanup(func() {
			cancel()
			waitfor.Closed(t, p.stopped, "the notifier stopping")
		})
		ps[i] = p
	}
	for _, p := range ps {
		if p.notifier == nil {
			continue
		}
		waitfor.Until(t, "the notifier follows", func() bool { return p.notifier.Mode() != "" })
	}
	return ps
}

// granted wakes the process's waiters of grants, as cmd/manager wires it.
func (p *process) granted(grants []leasestore.Grant) {
	for _, g := range grants {
		p.queue.Granted(g.ID, g.Key)
	}
}

// untilBlocked returns once a waiter is in the line of the global level of resource.
func (p *process) untilBlocked(t *testing.T, resource string) {
	t.Helper()
	p.untilInLine(t, globalKey(resource), 1)
}

// untilInLine returns once n waiters are in the line of key.
func (p *process) untilInLine(t *testing.T, key string, n int) {
	t.Helper()
	waitfor.Until(t, fmt.Sprintf("%d waiters in the line of %s", n, key), func() bool { return p.inLine(t, key) == n })
}

// inLine is the length of key's line ("": all lines).
func (p *process) inLine(t *testing.T, key string) int {
	t.Helper()
	l, err := p.store.Line(ctxT(t), key)
	if err != nil {
		t.Fatal(err)
	}
	return len(l)
}

func podReq(name string, i int) leasing.Request {
	r := req(name, "acme", "p", fmt.Sprintf("u%d", i))
	r.Pod = lease.PodRef{Namespace: "ns", Name: fmt.Sprintf("pod-%d", i), UID: fmt.Sprintf("uid-%d", i)}
	return r
}

// capWatch reads the counters until stopped and records the highest count seen at each level.
func capWatch(t *testing.T, s *leasestore.Store) (stop func() map[lease.Level]int) {
	var mu sync.Mutex
	most := map[lease.Level]int{}
	done := make(chan struct{})
	finished := make(chan struct{})
	go func() {
		defer close(finished)
		for {
			select {
			case <-done:
				return
			default:
			}
			cs, err := s.ListCounters(t.Context(), leasestore.CounterFilter{})
			if err != nil {
				continue
			}
			mu.Lock()
			for _, c := range cs {
				most[c.Level] = max(most[c.Level], c.Count)
			}
			mu.Unlock()
		}
	}()
	return func() map[lease.Level]int {
		close(done)
		waitfor.Closed(t, finished, "the counter sampler stopping")
		mu.Lock()
		defer mu.Unlock()
		return maps.Clone(most)
	}
}

// TestWaitersInSeveralProcessesKeepTheInvariant runs holders in three processes looping
// acquire, hold, release on one resource, while further waiters crash: some give up mid-wait
// (their context ends), and one whole process stops (its notifier ends and its store closes)
// with waiters inside. No level ever exceeds its cap, every surviving holder gets in, and at
// rest the counters equal the booked holders.
func TestWaitersInSeveralProcessesKeepTheInvariant(t *testing.T) {
	const capacity, perProcess, rounds = 3, 4, 6
	ps := newProcesses(t, 4, []leaseDef{{name: "hot", global: capacity, ttlSeconds: 60, waitMs: 30000}},
		processOpts{})
	stopWatch := capWatch(t, ps[0].store)

	// The fourth process only has waiters that crash with it.
	doomed := ps[3]
	var doomedWG sync.WaitGroup
	for i := range 3 {
		doomedWG.Go(func() {
			r := podReq("hot", 100+i)
			if l, err := acquire(ctxT(t), doomed.svc, r); err == nil {
				_, _ = doomed.svc.Release(ctxT(t), l.Token)
			}
		})
	}

	var wg sync.WaitGroup
	var got atomic.Int64
	for pi, p := range ps[:3] {
		for c := range perProcess {
			id := pi*perProcess + c
			wg.Go(func() {
				for range rounds {
					l, err := acquire(ctxT(t), p.svc, podReq("hot", id))
					if err != nil {
						t.Errorf("holder %d: %v", id, err)
						return
					}
					got.Add(1)
					time.Sleep(time.Duration(id%4) * time.Millisecond) // real time: holders of different lengths against the real store
					if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
						t.Errorf("holder %d release: %v", id, err)
						return
					}
				}
			})
		}
		// A waiter that gives up mid-wait.
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Millisecond)
			defer cancel()
			if l, err := acquire(ctx, p.svc, podReq("hot", 200+pi)); err == nil {
				_, _ = p.svc.Release(ctxT(t), l.Token)
			} else if !errors.Is(err, lease.ErrBusy) {
				t.Errorf("waiter that gave up: %v, want busy", err)
			}
		})
	}
	// The fourth process dies while its waiters wait.
	doomed.stop()
	waitfor.Closed(t, doomed.stopped, "the doomed process's notifier stopping")
	_ = doomed.store.Close(ctxT(t))
	waitfor.Group(t, &doomedWG, "the waiters of the stopped process")

	waitfor.Group(t, &wg, "the holders")
	if most := stopWatch()[lease.LevelGlobal]; most > capacity {
		t.Errorf("a counter reached %d, cap %d", most, capacity)
	}
	if n := got.Load(); n != 3*perProcess*rounds {
		t.Errorf("%d acquisitions, want %d", n, 3*perProcess*rounds)
	}
	// The crashed process's waiters lapse (nobody renews them) and are passed over; what
	// they booked stays until they are reaped as idle, which is the reapers' business.
	// Only the crashed process may have left holders.
	hs, _ := holdersAndCounters(t, ps[0].store)
	for _, h := range hs {
		if h.Pod.Name < "pod-100" || h.Pod.Name > "pod-102" {
			t.Errorf("holder of %s left at rest", h.Pod.Name)
		}
	}
}

// TestLostWakeUpsCostOnlyTheSafetyTimer: no process learns of hand-overs (no grant hook, no
// events, no notifier). Every waiter still gets in before its deadline: at its safety look
// it finds the slot handed to it.
func TestLostWakeUpsCostOnlyTheSafetyTimer(t *testing.T) {
	const capacity, waiters = 2, 6
	ps := newProcesses(t, 2, []leaseDef{{name: "hot", global: capacity, ttlSeconds: 60, waitMs: 20000}},
		processOpts{noEvents: true, noNotifier: true, safety: 100 * time.Millisecond})
	var held []leasing.Lease
	for i := range capacity {
		held = append(held, mustAcquire(t, ps[0].svc, podReq("hot", i)))
	}
	var wg sync.WaitGroup
	for i := range waiters {
		wg.Go(func() {
			p := ps[i%2]
			l, err := acquire(ctxT(t), p.svc, podReq("hot", 10+i))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
	}
	for _, l := range held {
		if _, err := ps[0].svc.Release(ctxT(t), l.Token); err != nil {
			t.Fatal(err)
		}
	}
	waitfor.Group(t, &wg, "the waiters")
	assertNoDrift(t, ps[0].store)
}

// TestWaiterPastItsDeadlineIsBusyWithTheDiagnosis, also the second in line, and it leaves
// the line.
func TestWaiterPastItsDeadlineIsBusyWithTheDiagnosis(t *testing.T) {
	ps := newProcesses(t, 1, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 800}}, processOpts{})
	p := ps[0]
	mustAcquire(t, p.svc, podReq("x", 0))
	errs := make(chan error, 2)
	go func() { _, err := acquire(ctxT(t), p.svc, podReq("x", 1)); errs <- err }()
	// The second waiter starts once the first is blocked in the queue.
	p.untilBlocked(t, "x")
	go func() { _, err := acquire(ctxT(t), p.svc, podReq("x", 2)); errs <- err }()
	for range 2 {
		b := asBusy(t, waitfor.Receive(t, errs, "a waiter's answer"))
		if b.Level != lease.LevelGlobal || b.Count != 1 || b.Cap != 1 || b.Waited < 800*time.Millisecond {
			t.Errorf("diagnosis = %+v", b)
		}
	}
	p.untilInLine(t, "", 0)
}

// TestFIFOWithinAProcess: waiters in one level's line get the freed slots oldest first.
func TestFIFOWithinAProcess(t *testing.T) {
	const waiters = 5
	ps := newProcesses(t, 1, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000}},
		processOpts{})
	p := ps[0]
	l := mustAcquire(t, p.svc, podReq("x", 0))
	k := globalKey("x")
	order := make(chan int, waiters+1)
	var wg sync.WaitGroup
	for i := 1; i <= waiters; i++ {
		wg.Go(func() {
			l, err := acquire(ctxT(t), p.svc, podReq("x", i))
			if err != nil {
				t.Errorf("waiter %d: %v", i, err)
				return
			}
			order <- i
			if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
				t.Errorf("waiter %d release: %v", i, err)
			}
		})
		p.untilInLine(t, k, i)
	}
	if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}
	waitfor.Group(t, &wg, "the waiters")
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	for i, v := range got {
		if v != i+1 {
			t.Fatalf("order of entry %v, want 1..%d", got, waiters)
		}
	}
}

// cutter forwards TCP connections to a backend until cut: then it closes them all and
// refuses new ones, as a store that stops answering.
type cutter struct {
	ln      net.Listener
	backend string
	mu      sync.Mutex
	conns   []net.Conn
	cut     bool
}

func newCutter(t *testing.T, backend string) *cutter {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	c := &cutter{ln: ln, backend: backend}
	t.Cleanup(c.cutNow)
	go func() {
		for {
			in, err := ln.Accept()
			if err != nil {
				return
			}
			out, err := net.Dial("tcp", backend)
			if err != nil {
				_ = in.Close()
				continue
			}
			c.mu.Lock()
			if c.cut {
				c.mu.Unlock()
				_ = in.Close()
				_ = out.Close()
				continue
			}
			c.conns = append(c.conns, in, out)
			c.mu.Unlock()
			go func() { _, _ = io.Copy(out, in); _ = out.Close() }()
			go func() { _, _ = io.Copy(in, out); _ = in.Close() }()
		}
	}()
	return c
}

func (c *cutter) uri() string { return "mongodb://" + c.ln.Addr().String() + "/?directConnection=true" }

func (c *cutter) cutNow() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cut = true
	_ = c.ln.Close()
	for _, conn := range c.conns {
		_ = conn.Close()
	}
}

// TestStoreDownWhileWaitingIsUnavailable: the store stops answering once the waiter is
// blocked. It answers LEASE_UNAVAILABLE, never LEASE_BUSY: with a deadline beyond its safety
// timer and with one before it. The waiter's look (when the notifier, its connection broken,
// wakes the waiters a second later, or at the safety timer, or at three quarters of a wait
// shorter than that) fails when the store gives up on it, within its timeout of 300 ms. That
// must come before the deadline: a deadline that overtakes a call the store has not failed
// yet cannot tell the outage from a slow store, and answers busy (docs/waiting.md, "Deadlines
// and outages"). So the wait before the safety timer is 3 s (it was 600 ms), the timer 5 s.
func TestStoreDownWhileWaitingIsUnavailable(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	for name, tc := range map[string]struct {
		waitMs int32
		safety time.Duration
	}{
		"deadline after the safety timer": {waitMs: 5000},
		"deadline before it":              {waitMs: 3000, safety: 5 * time.Second},
	} {
		t.Run(name, func(t *testing.T) {
			c := newCutter(t, u.Host)
			ps := newProcessesAt(t, c.uri(), mongotest.DatabaseName(t), 1,
				[]leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: tc.waitMs}},
				processOpts{safety: tc.safety, storeOpts: []leasestore.Option{leasestore.WithOpTimeout(300 * time.Millisecond)},
					svcOpts: func(int) []leasing.Option { return []leasing.Option{leasing.WithStoreTimeout(300 * time.Millisecond)} }})
			p := ps[0]
			mustAcquire(t, p.svc, podReq("x", 0))
			errc := make(chan error, 1)
			go func() { _, err := acquire(ctxT(t), p.svc, podReq("x", 1)); errc <- err }()
			p.untilBlocked(t, "x")
			c.cutNow()
			err := waitfor.Receive(t, errc, "the waiter's answer")
			if !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrBusy) {
				t.Fatalf("acquire with the store gone while waiting = %v, want unavailable", err)
			}
		})
	}
}

// TestFIFOAcrossProcesses: waiters in three processes get a level's freed slots in the order
// they queued, and the holder that releases, coming back at once, queues behind all of them
// (its process has a younger waiter of its own).
func TestFIFOAcrossProcesses(t *testing.T) {
	ps := newProcesses(t, 3, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000}},
		processOpts{})
	k := globalKey("x")
	held := mustAcquire(t, ps[0].svc, podReq("x", 0))
	order := make(chan int, 8)
	var wg sync.WaitGroup
	acquire := func(p *process, id int) {
		l, err := acquire(ctxT(t), p.svc, podReq("x", id))
		if err != nil {
			t.Errorf("waiter %d: %v", id, err)
			return
		}
		order <- id
		if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
			t.Errorf("waiter %d release: %v", id, err)
		}
	}
	queued := func(n int) { ps[0].untilInLine(t, k, n) }
	for i, p := range []*process{ps[1], ps[2], ps[0], ps[1]} {
		wg.Go(func() { acquire(p, i+1) })
		queued(i + 1)
	}
	if _, err := ps[0].svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatal(err)
	}
	wg.Go(func() { acquire(ps[0], 0) }) // the releasing holder comes back at once
	waitfor.Group(t, &wg, "the waiters")
	close(order)
	var got []int
	for i := range order {
		got = append(got, i)
	}
	if want := []int{1, 2, 3, 4, 0}; !slices.Equal(got, want) {
		t.Errorf("order of entry %v, want %v", got, want)
	}
	if n := ps[0].inLine(t, ""); n != 0 {
		t.Errorf("%d waiters left in line", n)
	}
	assertNoDrift(t, ps[0].store)
}

// TestHandedOverToAnotherProcessAnswersWithoutAWrite: a release in one process hands the slot
// to a waiter of another, and the hand-over completes that waiter's acquisition (the level is
// its last): the waiter's process learns it from the event and answers without a write of its
// own (before, it took the slot with one). Reads are not counted: the waiter's first look
// sweeps and repairs the level in the background.
func TestHandedOverToAnotherProcessAnswersWithoutAWrite(t *testing.T) {
	var mu sync.Mutex
	var cmds []string
	counting := false
	// The waiter's entry into the line ends with its one try of the level, whose first write
	// (a findAndModify that marks the level lined) may still be on its way when the waiter
	// shows in the line: counting starts once the server has answered it (a release that
	// reached the server before it would find no line, and the waiter would take the slot
	// itself).
	entered := make(chan struct{})
	observe := func(cmd string) {
		mu.Lock()
		defer mu.Unlock()
		switch cmd {
		case "findAndModify", "update", "insert", "delete":
			if counting {
				cmds = append(cmds, cmd)
			}
		}
	}
	replied := func(cmd string, _ int) {
		mu.Lock()
		defer mu.Unlock()
		if cmd == "findAndModify" && !counting && entered != nil {
			close(entered)
			entered = nil
		}
	}
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	defs := []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000}}
	a := newProcessesAt(t, uri, db, 1, defs, processOpts{safety: time.Minute})[0]
	b := newProcessesAt(t, uri, db, 1, defs,
		processOpts{safety: time.Minute, storeOpts: []leasestore.Option{leasestore.WithCommandObserver(observe), leasestore.WithReplyObserver(replied)}})[0]
	held := mustAcquire(t, a.svc, podReq("x", 0))
	got := make(chan error, 1)
	go func() {
		l, err := acquire(ctxT(t), b.svc, podReq("x", 1))
		mu.Lock()
		counting = false // the check below is the caller's, after the answer
		mu.Unlock()
		if err == nil {
			err = b.svc.Check(ctxT(t), l.Token)
		}
		got <- err
	}()
	a.untilInLine(t, globalKey("x"), 1)
	mu.Lock()
	waitEntry := entered
	mu.Unlock()
	if waitEntry != nil {
		waitfor.Closed(t, waitEntry, "the waiter's try of the level")
	}
	mu.Lock()
	counting = true
	mu.Unlock()
	if _, err := a.svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatal(err)
	}
	var answered []string
	select {
	case err := <-got:
		mu.Lock()
		answered = slices.Clone(cmds)
		mu.Unlock()
		if err != nil {
			t.Fatalf("the waiter in the other process: %v", err)
		}
	case <-time.After(20 * time.Second): // real time: bounded wait for the answer
		t.Fatal("the waiter in the other process was not answered within 20s (its safety look is a minute away)")
	}
	if len(answered) != 0 {
		t.Errorf("the waiter's process wrote %v before answering, want nothing", answered)
	}
}

// TestWaitersOfTwoTenantsAreToldTheirOwnDiagnosis: waiters of two tenants wait in the one line
// of the global level they share, in two processes. A refusal of one tenant's level (acme's,
// full with its holder and its waiter) is acme's alone: the globex waiter, in the process
// that saw the refusal, is never told acme's occupancy, and its answer names the global level
// or its own tenant. Before, a look's result was shared under the full level's key across
// tenants (issue 18, finding 3). The slot freed by globex goes to the oldest waiter, acme's.
func TestWaitersOfTwoTenantsAreToldTheirOwnDiagnosis(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{{name: "x", tenant: 2, global: 2, ttlSeconds: 60, waitMs: 30000}}, processOpts{})
	k := globalKey("x")
	mustAcquire(t, ps[0].svc, req("x", "acme", "p", "a1"))
	g1 := mustAcquire(t, ps[1].svc, req("x", "globex", "p", "g1"))

	type answer struct {
		l   leasing.Lease
		err error
	}
	acmeDone, globexDone := make(chan answer, 1), make(chan answer, 1)
	go func() {
		l, err := acquire(ctxT(t), ps[0].svc, req("x", "acme", "p", "a2"))
		acmeDone <- answer{l, err}
	}()
	ps[0].untilInLine(t, k, 1)
	go func() {
		r := req("x", "globex", "p", "g2")
		r.Wait = waitFor(2 * time.Second)
		l, err := acquire(ctxT(t), ps[1].svc, r)
		globexDone <- answer{l, err}
	}()
	ps[0].untilInLine(t, k, 2)

	// acme's tenant level is full (its holder and its waiter book it): refused there.
	noWait := req("x", "acme", "p", "a3")
	noWait.Wait = waitFor(0)
	_, err := acquire(ctxT(t), ps[1].svc, noWait)
	if b := asBusy(t, err); b.Level != lease.LevelTenant || b.Scope != "acme" {
		t.Errorf("acme's newcomer: %+v, want refused at acme's tenant level", b)
	}

	if _, err := ps[1].svc.Release(ctxT(t), g1.Token); err != nil {
		t.Fatal(err)
	}
	if a := waitfor.Receive(t, acmeDone, "acme's waiter"); a.err != nil {
		t.Errorf("acme's waiter, first in line: %v", a.err)
	}
	a := waitfor.Receive(t, globexDone, "globex's waiter")
	b := asBusy(t, a.err)
	if b.Level != lease.LevelGlobal || b.Scope != "*" || b.Count != 2 || b.Cap != 2 {
		t.Errorf("globex's waiter was told %+v, want the global level it waits at, 2 of 2", b)
	}
	ps[0].untilInLine(t, "", 0)
	assertNoDrift(t, ps[0].store)
}

// TestNarrowAndWideLinesKeepEveryCap: holders of four users loop acquire, hold, release on a
// resource capped at one per user and three in all, in two processes, so that waiters stand
// in the users' lines and in the global line at once. No counter ever exceeds its own level's
// cap: a waiter that was handed a user slot still queues at the full global level, behind the
// older waiters there (issue 18, finding 4, where a reservation at one level let its holder
// pass the barrier of every level). At rest nothing is booked and nothing drifts.
func TestNarrowAndWideLinesKeepEveryCap(t *testing.T) {
	const users, perUser, rounds = 4, 3, 4
	ps := newProcesses(t, 2, []leaseDef{{name: "x", user: 1, global: 3, ttlSeconds: 60, waitMs: 30000}}, processOpts{})
	stopWatch := capWatch(t, ps[0].store)

	var wg sync.WaitGroup
	var got atomic.Int64
	for u := range users {
		for c := range perUser {
			p := ps[(u*perUser+c)%len(ps)]
			wg.Go(func() {
				r := req("x", "acme", "p", fmt.Sprintf("u%d", u))
				r.Pod = lease.PodRef{Namespace: "ns", Name: fmt.Sprintf("pod-%d-%d", u, c), UID: fmt.Sprintf("uid-%d-%d", u, c)}
				for range rounds {
					l, err := acquire(ctxT(t), p.svc, r)
					if err != nil {
						t.Errorf("user %d holder %d: %v", u, c, err)
						return
					}
					got.Add(1)
					time.Sleep(time.Duration(c) * time.Millisecond) // real time: holds of different lengths against the real store
					if _, err := p.svc.Release(ctxT(t), l.Token); err != nil {
						t.Errorf("user %d holder %d release: %v", u, c, err)
						return
					}
				}
			})
		}
	}
	waitfor.Group(t, &wg, "the holders")
	most := stopWatch()
	if most[lease.LevelUser] > 1 || most[lease.LevelGlobal] > 3 {
		t.Errorf("highest counts %v, caps user 1 and global 3", most)
	}
	if n := got.Load(); n != users*perUser*rounds {
		t.Errorf("%d acquisitions, want %d", n, users*perUser*rounds)
	}
	ps[0].untilInLine(t, "", 0)
	if hs, _ := holdersAndCounters(t, ps[0].store); len(hs) != 0 {
		t.Errorf("%d holders left at rest", len(hs))
	}
	assertNoDrift(t, ps[0].store)
}

// TestBusyAnswerTellsThePositionAndAnEstimate: a busy answer names how many live waiters are
// ahead at the full level: all of the line for an acquisition that may not wait, the ones
// queued before it for a waiter whose wait ran out. Its estimated wait appears once a
// hand-over recorded a hold time of the resource, and grows with the position.
func TestBusyAnswerTellsThePositionAndAnEstimate(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000}}, envOpts{grants: true})
	first := mustAcquire(t, e.svc, podReq("x", 0))
	busyOf := func(r leasing.Request) *lease.BusyError {
		t.Helper()
		_, err := acquire(ctxT(t), e.svc, r)
		var busy *lease.BusyError
		if !errors.As(err, &busy) {
			t.Fatalf("acquire for %s: %v, want busy", r.User, err)
		}
		return busy
	}
	single := podReq("x", 9)
	single.Wait = waitFor(0)
	if b := busyOf(single); !b.Explained || b.Position != 0 || b.EstimatedWait != 0 {
		t.Fatalf("nobody waits: %+v, want position 0 and no estimate yet", b)
	}
	// Two waiters line up (their waits run long).
	type answer struct {
		l   leasing.Lease
		err error
	}
	answers := make(chan answer, 2)
	for i := 1; i <= 2; i++ {
		go func() {
			l, err := acquire(ctxT(t), e.svc, podReq("x", i))
			answers <- answer{l, err}
		}()
		waitfor.Until(t, fmt.Sprintf("waiter %d in line", i), func() bool { return lineLen(t, e.store, "x") == i })
	}
	if b := busyOf(single); !b.Explained || b.Position != 2 {
		t.Fatalf("two wait: %+v, want position 2", b)
	}
	// A waiter whose wait runs out behind them is told it had two ahead.
	short := podReq("x", 3)
	short.Wait = waitFor(600 * time.Millisecond)
	if b := busyOf(short); !b.Explained || b.Position != 2 || b.Waited < 600*time.Millisecond {
		t.Fatalf("a waiter whose wait ran out: %+v, want position 2 after 600ms", b)
	}
	time.Sleep(50 * time.Millisecond) // real time: the first holder holds for a measurable time
	if _, err := e.svc.Release(ctxT(t), first.Token); err != nil {
		t.Fatal(err)
	}
	a := waitfor.Receive(t, answers, "the oldest waiter's grant") // one waits on
	if a.err != nil {
		t.Fatal(a.err)
	}
	b := busyOf(single)
	if !b.Explained || b.Position != 1 {
		t.Fatalf("after the hand-over: %+v, want position 1", b)
	}
	// One hold of at least 50 ms recorded: two slots' turns ahead of the next in line.
	if b.EstimatedWait < 100*time.Millisecond {
		t.Fatalf("estimate %v after a hold of at least 50ms with one waiter ahead, want at least 100ms", b.EstimatedWait)
	}
	if _, err := e.svc.Release(ctxT(t), a.l.Token); err != nil {
		t.Fatal(err)
	}
	if a = waitfor.Receive(t, answers, "the second waiter's grant"); a.err != nil {
		t.Fatal(a.err)
	}
}

// lineLen is the number of waiters in the lines of resource.
func lineLen(t *testing.T, s *leasestore.Store, resource string) int {
	t.Helper()
	ws, err := s.ListWaiters(ctxT(t), leasestore.HolderFilter{Resource: resource})
	if err != nil {
		t.Fatal(err)
	}
	return len(ws)
}
