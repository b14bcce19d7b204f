package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/livefeed"
)

// liveAPIFlags configure the live API (docs/live-api.md).
type liveAPIFlags struct {
	bindAddress string
	certDir     string
	kubeconfig  string
	// watchInterval: how often the change feed of the live API's watches reads the store.
	watchInterval time.Duration
}

func (f *liveAPIFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.bindAddress, "live-api-bind-address", "",
		"Address of the live API (live.lease.vancetope.io, served through an APIService), e.g. :8444; empty disables it.")
	fs.StringVar(&f.certDir, "live-api-cert-dir", "",
		"Directory with tls.crt and tls.key of the live API; empty serves a self-signed certificate (development only).")
	fs.StringVar(&f.kubeconfig, "live-api-kubeconfig", os.Getenv("KUBECONFIG"),
		"Kubeconfig for the live API's delegated authentication and authorization (TokenReview, SubjectAccessReview); empty means in-cluster.")
	fs.DurationVar(&f.watchInterval, "live-watch-interval", livefeed.DefaultInterval,
		"How long this replica's change feed rests between two reads of the lease store for the live API's watches (kubectl get -w, informers), "+
			"or as long as its last read took if longer; every watch of the replica shares it. 0 turns watch off.")
}

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// setupLiveAPI adds the live API server to mgr, on every replica (no leader election: the
// state is in the store), and its change feed over src. deps.Tenants is the manager's namespace-to-tenant map, the same one
// the definitions resolver decides with.
func setupLiveAPI(mgr manager.Manager, f liveAPIFlags, src livefeed.Source, deps liveapi.Deps) error {
	if f.bindAddress == "" {
		return nil
	}
	host, port, err := net.SplitHostPort(f.bindAddress)
	if err != nil {
		return fmt.Errorf("--live-api-bind-address %q: %w", f.bindAddress, err)
	}
	opts := liveapi.Options{CertDir: f.certDir, Kubeconfig: f.kubeconfig}
	if opts.Port, err = strconv.Atoi(port); err != nil || opts.Port <= 0 {
		return fmt.Errorf("--live-api-bind-address %q: port must be a positive number", f.bindAddress)
	}
	if host != "" {
		if opts.BindAddress = net.ParseIP(host); opts.BindAddress == nil {
			return fmt.Errorf("--live-api-bind-address %q: host must be an IP address", f.bindAddress)
		}
	}
	if deps.Tenants == nil {
		return fmt.Errorf("the live API needs the namespace-to-tenant map")
	}
	if deps.Log.GetSink() == nil {
		deps.Log = ctrl.Log.WithName("liveapi")
	}
	if f.watchInterval > 0 {
		feed := livefeed.New(src, livefeed.Options{Interval: f.watchInterval, Log: ctrl.Log.WithName("livefeed")})
		deps.Feed = feed
		if err := mgr.Add(everyReplica(feed.Run)); err != nil {
			return err
		}
	}
	srv, err := liveapi.New(opts, deps)
	if err != nil {
		return err
	}
	return mgr.Add(everyReplica(srv.Run))
}

// everyReplica is a runnable that runs on every replica, leader or not.
type everyReplica func(ctx context.Context) error

func (r everyReplica) Start(ctx context.Context) error { return r(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }
