// Command agent is the lease agent that the manager's webhook injects into workload pods as a
// native sidecar: the admission API for the pod's own containers on 127.0.0.1, with the pod's
// identity from the downward API, the long-poll for revocations, and the endpoint that
// receives revocations forwarded by reapers elsewhere. It reads nothing from the Kubernetes
// API (its tenant and definitions come from the manager, deflink) and links none of its client
// libraries: a pod pays for an HTTP front of a few store round trips, not for a manager
// (docs/figures.md, "Agent footprint"; TestAgentLinksNoKubernetesClient).
package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/serving"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"k8s.io/utils/clock"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

func main() {
	if os.Getenv("GOMAXPROCS") == "" {
		// One pod's callers, a few short store round trips each: one thread runs them, and
		// no idle thread of a node's worth spins looking for work (docs/figures.md, "Agent
		// footprint": 1.8 → 1.35 ms of CPU per acquire+release).
		runtime.GOMAXPROCS(1)
	}
	if os.Getenv("GOGC") == "" {
		// A small heap: collected at half again the live heap rather than at twice it, for CPU
		// within the footprint benchmark's noise (docs/figures.md, "Agent footprint").
		debug.SetGCPercent(50)
	}
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintf(os.Stderr, "agent: %v\n", err)
		os.Exit(1)
	}
}

// agentFlags are the sidecar's settings.
type agentFlags struct {
	store        serving.StoreFlags
	logLevel     string
	apiAddr      string
	internalAddr string
	managerURL   string
	sourceIP     string
}

func (f *agentFlags) bind(fs *flag.FlagSet) {
	f.store.Bind(fs)
	fs.StringVar(&f.logLevel, "log-level", "info", "Log level: debug, info, warn or error. Logs are JSON lines on stderr.")
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
	if f.store.DefaultsDir != "" {
		errs = append(errs, errors.New("--defaults-dir is the manager's: the agent resolves nothing itself"))
	}
	return errors.Join(errs...)
}

// run runs the lease agent: the admission library for the pod's own containers on
// 127.0.0.1, with the pod's identity from the downward API, the long-poll for revocations,
// and the endpoint that receives revocations forwarded by reapers elsewhere. It reads nothing
// from the Kubernetes API: its tenant and its definitions come from the manager (deflink),
// so the pod's service account needs no role (docs/security.md, "Agents ask the manager").
func run(args []string) error {
	var f agentFlags
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	f.bind(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	root, err := newLogger(f.logLevel)
	if err != nil {
		return err
	}
	// The admission library logs through controller-runtime's logger shim (a logr delegate
	// with no Kubernetes dependency): it goes to the same JSON lines.
	logf.SetLogger(root)
	log := root.WithName("agent")
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// The process's registry: the lease metrics, and the Go runtime's and the process's own
	// (memory, CPU, goroutines), which the footprint benchmark reads.
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics.UseRegistry(reg)

	self, err := httpapi.AgentIdentityFromEnv()
	if err != nil {
		return err
	}
	key := cmp.Or(os.Getenv(settings.EnvAgentKey), agentlink.AgentKey(f.store.Secret, self.Namespace))
	if err := f.check(key); err != nil {
		return err
	}
	// Every call to the manager leaves from the pod's address and is signed with the
	// namespace's agent key: the manager answers its agents only (agentauth).
	toManager := agentauth.HTTPClient(f.sourceIP)
	defs := deflink.NewClient(f.managerURL, self.Namespace, key,
		deflink.WithHTTPClient(toManager), deflink.WithClientLogger(log.WithName("definitions")))
	wt := serving.NewWaiting()
	// A definition the manager may have changed wakes every waiter, which re-resolves, as the
	// manager's own resolver does (docs/waiting.md).
	wt.FollowDefinitions(defs.OnChange)
	store, closeStore, err := f.store.Connect(append(wt.StoreOptions(), leasestore.WithSmallPool(poolSize))...)
	if err != nil {
		return err
	}
	defer closeStore()

	m := metrics.Default()
	hub := notify.NewHub(serving.EventsKeep, clock.RealClock{})
	registry := handlers.NewDefaultRegistry(hub, nil, nil)
	// The agent watches no pods. Its lazy idle sweep runs on the manager (--manager-url), which
	// dispatches the reaped holders through the full matrix. Only when the manager is not
	// reachable does the agent sweep itself; then its own pod is alive and the liveness of
	// every other pod is unknown: release only, no handler (those holders learn of it at their
	// next check, LEASE_LOST).
	dispatcher := revocation.NewDispatcher(liveness.SelfOnly{Self: self}, self, registry,
		revocation.WithMetrics(m), revocation.WithRegisterer(reg), revocation.WithQueueSize(revocationQueue),
		revocation.WithLogger(log.WithName("revocation")))
	// A waiter's borrowing reclaim runs on the manager too, which runs the revoked holder's
	// handler and records the Event; here it would be a release only (docs/borrowing.md).
	svcOpts := append(wt.ServiceOptions(), leasing.WithIdleReaper(sweeper.RelayReaper(toManager, f.managerURL, key, store)),
		leasing.WithReclaimRelay(sweeper.RelayReclaim(toManager, f.managerURL, key, leasing.ErrRelayUnreachable)),
		leasing.WithRevocationListener(dispatcher), leasing.WithClock(clock.RealClock{}), leasing.WithMetrics(m))
	svc := leasing.NewService(store, defs, registry, svcOpts...)
	wt.StartNotifier(ctx, store)

	api := serving.Routes(serving.Handlers{
		// The pod's containers act only for the tenant of the pod's namespace, as the manager
		// last told it; until the manager answered once, LEASE_UNAVAILABLE.
		API: httpapi.NewHandler(svc, httpapi.WithPodIdentity(httpapi.StaticPodIdentity(self)),
			httpapi.WithTenantBinder(tenancy.Binder{Map: defs.Tenancy(), NonPod: tenancy.NonPodRefused}.Bind),
			httpapi.WithEvents(hub), httpapi.WithMaxWait(serving.MaxWait)),
	})
	// The internal port is the one the kubelet and other pods reach: revocations and probes.
	internal := serving.Routes(serving.Handlers{Revoked: serving.NewReceiver(self, registry, key, store, root.WithName("receiver"))})
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

	go releaseStartupGarbage(ctx, defs.Ready)
	log.Info("Starting the lease agent", "pod", self.String(), "api", f.apiAddr, "internal", f.internalAddr, "manager", f.managerURL)
	return serving.RunAll(ctx,
		dispatcher,
		defs,
		serving.HTTPServer{Name: "agent API", Addr: f.apiAddr, Handler: api},
		serving.HTTPServer{Name: "agent internal", Addr: f.internalAddr, Handler: internal},
	)
}

// releaseStartupGarbage gives the heap's start-up garbage back to the system once the agent
// is ready (the manager answered): a collection and a scavenge, once. Left to the runtime,
// the pages stay resident until a collection runs, which an idle agent may not need for
// minutes; measured, 1.5–2 MiB of an idle agent's memory (docs/figures.md, "Agent footprint").
func releaseStartupGarbage(ctx context.Context, ready func() bool) {
	t := time.NewTicker(100 * time.Millisecond)
	defer t.Stop()
	for !ready() {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
	debug.FreeOSMemory()
}

// poolSize bounds the agent's store connections: one pod's callers, whose calls are a few
// short round trips each, and the notifier's poll. The driver opens connections on demand
// and closes idle ones (docs/operations.md, "Agent footprint").
const poolSize = 4

// revocationQueue bounds the revocations waiting for dispatch: those of one pod's holders
// (the manager's default is for a cluster's).
const revocationQueue = 256

// newLogger returns JSON lines on stderr at level.
func newLogger(level string) (logr.Logger, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		return logr.Logger{}, fmt.Errorf("--log-level %q: %w", level, err)
	}
	return logr.FromSlogHandler(slog.NewJSONHandler(os.Stderr, &slog.HandlerOptions{Level: l})), nil
}
