package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/podwatch"
)

// httpServer serves handler on addr until ctx is done, then shuts down gracefully. It is a
// manager Runnable that every replica runs (no leader election).
type httpServer struct {
	name    string
	addr    string
	handler http.Handler
}

func (s httpServer) Start(ctx context.Context) error {
	ln, err := net.Listen("tcp", s.addr)
	if err != nil {
		return fmt.Errorf("%s: listening on %s: %w", s.name, s.addr, err)
	}
	srv := &http.Server{
		Handler:           s.handler,
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
		return fmt.Errorf("%s: %w", s.name, err)
	case <-ctx.Done():
	}
	shutdown, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(shutdown); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("%s: shutting down: %w", s.name, err)
	}
	return nil
}

func (httpServer) NeedLeaderElection() bool { return false }

// podByIP identifies the caller of the manager's admission API by its source address: the
// pod informer maps pod IPs to pods, the API server decides when the informer does not know
// (podwatch.Watcher.Identify). A caller that is no pod (a developer's curl, a client outside
// the cluster) holds leases without a pod, which only the idle reap frees; a caller whose
// pod cannot be determined is answered 503.
func podByIP(w *podwatch.Watcher) func(*http.Request) (lease.PodRef, error) {
	return func(r *http.Request) (lease.PodRef, error) {
		host, _, err := net.SplitHostPort(r.RemoteAddr)
		if err != nil {
			host = r.RemoteAddr
		}
		return w.Identify(r.Context(), host)
	}
}
