package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// liveAPIFlags configure the live API (docs/live-api.md).
type liveAPIFlags struct {
	bindAddress string
	certDir     string
	kubeconfig  string
}

func (f *liveAPIFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.bindAddress, "live-api-bind-address", "",
		"Address of the live API (live.lease.vancetope.io, served through an APIService), e.g. :8444; empty disables it.")
	fs.StringVar(&f.certDir, "live-api-cert-dir", "",
		"Directory with tls.crt and tls.key of the live API; empty serves a self-signed certificate (development only).")
	fs.StringVar(&f.kubeconfig, "live-api-kubeconfig", os.Getenv("KUBECONFIG"),
		"Kubeconfig for the live API's delegated authentication and authorization (TokenReview, SubjectAccessReview); empty means in-cluster.")
}

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// setupLiveAPI adds the live API server to mgr, on every replica (no leader election: the
// state is in the store). deps.Tenants may be nil: the map of the manager's cache is built
// with the manager's own namespace as the system namespace.
func setupLiveAPI(ctx context.Context, mgr manager.Manager, f liveAPIFlags, systemNamespace string, deps liveapi.Deps) error {
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
	if systemNamespace == "" {
		// Outside a cluster (make run) the manager has no namespace of its own.
		systemNamespace = os.Getenv("LEASE_SYSTEM_NAMESPACE")
	}
	if systemNamespace == "" {
		return fmt.Errorf("the live API needs the system namespace: run in a pod (POD_NAMESPACE) or set LEASE_SYSTEM_NAMESPACE")
	}
	if deps.Tenants == nil {
		if deps.Tenants, err = tenancy.NewInformed(ctx, mgr.GetCache(), systemNamespace); err != nil {
			return err
		}
	}
	if deps.Log.GetSink() == nil {
		deps.Log = ctrl.Log.WithName("liveapi")
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
