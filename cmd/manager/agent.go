package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/deflink"
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
	sourceIP     string
}

func (f *agentFlags) bind(fs *flag.FlagSet) {
	f.store.bind(fs)
	fs.StringVar(&f.apiAddr, "api-bind-address", fmt.Sprintf("127.0.0.1:%d", settings.AgentAPIPort),
		"Address of the admission API for the pod's own containers.")
	fs.StringVar(&f.internalAddr, "internal-bind-address", fmt.Sprintf(":%d", settings.AgentInternalPort),
		"Address of the endpoint that receives revocations forwarded by other pods.")
	fs.StringVar(&f.managerURL, "manager-url", os.Getenv(settings.EnvManagerURL),
		"URL of the manager's admission Service (env LEASE_MANAGER_URL), required: the agent asks the manager for its tenant and its lease definitions, and for the lazy idle sweep (docs/security.md).")
	fs.StringVar(&f.sourceIP, "manager-source-ip", "",
		"DEVELOPMENT ONLY: the local address of the connections to the manager (definitions, sweep and reclaim relays), where several simulated pods share one host (pods on 127.0.0.x); the manager tells pods apart by source address. In a pod leave it empty.")
}

// check refuses settings under which the agent could never answer.
func (f agentFlags) check(key string) error {
	var errs []error
	if f.managerURL == "" {
		errs = append(errs, errors.New("--manager-url (LEASE_MANAGER_URL) is required: the agent gets its tenant and its lease definitions from the manager"))
	}
	if key == "" {
		errs = append(errs, fmt.Errorf("no agent key: set %s or --internal-secret; the manager answers only signed requests", settings.EnvAgentKey))
	}
	if f.store.defaultsDir != "" {
		errs = append(errs, errors.New("--defaults-dir is the manager's: the agent resolves nothing itself"))
	}
	return errors.Join(errs...)
}

// runAgent runs the lease agent: the admission library for the pod's own containers on
// 127.0.0.1, with the pod's identity from the downward API, the long-poll for revocations,
// and the endpoint that receives revocations forwarded by reapers elsewhere. It reads nothing
// from the Kubernetes API: its tenant and its definitions come from the manager (deflink),
// so the pod's service account needs no role (docs/security.md, "Agents ask the manager").
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
	key := cmp.Or(os.Getenv(settings.EnvAgentKey), agentlink.AgentKey(f.store.secret, self.Namespace))
	if err := f.check(key); err != nil {
		return err
	}
	// Every call to the manager leaves from the pod's address and is signed with the
	// namespace's agent key: the manager answers its agents only (agentauth).
	toManager := agentauth.HTTPClient(f.sourceIP)
	defs := deflink.NewClient(f.managerURL, self.Namespace, key,
		deflink.WithHTTPClient(toManager), deflink.WithClientLogger(log.WithName("definitions")))
	wt := newWaiting()
	// A definition the manager may have changed wakes every waiter, which re-resolves, as
	// followDefinitions does with the manager's own resolver (docs/waiting.md).
	defs.OnChange(func() { wt.queue.WakeAll() })
	store, closeStore, err := setupStore(f.store, wt.storeOptions()...)
	if err != nil {
		return err
	}
	defer closeStore()

	m := metrics.Default()
	hub := notify.NewHub(eventsKeep, realClock)
	registry := handlers.NewDefaultRegistry(hub, nil, nil)
	// The agent watches no pods. Its lazy idle sweep runs on the manager (--manager-url), which
	// dispatches the reaped holders through the full matrix. Only when the manager is not
	// reachable does the agent sweep itself; then its own pod is alive and the liveness of
	// every other pod is unknown: release only, no handler (those holders learn of it at their
	// next check, LEASE_LOST).
	dispatcher := revocation.NewDispatcher(podwatch.SelfOnly{Self: self}, self, registry,
		revocation.WithMetrics(m), revocation.WithRegisterer(ctrlmetrics.Registry),
		revocation.WithLogger(log.WithName("revocation")))
	// A waiter's borrowing reclaim runs on the manager too, which runs the revoked holder's
	// handler and records the Event; here it would be a release only (docs/borrowing.md).
	svcOpts := append(wt.serviceOptions(), leasing.WithIdleReaper(sweeper.RelayReaper(toManager, f.managerURL, key, store)),
		leasing.WithReclaimRelay(sweeper.RelayReclaim(toManager, f.managerURL, key, leasing.ErrRelayUnreachable)),
		leasing.WithRevocationListener(dispatcher), leasing.WithClock(realClock), leasing.WithMetrics(m))
	svc := leasing.NewService(store, defs, registry, svcOpts...)
	wt.startNotifier(ctx, store)

	api := routes(routeHandlers{
		// The pod's containers act only for the tenant of the pod's namespace, as the manager
		// last told it; until the manager answered once, LEASE_UNAVAILABLE.
		api: httpapi.NewHandler(svc, httpapi.WithPodIdentity(httpapi.StaticPodIdentity(self)),
			httpapi.WithTenantBinder(tenancy.Binder{Map: defs.Tenancy(), NonPod: tenancy.NonPodRefused}.Bind),
			httpapi.WithEvents(hub), httpapi.WithMaxWait(maxWait)),
	})
	// The internal port is the one the kubelet and other pods reach: revocations and probes.
	internal := routes(routeHandlers{revoked: newReceiver(self, registry, key, store)})
	internal.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok")) })
	// The consumer path's metrics (acquire, check, release, dispatch), as on the manager.
	internal.Handle("GET "+metrics.Path, metrics.Handler())
	// Ready once the manager answered. Neither a later manager outage nor a store outage makes
	// the agent unready: a sidecar's readiness is the pod's, and an outage would pull every
	// injected pod out of its Services; it shows per call as LEASE_UNAVAILABLE instead.
	internal.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !defs.Ready() {
			http.Error(w, "the manager has not answered yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	})

	log.Info("Starting the lease agent", "pod", self.String(), "api", f.apiAddr, "internal", f.internalAddr, "manager", f.managerURL)
	return runAll(ctx,
		dispatcher,
		defs,
		httpServer{name: "agent API", addr: f.apiAddr, handler: api},
		httpServer{name: "agent internal", addr: f.internalAddr, handler: internal},
	)
}

// runAll runs every runnable until ctx ends or one of them fails, then stops the others and
// waits for them. The agent has no controller-runtime manager: it reads no Kubernetes API.
func runAll(ctx context.Context, runnables ...manager.Runnable) error {
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
			cancel() // a runnable that ends early ends the agent
		}
	}
	return first
}
