package serving

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"
)

// HTTPServer serves Handler on Addr until ctx is done, then shuts down gracefully. It is a
// manager Runnable that every replica runs (no leader election).
type HTTPServer struct {
	Name    string
	Addr    string
	Handler http.Handler
}

// Start serves until ctx ends.
func (s HTTPServer) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.Addr)
	if err != nil {
		return fmt.Errorf("%s: listening on %s: %w", s.Name, s.Addr, err)
	}
	srv := &http.Server{
		Handler:           s.Handler,
		ReadHeaderTimeout: 10 * time.Second,
		// Request bodies are small (64 KiB at most); a slow body must not hold a connection.
		ReadTimeout: 30 * time.Second,
		// Long-polls (GET /v1/leases/{token}/events) last up to a minute.
		WriteTimeout: 90 * time.Second,
		IdleTimeout:  2 * time.Minute,
	}
	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("%s: %w", s.Name, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: shutting down: %w", s.Name, err)
	}
	return nil
}

// NeedLeaderElection is false: every replica serves.
func (HTTPServer) NeedLeaderElection() bool { return false }

// Runnable is what RunAll runs: a component that works until ctx ends.
type Runnable interface {
	Start(ctx context.Context) error
}

// RunAll runs every runnable until ctx ends or one of them fails or returns, then stops the
// others and waits for them. The agent runs its parts with it: it has no controller-runtime
// manager, since it reads no Kubernetes API.
func RunAll(ctx context.Context, runnables ...Runnable) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, len(runnables))
	for _, r := range runnables {
		go func() { errs <- r.Start(ctx) }()
	}
	var first error
	for range runnables {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		} else if err == nil {
			cancel() // a runnable that ends early ends the process
		}
	}
	return first
}
