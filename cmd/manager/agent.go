package main

import (
	"cmp"
	"flag"
	"fmt"
	"net/http"
	"os"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// agentFlags are the sidecar's settings.
type agentFlags struct {
	store        storeFlags
	apiAddr      string
	internalAddr string
	managerURL   string
	tenancy      tenancyFlags
}

func (f *agentFlags) bind(fs *flag.FlagSet) {
	f.store.bind(fs)
	fs.StringVar(&f.apiAddr, "api-bind-address", fmt.Sprintf("127.0.0.1:%d", settings.AgentAPIPort),
		"Address of the admission API for the pod's own containers.")
	fs.StringVar(&f.internalAddr, "internal-bind-address", fmt.Sprintf(":%d", settings.AgentInternalPort),
		"Address of the endpoint that receives revocations forwarded by other pods.")
	fs.StringVar(&f.managerURL, "manager-url", os.Getenv(settings.EnvManagerURL),
		"URL of the manager's admission Service (env LEASE_MANAGER_URL): the lazy idle sweep runs there, so reaped holders get the full dispatch matrix; empty sweeps here.")
	f.tenancy.bind(fs, true)
}

// runAgent runs the lease agent: the admission library for the pod's own containers on
// 127.0.0.1, with the pod's identity from the downward API, the long-poll for revocations,
// and the endpoint that receives revocations forwarded by reapers elsewhere.
func runAgent(args []string) error {
	var f agentFlags
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	f.bind(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	log := ctrl.Log.WithName("agent")
	ctx := ctrl.SetupSignalHandler()

	self, err := httpapi.AgentIdentityFromEnv()
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	utilruntime.Must(leasev1alpha1.AddToScheme(scheme))
	utilruntime.Must(corev1.AddToScheme(scheme)) // Namespaces (tenancy) and the built-in ConfigMap
	copts := cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{&leasev1alpha1.LeaseDefinition{}: {}}}
	namespaces := splitList(f.tenancy.namespaces)
	if len(namespaces) > 0 {
		copts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			copts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	// A manager only to run the definitions cache, the servers and the probes; the agent
	// runs no controller and needs no leader.
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), ctrl.Options{
		Scheme:                 scheme,
		Cache:                  copts,
		HealthProbeBindAddress: "0",
		Metrics:                metricsOff(),
	})
	if err != nil {
		return fmt.Errorf("creating the agent: %w", err)
	}
	if err := k8ssource.SetupIndexes(ctx, mgr.GetFieldIndexer()); err != nil {
		return err
	}
	resolver, tenants, err := newTenantResolver(ctx, mgr, f.store.defaultsDir, f.tenancy, namespaces)
	if err != nil {
		return err
	}
	if err := k8ssource.RegisterInvalidation(ctx, mgr.GetCache(), resolver); err != nil {
		return err
	}
	k8ssource.RegisterTenancyInvalidation(tenants, resolver)
	wt := newWaiting()
	wt.followDefinitions(resolver)
	store, closeStore, err := setupStore(f.store, wt.storeOptions()...)
	if err != nil {
		return err
	}
	defer closeStore()

	m := metrics.Default()
	hub := notify.NewHub(eventsKeep, realClock)
	registry := handlers.NewDefaultRegistry(hub, nil, nil)
	// The agent watches no pods. Its lazy idle sweep runs on the manager (--manager-url), which
	// dispatches the reaped holders through the full matrix. Only when no manager is set or
	// reachable does the agent sweep itself; then its own pod is alive and the liveness of
	// every other pod is unknown: release only, no handler (those holders learn of it at their
	// next check, LEASE_LOST).
	dispatcher := revocation.NewDispatcher(podwatch.SelfOnly{Self: self}, self, registry,
		revocation.WithMetrics(m), revocation.WithRegisterer(ctrlmetrics.Registry),
		revocation.WithLogger(log.WithName("revocation")))
	svcOpts := wt.serviceOptions()
	if f.managerURL != "" {
		svcOpts = append(svcOpts, leasing.WithIdleReaper(sweeper.RelayReaper(nil, f.managerURL, store)))
	}
	svcOpts = append(svcOpts, leasing.WithRevocationListener(dispatcher), leasing.WithClock(realClock), leasing.WithMetrics(m))
	svc := leasing.NewService(store, resolver, registry, svcOpts...)
	wt.startNotifier(ctx, store)

	api := routes(routeHandlers{
		// The pod's containers act only for the tenant of the pod's namespace.
		api: httpapi.NewHandler(svc, httpapi.WithPodIdentity(httpapi.StaticPodIdentity(self)),
			httpapi.WithTenantBinder(tenancy.Binder{Map: tenants, NonPod: tenancy.NonPodRefused}.Bind),
			httpapi.WithEvents(hub), httpapi.WithMaxWait(maxWait)),
	})
	// The internal port is the one the kubelet and other pods reach: revocations and probes.
	internal := routes(routeHandlers{revoked: newReceiver(self, registry,
		cmp.Or(os.Getenv(settings.EnvAgentKey), agentlink.AgentKey(f.store.secret, self.Namespace)), store)})
	internal.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	// The consumer path's metrics (acquire, check, release, dispatch), as on the manager.
	internal.Handle("GET "+metrics.Path, metrics.Handler())
	// Ready once the definitions are cached. A store outage does not make the agent unready:
	// a sidecar's readiness is the pod's, and an outage would pull every injected pod out of
	// its Services; it shows per call as LEASE_UNAVAILABLE instead.
	internal.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		if !mgr.GetCache().WaitForCacheSync(r.Context()) {
			http.Error(w, "lease definitions not synced", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})

	for _, r := range []manager.Runnable{
		dispatcher,
		httpServer{name: "agent API", addr: f.apiAddr, handler: api},
		httpServer{name: "agent internal", addr: f.internalAddr, handler: internal},
	} {
		if err := mgr.Add(r); err != nil {
			return fmt.Errorf("adding runnable: %w", err)
		}
	}
	log.Info("Starting the lease agent", "pod", self.String(), "api", f.apiAddr, "internal", f.internalAddr)
	return mgr.Start(ctx)
}
