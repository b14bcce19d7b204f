package leasing_test

import (
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
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
	_, err = acquire(ctxT(t), e.svc, req("x", "acme", "p", "waiter"))
	proxy.thaw()
	if !errors.Is(err, lease.ErrUnavailable) || errors.Is(err, lease.ErrBusy) {
		t.Fatalf("acquire while the store hangs mid-wait = %v, want unavailable", err)
	}
}
