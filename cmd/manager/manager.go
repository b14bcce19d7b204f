package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"time"

	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
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
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/controller"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/podadmit"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/revocation/handlers/k8ssecret"
	"github.com/vancetope/lease-operator/internal/revocation/podevents"
	"github.com/vancetope/lease-operator/internal/serving"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
)

// managerFlags are the manager's settings.
type managerFlags struct {
	store           serving.StoreFlags
	adminSecret     string
	adminAddr       string
	mcpEndpoints    string
	metricsAddr     string
	metricsSecure   bool
	probeAddr       string
	apiAddr         string
	leaderElect     bool
	namespaces      string
	reapInterval    time.Duration
	reconcileSafety time.Duration
	allowNonPod     bool
	agentImage      string
	agentSecret     string
	agentManagerURL string
	agentPort       int
	webhookPort     int
	webhookCertDir  string
	podAdmission    bool
	gateWebhook     bool
	tenancy         tenancyFlags
	live            liveAPIFlags
}

func (f *managerFlags) bind(fs *flag.FlagSet) {
	f.store.Bind(fs)
	f.tenancy.bind(fs)
	fs.StringVar(&f.mcpEndpoints, "mcp-endpoints", "",
		"Comma-separated MCP endpoints (http(s) URLs) the reaper may send a session DELETE to; a tenant's Secret supplies credentials for these only. Empty: none (docs/security.md).")
	fs.StringVar(&f.adminSecret, "admin-secret", os.Getenv(settings.EnvAdminSecret),
		"Bearer secret of the operator API /internal/lease/admin/... (env LEASE_ADMIN_SECRET); empty disables it.")
	fs.StringVar(&f.adminAddr, "admin-bind-address", settings.DefaultAdminAddress,
		"Address of the operator API, served only when --admin-secret is set; never the admission port (docs/security.md).")
	fs.StringVar(&f.metricsAddr, "metrics-bind-address", ":8080", "Address of the Prometheus metrics endpoint; 0 disables it.")
	fs.BoolVar(&f.metricsSecure, "metrics-secure", false, "Serve metrics over HTTPS with Kubernetes authentication and authorization (TokenReview, SubjectAccessReview).")
	fs.StringVar(&f.probeAddr, "health-probe-bind-address", ":8081", "Address of /healthz and /readyz.")
	fs.StringVar(&f.apiAddr, "api-bind-address", ":8082", "Address of the admission HTTP API (/v1/leases) and the internal revocation endpoint.")
	fs.BoolVar(&f.leaderElect, "leader-elect", false, "Elect a leader for the status controller (every replica serves the API, sweeps and dispatches).")
	fs.StringVar(&f.namespaces, "namespaces", "", "Comma-separated namespaces to watch for LeaseDefinitions and pods; empty watches all.")
	fs.BoolVar(&f.allowNonPod, "allow-non-pod-callers", false,
		"DEVELOPMENT ONLY: let callers of the admission API that are no pod (a curl on the host) act for any tenant they name. Off, they are refused with 403 TENANT_FORBIDDEN; pods always act only for the tenant of their namespace (docs/tenancy.md). It opens no /internal endpoint: those answer signed requests of agents only (docs/security.md).")
	fs.DurationVar(&f.reapInterval, "reap-interval", 30*time.Second, "Interval of the scheduled sweep: idle reap, pod-dead reap, reconcile.")
	fs.DurationVar(&f.reconcileSafety, "reconcile-safety", leasestore.DefaultSafetyMargin, "Reconcile corrects only counters unchanged for this long.")
	fs.StringVar(&f.agentImage, "agent-image", "", "Image of the injected lease agent (normally the manager's own); empty disables the injection webhook.")
	fs.StringVar(&f.agentSecret, "agent-store-secret", inject.DefaultStoreSecret, "Secret (in the pod's namespace) whose key uri the agent uses as MONGODB_URI.")
	fs.StringVar(&f.agentManagerURL, "agent-manager-url", "",
		"URL of this manager's admission Service, given to injected agents (LEASE_MANAGER_URL), required with --agent-image: agents ask it for their tenant, their lease definitions and their lazy idle sweeps.")
	fs.IntVar(&f.agentPort, "agent-internal-port", settings.AgentInternalPort, "Port of the agents' internal revocation endpoint.")
	fs.IntVar(&f.webhookPort, "webhook-port", 9443, "Port of the webhook server.")
	fs.StringVar(&f.webhookCertDir, "webhook-cert-dir", "", "Directory with tls.crt and tls.key of the webhook server (default: controller-runtime's).")
	fs.BoolVar(&f.podAdmission, "pod-admission", true,
		"Admit pods annotated "+podadmit.AnnotationLease+" by lease: acquire on the pod's behalf and remove its scheduling gate "+podadmit.Gate+" once granted (docs/pod-admission.md). Runs on the leader.")
	fs.BoolVar(&f.gateWebhook, "pod-admission-webhook", false,
		"Serve the webhook that gates annotated pods at creation even without --agent-image (with it, the webhook server serves both).")
	f.live.bind(fs)
}

// runManager reads like a table of contents: each setup step builds one concern and hands
// its product to the next.
func runManager(args []string) error {
	var f managerFlags
	fs := flag.NewFlagSet("manager", flag.ContinueOnError)
	f.bind(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := f.validate(); err != nil {
		return err
	}
	ctx := ctrl.SetupSignalHandler()
	// The lease metrics go to controller-runtime's registry, which the metrics endpoint serves.
	metrics.UseRegistry(ctrlmetrics.Registry)

	mgr, err := setupManager(f)
	if err != nil {
		return err
	}
	if f.store.Secret == "" {
		// Unsigned revocations are refused everywhere: without a flag, every replica shares
		// one generated secret stored in the system namespace.
		if f.store.Secret, err = ensureInternalSecret(ctx, mgr.GetConfig(), f.tenancy.systemNamespace); err != nil {
			return err
		}
	}
	wt := serving.NewWaiting()
	store, closeStore, err := f.store.Connect(append(wt.StoreOptions(), leasestore.WithSafetyMargin(f.reconcileSafety))...)
	if err != nil {
		return err
	}
	defer closeStore()
	if err := store.EnsureIndexes(ctx); err != nil {
		// Fail closed, not dead: acquisitions answer LEASE_UNAVAILABLE until the store
		// answers; the indexes are created by the next start.
		ctrl.Log.WithName("setup").Error(err, "Creating the store's indexes failed; continuing")
	}
	resolver, tenants, err := newTenantResolver(ctx, mgr, f.store.DefaultsDir, f.tenancy, splitList(f.namespaces))
	if err != nil {
		return err
	}
	wt.FollowDefinitions(resolver.OnChange)
	if err := controller.SetupLeaseDefinitions(ctx, mgr, resolver, tenants); err != nil {
		return err
	}
	rev, err := setupRevocation(mgr, f, store)
	if err != nil {
		return err
	}
	svc, err := setupAPIServer(ctx, mgr, f, store, resolver, tenants, rev, wt)
	if err != nil {
		return err
	}
	if err := setupLiveAPI(mgr, f.live, store, liveapi.Deps{
		Store: store, Listener: rev.dispatcher, Sweeper: rev.sweep, Pods: rev.watcher, Metrics: rev.metrics, Tenants: tenants, Caps: resolver,
		Reviewer: svc}); err != nil {
		return err
	}
	if err := setupWebhooks(mgr, f); err != nil {
		return err
	}
	if f.podAdmission {
		admitter := podadmit.NewAdmitter(mgr.GetClient(), svc, tenants, mgr.GetEventRecorder("lease-operator"),
			podadmit.WithDefinitions(resolver), podadmit.WithHolders(store), podadmit.WithLogger(ctrl.Log.WithName("podadmit")))
		if err := admitter.SetupWithManager(mgr); err != nil {
			return fmt.Errorf("setting up pod admission: %w", err)
		}
	}
	if err := setupChecks(mgr, rev.watcher); err != nil {
		return err
	}
	ctrl.Log.WithName("setup").Info("Starting the manager", "api", f.apiAddr, "admin", adminLogAddr(f), "database", f.store.Database, "webhook", f.webhooksOn(), "podAdmission", f.podAdmission)
	return mgr.Start(ctx)
}

func (f *managerFlags) validate() error {
	if least := 2 * leasestore.DefaultOpTimeout; f.reconcileSafety < least {
		return fmt.Errorf("--reconcile-safety %v is too short: it must exceed what an acquire or release may take (at least %v)", f.reconcileSafety, least)
	}
	if f.agentImage != "" && f.agentManagerURL == "" {
		return errors.New("--agent-image needs --agent-manager-url: injected agents ask this manager's admission Service for their definitions")
	}
	return validateAdminAddr(f.adminSecret, f.adminAddr, f.apiAddr)
}

// validateAdminAddr refuses an operator API that would share the admission port: its bearer
// secret must not travel where every pod can reach. Without a secret the API is off and the
// address is not used.
func validateAdminAddr(secret, adminAddr, apiAddr string) error {
	if secret == "" {
		return nil
	}
	if adminAddr == "" {
		return errors.New("--admin-secret needs --admin-bind-address: the operator API is never served on the admission port")
	}
	_, adminPort, err := net.SplitHostPort(adminAddr)
	if err != nil {
		return fmt.Errorf("--admin-bind-address %q: %w", adminAddr, err)
	}
	if _, apiPort, err := net.SplitHostPort(apiAddr); err == nil && apiPort == adminPort {
		return fmt.Errorf("--admin-bind-address %q shares port %s with --api-bind-address %q: the operator API needs a port of its own", adminAddr, adminPort, apiAddr)
	}
	return nil
}

// setupManager builds the controller-runtime manager: scheme, cache scope, metrics, probes,
// leader election and the webhook server.
func setupManager(f managerFlags) (ctrl.Manager, error) {
	scheme := runtime.NewScheme()
	utilruntime.Must(clientgoscheme.AddToScheme(scheme))
	utilruntime.Must(leasev1alpha1.AddToScheme(scheme))
	opts := ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsOptions(f.metricsAddr, f.metricsSecure),
		HealthProbeBindAddress: f.probeAddr,
		LeaderElection:         f.leaderElect,
		LeaderElectionID:       "lease-operator.vancetope.io",
	}
	if namespaces := splitList(f.namespaces); len(namespaces) > 0 {
		opts.Cache.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range namespaces {
			opts.Cache.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	if f.webhooksOn() {
		opts.WebhookServer = webhook.NewServer(webhook.Options{Port: f.webhookPort, CertDir: f.webhookCertDir})
	}
	mgr, err := ctrl.NewManager(ctrl.GetConfigOrDie(), opts)
	if err != nil {
		return nil, fmt.Errorf("creating the manager: %w", err)
	}
	return mgr, nil
}

// revocationParts are what the manager builds to reap and revoke: the pod view, the handler
// registry, the dispatcher, the scheduled sweeper and the notice hub of the long-poll.
type revocationParts struct {
	self       lease.PodRef
	watcher    *podwatch.Watcher
	hub        *notify.Hub
	registry   *revocation.Registry
	dispatcher *revocation.Dispatcher
	sweep      *sweeper.Sweeper
	metrics    *metrics.Metrics
}

// setupRevocation builds pod liveness, the revocation dispatcher and the sweeper, and adds
// the long-running ones to the manager.
func setupRevocation(mgr ctrl.Manager, f managerFlags, store *leasestore.Store) (revocationParts, error) {
	log := ctrl.Log.WithName("setup")
	self, err := httpapi.AgentIdentityFromEnv()
	if err != nil {
		log.Info("Running without a pod identity (outside a cluster?)", "reason", err.Error())
		self = lease.PodRef{}
	}
	watcher, err := podwatch.New(mgr.GetConfig(), podwatch.WithSelf(self), podwatch.WithNamespaces(splitList(f.namespaces)...),
		podwatch.WithRegisterer(ctrlmetrics.Registry), podwatch.WithLogger(ctrl.Log.WithName("podwatch")))
	if err != nil {
		return revocationParts{}, err
	}
	m := metrics.Default()
	hub := notify.NewHub(serving.EventsKeep, realClock)
	registry := handlers.NewDefaultRegistry(hub, k8ssecret.Reader{Reader: mgr.GetAPIReader()}, nil, splitList(f.mcpEndpoints)...)
	dispatcher := revocation.NewDispatcher(watcher, self, registry,
		revocation.WithForwarder(agentlink.NewHTTPForwarder(nil, f.agentPort, f.store.Secret)),
		revocation.WithRecorder(podevents.New(mgr.GetEventRecorder("lease-operator"))),
		revocation.WithMetrics(m),
		revocation.WithRegisterer(ctrlmetrics.Registry),
		revocation.WithLogger(ctrl.Log.WithName("revocation")))
	sweep := sweeper.New(store, watcher, dispatcher,
		sweeper.WithInterval(f.reapInterval), sweeper.WithMetrics(m), sweeper.WithLogger(ctrl.Log.WithName("sweeper")))
	watcher.OnPodGone(sweep.PodGone)
	for _, r := range []manager.Runnable{watcher, dispatcher, sweep} {
		if err := mgr.Add(r); err != nil {
			return revocationParts{}, fmt.Errorf("adding runnable: %w", err)
		}
	}
	return revocationParts{self: self, watcher: watcher, hub: hub, registry: registry, dispatcher: dispatcher, sweep: sweep, metrics: m}, nil
}

// setupAPIServer serves the admission API (waiting in wt's queue, docs/waiting.md), the revocation receiver, the agents' sweep
// relay and the agents' definitions on --api-bind-address, and the operator API on --admin-bind-address. It returns the
// admission service, whose dry run the live API's acquisition reviews run.
func setupAPIServer(ctx context.Context, mgr ctrl.Manager, f managerFlags, store *leasestore.Store, resolver *definition.Resolver,
	tenants *k8stenancy.Informed, rev revocationParts, wt serving.Waiting) (*leasing.Service, error) {
	svc := leasing.NewService(store, resolver, rev.registry, append(wt.ServiceOptions(),
		leasing.WithRevocationListener(rev.dispatcher), leasing.WithClock(realClock), leasing.WithMetrics(rev.metrics))...)
	wt.StartNotifier(ctx, store)
	ctrlmetrics.Registry.MustRegister(metrics.NewStateCollector(metrics.StoreState(store, resolver))) // docs/observability.md
	servers := apiServers(f, admissionHandlers(f, admissionParts{
		svc: svc, store: store, resolver: resolver, tenants: tenants, identify: podByIP(rev.watcher),
		versions: agentVersions(resolver, tenants), hub: rev.hub, self: rev.self, registry: rev.registry, listener: rev.dispatcher,
	}), adminapi.NewHandler(store, rev.dispatcher, rev.sweep, f.adminSecret,
		adminapi.WithMetrics(rev.metrics), adminapi.WithLogger(ctrl.Log.WithName("admin"))))
	for _, srv := range servers {
		if err := mgr.Add(srv); err != nil {
			return nil, fmt.Errorf("adding the %s: %w", srv.Name, err)
		}
	}
	return svc, nil
}

// apiServers are the manager's HTTP servers besides the live API: the admission server on
// --api-bind-address (admission API, revocation receiver, sweep relay) and, only when an
// admin secret is set, the operator API alone on --admin-bind-address. The admission server
// never routes the operator API: every pod reaches it, and the bearer secret must not travel
// there (issue 26).
func apiServers(f managerFlags, h serving.Handlers, admin http.Handler) []serving.HTTPServer {
	servers := []serving.HTTPServer{{Name: "admission API", Addr: f.apiAddr, Handler: serving.Routes(h)}}
	if f.adminSecret != "" {
		servers = append(servers, serving.HTTPServer{Name: "operator API", Addr: f.adminAddr, Handler: adminRoutes(admin)})
	}
	return servers
}

// adminLogAddr is the operator API's address for the start-up log, "off" without a secret.
func adminLogAddr(f managerFlags) string {
	if f.adminSecret == "" {
		return "off"
	}
	return f.adminAddr
}

// managerBinder binds each acquisition to its calling pod's tenant; a caller that is no pod
// is refused unless the development setting --allow-non-pod-callers is on, which is logged
// loudly (docs/tenancy.md, "Who may acquire for a tenant").
func managerBinder(tenants tenancy.Map, allowNonPod bool) httpapi.TenantBinder {
	policy := tenancy.NonPodRefused
	if allowNonPod {
		policy = tenancy.NonPodAnyTenant
		ctrl.Log.WithName("setup").Info("DEVELOPMENT SETTING --allow-non-pod-callers: callers that are no pod may act for any tenant")
	}
	return tenancy.Binder{Map: tenants, NonPod: policy}.Bind
}

// webhooksOn reports whether the manager runs a webhook server: for the sidecar injection
// (an agent image is configured), and then also for pod admission's gate, or for the gate
// alone.
func (f managerFlags) webhooksOn() bool { return f.agentImage != "" || f.gateWebhook }

// setupWebhooks registers the webhooks the server runs for: the pod admission gate, and the
// sidecar injection when an agent image is configured.
func setupWebhooks(mgr ctrl.Manager, f managerFlags) error {
	if !f.webhooksOn() {
		return nil
	}
	if err := podadmit.SetupWebhookWithManager(mgr); err != nil {
		return err
	}
	if f.agentImage == "" {
		return nil
	}
	cfg := inject.Config{Image: f.agentImage, StoreSecret: f.agentSecret, StoreDatabase: f.store.Database, ManagerURL: f.agentManagerURL,
		AgentKey: func(ns string) string { return agentlink.AgentKey(f.store.Secret, ns) }}
	if err := inject.SetupWebhookWithManager(mgr, cfg); err != nil {
		return fmt.Errorf("setting up the injection webhook: %w", err)
	}
	return nil
}

// setupChecks adds /healthz and /readyz. The store is deliberately not a readiness check: a
// MongoDB blip would take every replica out of its Services and, with the webhook's
// failurePolicy Fail, block annotated pods; callers get 503 LEASE_UNAVAILABLE per call instead.
func setupChecks(mgr ctrl.Manager, watcher *podwatch.Watcher) error {
	if err := mgr.AddHealthzCheck("healthz", healthz.Ping); err != nil {
		return fmt.Errorf("adding health check: %w", err)
	}
	if err := mgr.AddReadyzCheck("pods", watcher.ReadyCheck); err != nil {
		return fmt.Errorf("adding ready check: %w", err)
	}
	return nil
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
