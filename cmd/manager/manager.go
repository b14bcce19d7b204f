package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
	"sigs.k8s.io/controller-runtime/pkg/metrics/filters"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/adminapi"
	"github.com/vancetope/lease-operator/internal/controller"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// managerFlags are the manager's settings.
type managerFlags struct {
	store           storeFlags
	adminSecret     string
	metricsAddr     string
	metricsSecure   bool
	probeAddr       string
	apiAddr         string
	leaderElect     bool
	namespaces      string
	reapInterval    time.Duration
	reconcileSafety time.Duration
	agentImage      string
	agentSecret     string
	agentManagerURL string
	agentPort       int
	webhookPort     int
	webhookCertDir  string
}

func (f *managerFlags) bind(fs *flag.FlagSet) {
	f.store.bind(fs)
	fs.StringVar(&f.adminSecret, "admin-secret", os.Getenv("LEASE_ADMIN_SECRET"),
		"Bearer secret of the operator API /internal/lease/admin/... (env LEASE_ADMIN_SECRET); empty disables it.")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.BoolVar(&f.metricsSecure, "metrics-secure", false, "Serve metrics over HTTPS with Kubernetes authentication and authorization (TokenReview, SubjectAccessReview).")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	fs.StringVar(&f.apiAddr, "api-bind-address", ":8082", "Address of the admission HTTP API (/v1/leases) and the internal revocation endpoint.")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "Elect a leader for the status controller (every replica serves the API, sweeps and dispatches).")
	fs.StringVar(&f.namespaces, "namespaces", "", "Comma-separated namespaces to watch for LeaseDefinitions and pods; empty watches all.")
	fs.DurationVar(&f.reapInterval, "reap-interval", 30*time.Second, "Interval of the scheduled sweep: idle reap, pod-dead reap, reconcile.")
	fs.DurationVar(&f.reconcileSafety, "reconcile-safety", leasestore.DefaultSafetyMargin, "Reconcile corrects only counters unchanged for this long.")
	fs.StringVar(&f.agentImage, "agent-image", "", "Image of the injected lease agent (normally the manager's own); empty disables the injection webhook.")
	fs.StringVar(&f.agentSecret, "agent-store-secret", inject.DefaultStoreSecret, "Secret (in the pod's namespace) whose key uri the agent uses as MONGODB_URI.")
	fs.StringVar(&f.agentManagerURL, "agent-manager-url", "",
		"URL of this manager's admission Service, given to injected agents (LEASE_MANAGER_URL) for their lazy idle sweeps.")
	fs.IntVar(&f.agentPort, "agent-internal-port", inject.AgentInternalPort, "Port of the agents' internal revocation endpoint.")
	fs.IntVar(&f.webhookPort, "webhook-port", 9443, "Port of the webhook server.")
	fs.StringVar(&f.webhookCertDir, "webhook-cert-dir", "", "Directory with tls.crt and tls.key of the webhook server (default: controller-runtime's).")
}

func runManager(args []string) error {
	var f managerFlags
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	f.bind(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	log := ctrl.Log.WithName("setup")
	if least := 2 * leasestore.DefaultOpTimeout; f.reconcileSafety < least {
		return fmt.Errorf("--reconcile-safety %v is too short: it must exceed what an acquire or release may take (at least %v)", f.reconcileSafety, least)
	}
	ctx := ctrl.SetupSignalHandler()

	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(leasev1alpha1.AddToScheme(scheme))

	namespaces := splitList(f.namespaces)
	opts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsOptions(f.metricsAddr, f.metricsSecure),
		HealthProbeBindAddress: f.probeAddr,
		LeaderElection:         f.leaderElect,
		LeaderElectionID:       "lease-operator.vancetope.io",
	}
	if len(namespaces) > 0 {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.Cache.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if f.agentImage != "" {
		opts.WebhookServer = webhook.NewServer(webhook.Options{Port: f.webhookPort, CertDir: f.webhookCertDir})
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), opts)
	if err != nil {
		return fmt.Errorf("creating the manager: %w", err)
	}

	wt := newWaiting()
	store, err := leasestore.Connect(f.store.uri, f.store.database, append(wt.storeOptions(), leasestore.WithSafetyMargin(f.reconcileSafety))...)
	if err != nil {
		return err
	}
	defer func() { _ = store.Close(context.Background()) }()
	if err := store.EnsureIndexes(ctx); err != nil {
		// Fail closed, not dead: acquisitions answer LEASE_UNAVAILABLE and readiness fails
		// until the store answers; the indexes are created by the next start.
		log.Error(err, "Creating the store's indexes failed; continuing")
	}

	resolver, err := newResolver(f.store.defaultsDir, k8ssource.New(mgr.GetCache()))
	if err != nil {
		return err
	}
	if err := controller.SetupLeaseDefinitions(ctx, mgr, resolver); err != nil {
		return err
	}

	self, err := httpapi.AgentIdentityFromEnv()
	if err != nil {
		log.Info("Running without a pod identity (outside a cluster?)", "reason", err.Error())
		self = lease.PodRef{}
	}
	watcher, err := podwatch.New(mgr.GetConfig(), podwatch.Options{Self: self, Namespaces: namespaces, Logger: ctrl.Log.WithName("podwatch")})
	if err != nil {
		return err
	}
	m := metrics.Default()
	hub := notify.NewHub(5*time.Minute, clock.RealClock{})
	registry := revocation.NewDefaultRegistry(hub, revocation.ClientSecretReader{Reader: mgr.GetAPIReader()}, nil)
	dispatcher := revocation.NewDispatcher(watcher, self, registry,
		revocation.WithForwarder(revocation.NewHTTPForwarder(nil, f.agentPort, f.store.secret)),
		revocation.WithRecorder(mgr.GetEventRecorder("lease-operator")),
		revocation.WithMetrics(m),
		revocation.WithRegisterer(ctrlmetrics.Registry),
		revocation.WithLogger(ctrl.Log.WithName("revocation")))
	sweep := sweeper.New(store, watcher, dispatcher,
		sweeper.WithInterval(f.reapInterval), sweeper.WithMetrics(m), sweeper.WithLogger(ctrl.Log.WithName("sweeper")))
	watcher.OnPodGone(sweep.PodGone)
	watcher.OnPodGone(wt.dropReservations(ctx, store))

	svc := leasing.NewService(store, resolver, registry, dispatcher, clock.RealClock{}, m, wt.serviceOptions()...)
	wt.startNotifier(ctx, store)
	mux := http.NewServeMux()
	mux.Handle("/v1/", httpapi.NewHandler(svc, httpapi.WithPodIdentity(podByIP(watcher)), httpapi.WithEvents(hub), httpapi.WithMaxWait(maxWait)))
	mux.Handle("/internal/lease/revoked", revocation.NewReceiver(self, registry,
		revocation.WithSharedSecret(f.store.secret), revocation.WithHolderCheck(stillHeld(store))))
	// Agents ask for the lazy idle sweep here, so that the reaped holders go through this
	// manager's dispatch matrix (an agent watches no pods).
	mux.Handle(sweeper.RelayPath, sweeper.RelayHandler(store, dispatcher, clock.RealClock{}, leasing.DefaultSweepInterval))
	mux.Handle(adminapi.PathPrefix, adminapi.NewHandler(store, dispatcher, sweep, f.adminSecret,
		adminapi.WithMetrics(m), adminapi.WithLogger(ctrl.Log.WithName("admin"))))

	for _, r := range []manager.Runnable{watcher, dispatcher, sweep, httpServer{name: "admission API", addr: f.apiAddr, handler: mux}} {
		if err := mgr.Add(r); err != nil {
			return fmt.Errorf("adding runnable: %w", err)
		}
	}

	if f.agentImage != "" {
		cfg := inject.Config{Image: f.agentImage, StoreSecret: f.agentSecret, StoreDatabase: f.store.database, ManagerURL: f.agentManagerURL}
		if err := inject.SetupWebhookWithManager(mgr, cfg); err != nil {
			return fmt.Errorf("setting up the injection webhook: %w", err)
		}
	}

	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	// The store is deliberately not a readiness check: a MongoDB blip would take every replica
	// out of its Services and, with the webhook's failurePolicy Fail, block annotated pods;
	// callers get 503 LEASE_UNAVAILABLE per call instead.
	if err := mgr.AddReadyzCheck("pods", watcher.ReadyCheck); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	log.Info("Starting the manager", "api", f.apiAddr, "database", f.store.database, "webhook", f.agentImage != "")
	return mgr.Start(ctx)
}

// metricsOptions serves metrics on addr; secure adds TLS and Kubernetes authn/authz, as a
// cluster's Prometheus expects.
func metricsOptions(addr string, secure bool) metricsserver.Options {
	opts := metricsserver.Options{BindAddress: addr}
	if secure {
		opts.SecureServing = true
		opts.FilterProvider = filters.WithAuthenticationAndAuthorization
	}
	return opts
}

// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
// +kubebuilder:rbac:groups="",resources=events,verbs=create;patch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch
// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// newResolver loads the built-in definitions (compiled in, extended from dir) and returns the
// merged-definition resolver over source.
func newResolver(dir string, source definition.LayerSource) (*definition.Resolver, error) {
	var fsys = os.DirFS(dir)
	if dir == "" {
		fsys = nil
	}
	builtins, err := definition.LoadBuiltins(fsys)
	if err != nil {
		return nil, fmt.Errorf("loading built-in definitions: %w", err)
	}
	for _, p := range builtins.Problems() {
		ctrl.Log.WithName("setup").Error(p, "Broken built-in definition: its lease is unavailable")
	}
	return definition.NewResolver(builtins, source), nil
}

func splitList(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
