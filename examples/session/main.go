// Command session is an example consumer in the shape of a browser session of an MCP client
// (docs/client.md): the lease is tied to the session, not to a connection pool. It acquires
// on session open, stores the endpoint and session id in the payload after the handshake,
// checks the lease on every call, and releases it on close. When a call finds the lease
// lost (LEASE_LOST) it closes the session and fails; the next call opens a new session and
// acquires anew. A revocation notice closes the session at once.
//
// The remote session is simulated; the lease handling is what a real consumer does with
// pkg/leaseclient. It reads one command per line from stdin: "call" makes a call, "close"
// closes the session, end of input closes it and exits. The lease agent's URL comes from
// $LEASE_AGENT_URL.
//
//	LEASE_AGENT_URL=http://127.0.0.1:8090 session -tenant acme -project p1 -user ann
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// callTimeout bounds one call, lease calls included.
const callTimeout = 30 * time.Second

// session is one remote session guarded by a lease.
type session struct {
	client   *leaseclient.Client
	req      leaseclient.Request
	endpoint string

	mu    sync.Mutex
	lease *leaseclient.Lease
	id    string
	done  chan struct{} // closed when the session closes: stops its revocation watcher
	seq   int
}

// open acquires the lease, performs the (simulated) handshake and stores what a revocation
// handler needs to end the remote session. A failure after the acquisition returns the
// lease at once.
func (s *session) open(ctx context.Context) error {
	l, err := s.client.Acquire(ctx, s.req)
	if err != nil {
		return fmt.Errorf("opening a session: %w", err)
	}
	s.seq++
	id := fmt.Sprintf("session-%d-%d", os.Getpid(), s.seq)
	if err := l.UpdatePayload(ctx, map[string]string{"endpoint": s.endpoint, "sessionId": id}); err != nil {
		_ = l.Release(context.WithoutCancel(ctx))
		return fmt.Errorf("opening a session: %w", err)
	}
	s.lease, s.id, s.done = l, id, make(chan struct{})
	fmt.Printf("opened session=%s token=%s\n", id, l.Token)
	go s.watch(l, s.done)
	return nil
}

// watch closes the session when its lease is revoked, unless it closed before.
func (s *session) watch(l *leaseclient.Lease, done <-chan struct{}) {
	select {
	case ev := <-l.Revoked():
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.lease == l { // still this session's lease, not a newer one
			s.closeLocked(context.Background(), "revoked reason="+ev.Reason)
		}
	case <-done:
	}
}

// call makes one call, opening a session first when none is open.
func (s *session) call(ctx context.Context, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lease == nil {
		if err := s.open(ctx); err != nil {
			return err
		}
	}
	if err := s.lease.Check(ctx); err != nil {
		if errors.Is(err, leaseclient.ErrLost) {
			// The slot is gone: close the session; the next call opens a new one.
			s.closeLocked(ctx, "lease lost")
		}
		return err
	}
	fmt.Printf("call %d ok session=%s\n", n, s.id)
	return nil
}

func (s *session) close(ctx context.Context, reason string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closeLocked(ctx, reason)
}

// closeLocked ends the session (the remote DELETE would go here) and releases its lease.
func (s *session) closeLocked(ctx context.Context, reason string) {
	if s.lease == nil {
		return
	}
	close(s.done)
	err := s.lease.Release(context.WithoutCancel(ctx))
	fmt.Printf("closed session=%s reason=%q release error=%v\n", s.id, reason, err)
	s.lease, s.id = nil, ""
}

func main() {
	s := &session{}
	flag.StringVar(&s.req.Lease, "lease", "browser", "lease definition")
	flag.StringVar(&s.req.Tenant, "tenant", "", "tenant")
	flag.StringVar(&s.req.Project, "project", "", "project")
	flag.StringVar(&s.req.User, "user", "", "user")
	flag.StringVar(&s.endpoint, "endpoint", "http://mcp.example/session", "the remote session's endpoint")
	flag.Parse()
	s.req.Type = "mcp"
	s.req.HolderRef = fmt.Sprintf("session-example-%d", os.Getpid())
	// A stdio transport's subprocess dies with the pod.
	s.req.PodBound = true

	client, err := leaseclient.NewFromEnv()
	if err != nil {
		fmt.Println("error:", err)
		os.Exit(1)
	}
	s.client = client
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	run(ctx, s, bufio.NewScanner(os.Stdin))
	stop()
}

func run(ctx context.Context, s *session, in *bufio.Scanner) {
	defer s.close(ctx, "end of input")
	n := 0
	for in.Scan() && ctx.Err() == nil {
		switch cmd := strings.TrimSpace(in.Text()); cmd {
		case "call":
			n++
			cctx, cancel := context.WithTimeout(ctx, callTimeout)
			if err := s.call(cctx, n); err != nil {
				fmt.Printf("call %d failed: %v\n", n, err)
			}
			cancel()
		case "close":
			s.close(ctx, "closed by the user")
		case "":
		default:
			fmt.Printf("unknown command %q (call, close)\n", cmd)
		}
	}
}
