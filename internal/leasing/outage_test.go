package leasing_test

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

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// freezeProxy forwards TCP to the store until frozen: then bytes stop flowing both ways
// while the connections stay open, as with a store that hangs or a network partition
// (not a refused connection, which fails fast).
type freezeProxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	open   chan struct{} // closed while traffic flows
}

func newFreezeProxy(t *testing.T, target string) *freezeProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &freezeProxy{ln: ln, target: target, open: make(chan struct{})}
	close(p.open)
	go p.serve()
	t.Cleanup(func() { p.thaw(); _ = ln.Close() })
	return p
}

func (p *freezeProxy) gate() chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.open
}

func (p *freezeProxy) freeze() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
		p.open = make(chan struct{})
	default:
	}
}

func (p *freezeProxy) thaw() {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.open:
	default:
		close(p.open)
	}
}

func (p *freezeProxy) serve() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		b, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		go p.pipe(b, c)
		go p.pipe(c, b)
	}
}

func (p *freezeProxy) pipe(dst, src net.Conn) {
	defer func() { _ = dst.Close(); _ = src.Close() }()
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			<-p.gate()
			if _, werr := dst.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			if !errors.Is(err, io.EOF) {
				return
			}
			return
		}
	}
}

// TestStoreHangDuringTheWaitIsUnavailable: the store stops answering while an acquisition
// waits for a full level, so the round's probe outlives the remaining wait. The answer is
// LEASE_UNAVAILABLE, not LEASE_BUSY: busy diagnoses a full level, which a store that does not
// answer cannot confirm (docs/design.md, "Fail closed").
func TestStoreHangDuringTheWaitIsUnavailable(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatal(err)
	}
	target := strings.Split(u.Host, ",")[0]
	proxy := newFreezeProxy(t, target)
	q := u.Query()
	q.Set("directConnection", "true")
	u.RawQuery, u.Host = q.Encode(), proxy.ln.Addr().String()

	// The store's own timeout is longer than the wait: only the wait's deadline cuts the probe.
	e := newEnv(t, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 1500}},
		envOpts{uri: u.String(), storeOpts: []leasestore.Option{leasestore.WithOpTimeout(10 * time.Second)}})
	mustAcquire(t, e.svc, req("x", "acme", "p", "holder"))

	// Freeze once the acquisition is in its waiting phase (its first round is over).
	time.AfterFunc(400*time.Millisecond, proxy.freeze)
	start := time.Now()
	_, err = acquire(ctxT(t), e.svc, req("x", "acme", "p", "waiter"))
	took := time.Since(start)
	proxy.thaw()
	if !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire while the store hangs mid-wait = %v, want unavailable", err)
	}
	// The answer comes at the wait's deadline (1.5 s) plus the documented margin, not at the
	// store's timeout (10 s), which bounded a waiter's calls before (issue 18, finding 6). Half
	// the store's timeout: far above the deadline on a loaded machine, far below the timeout.
	if took > 5*time.Second {
		t.Errorf("answered after %v: bounded by the store's timeout (10 s), not by the wait (1.5 s)", took)
	}
}

// stallingStore lets one kind of call of the wrapped store hang until the test lets it go,
// as a store that accepted the command and has not answered yet.
type stallingStore struct {
	leasing.Store
	// sweep: SweepIdle stalls; acquireAfter: every Acquire after the first n stalls.
	sweep        bool
	acquireAfter int
	mu           sync.Mutex
	acquires     int
	stalled      chan struct{} // a call stalls
	release      chan struct{} // closed by the test: stalled calls go on
}

func (s *stallingStore) stall() {
	select {
	case s.stalled <- struct{}{}:
	default:
	}
	<-s.release
}

func (s *stallingStore) SweepIdle(ctx context.Context, resource string) (leasestore.IdleSweep, error) {
	if s.sweep {
		s.stall()
	}
	return s.Store.SweepIdle(ctx, resource)
}

func (s *stallingStore) Acquire(ctx context.Context, r leasestore.AcquireRequest) (lease.Holder, error) {
	s.mu.Lock()
	s.acquires++
	n := s.acquires
	s.mu.Unlock()
	if s.acquireAfter > 0 && n > s.acquireAfter {
		s.stall()
	}
	return s.Store.Acquire(ctx, r)
}

// TestShortWaitAnswersWhileItsCallsHang: a wait too short to join the line (300 ms) sweeps
// the resource and tries once more; when the store takes its time with the sweep, or with the
// second try, the acquisition still answers at its deadline plus the margin, while the call
// is in flight. Before, both calls were bounded by the store's timeout only (issue 18, finding
// 6): here the stalled call would have kept the answer until the test let it go. The store
// answered nothing in this process since the stalled call was asked, so the answer is
// LEASE_UNAVAILABLE (docs/waiting.md, "Deadlines and outages").
func TestShortWaitAnswersWhileItsCallsHang(t *testing.T) {
	for _, tc := range []struct {
		name         string
		sweep        bool
		acquireAfter int
	}{
		{name: "sweep", sweep: true},
		{name: "second try", acquireAfter: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 300}}, envOpts{})
			mustAcquire(t, e.svc, req("x", "acme", "p", "holder"))
			st := &stallingStore{Store: e.store, sweep: tc.sweep, acquireAfter: tc.acquireAfter,
				stalled: make(chan struct{}, 1), release: make(chan struct{})}
			defer close(st.release)
			svc := leasing.NewService(st, definition.NewResolver(nil, e.source), leasing.NewStaticTypes("tex"),
				leasing.WithMetrics(e.metrics), leasing.WithSweepInterval(time.Millisecond))

			answer := make(chan error, 1)
			go func() {
				_, err := acquire(ctxT(t), svc, req("x", "acme", "p", "waiter"))
				answer <- err
			}()
			select {
			case <-st.stalled:
			case err := <-answer:
				t.Fatalf("answered %v before the call that stalls", err)
			}
			err := waitfor.Receive(t, answer, "the answer while the call stalls")
			if !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrBusy) {
				t.Errorf("answer = %v, want unavailable", err)
			}
		})
	}
}
