package main

import (
	"net"
	"net/http"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/serving"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

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

// The manager's pod watcher is the pod view of its sweeps and dispatch, which, like its
// servers, run on every replica.
var (
	_ revocation.PodView             = (*podwatch.Watcher)(nil)
	_ sweeper.Liveness               = (*podwatch.Watcher)(nil)
	_ manager.Runnable               = (*revocation.Dispatcher)(nil)
	_ manager.LeaderElectionRunnable = (*revocation.Dispatcher)(nil)
	_ manager.Runnable               = (*sweeper.Sweeper)(nil)
	_ manager.LeaderElectionRunnable = (*sweeper.Sweeper)(nil)
	_ manager.LeaderElectionRunnable = serving.HTTPServer{}
)
