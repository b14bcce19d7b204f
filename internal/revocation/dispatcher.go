package revocation

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// PodView is what the dispatcher needs to know about pods: the one liveness source
// (*podwatch.Watcher on the manager, liveness.SelfOnly on the agent).
type PodView interface {
	// WaitForSync blocks until the view is complete; nothing is decided before.
	WaitForSync(ctx context.Context) bool
	// Confirm applies the liveness predicate, confirming with the API server before it
	// calls a pod dead; an error means "unknown".
	Confirm(ctx context.Context, pod lease.PodRef) (liveness.Verdict, error)
}

var _ PodView = liveness.SelfOnly{}

// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// Event reasons on the holder's Pod.
const (
	// EventReasonRevoked (Normal): a lease of this pod was reaped or revoked.
	EventReasonRevoked = "LeaseRevoked"
	// EventReasonRevocationFailed (Warning): the handler or the cleanup failed.
	EventReasonRevocationFailed = "LeaseRevocationFailed"
)

// Defaults of the dispatcher options.
const (
	DefaultQueueSize = 4096
	DefaultWorkers   = 4
	DefaultTimeout   = 30 * time.Second
	// DefaultDrainTimeout bounds the dispatch of what is still queued at shutdown. With the
	// manager's 30 s termination grace period it leaves time for the HTTP servers' shutdown.
	DefaultDrainTimeout = 20 * time.Second
)

// Dispatcher sends revoked holders through the dispatch matrix (Decide), asynchronously:
// Revoked only enqueues, a pool of workers decides, forwards or runs the handlers. It is the
// admission library's RevocationListener and a manager Runnable (no leader election: every
// replica dispatches what it reaped itself). Workers run only after Start.
type Dispatcher struct {
	pods      PodView
	self      lease.PodRef
	handlers  *Registry
	forwarder Forwarder
	recorder  PodEvents
	metrics   *metrics.Metrics
	clock     clock.PassiveClock
	log       logr.Logger
	workers   int
	timeout   time.Duration
	drain     time.Duration

	queue      chan item
	dropped    prometheus.Counter
	dispatched *prometheus.CounterVec
}

type item struct {
	reason string
	holder lease.Holder
}

// Option configures a Dispatcher.
type Option func(*Dispatcher)

// Forwarder delivers a revocation to the agent of a live holder pod at ip
// (agentlink.HTTPForwarder). Any error counts as "unreachable": the dispatcher then takes
// the dead path.
type Forwarder interface {
	Forward(ctx context.Context, ip string, r Revocation) error
}

// noForwarder is the default: every pod is unreachable.
type noForwarder struct{}

func (noForwarder) Forward(context.Context, string, Revocation) error {
	return fmt.Errorf("no forwarder configured")
}

// WithForwarder sets the forwarder to holder pods' agents (default: none, a live holder
// pod elsewhere is treated as unreachable).
func WithForwarder(f Forwarder) Option { return func(d *Dispatcher) { d.forwarder = f } }

// PodEvents records an Event on a holder's pod, so that kubectl describe pod shows what
// happened to its lease. warning says it is a failure; action and reason are UpperCamelCase.
type PodEvents interface {
	PodEvent(pod lease.PodRef, warning bool, reason, action, note string)
}

// WithRecorder records Kubernetes Events on the holder's Pod (default: none). The manager
// passes podevents.New of its GetEventRecorder("lease-operator").
func WithRecorder(r PodEvents) Option { return func(d *Dispatcher) { d.recorder = r } }

// WithMetrics sets the lease metrics (default: metrics.Default()).
func WithMetrics(m *metrics.Metrics) Option { return func(d *Dispatcher) { d.metrics = m } }

// WithRegisterer registers the dispatcher's own collectors
// (vance_lease_revocation_dispatch_total{action,outcome},
// vance_lease_revocation_dropped_total) with reg (default: not registered). Pass
// controller-runtime's metrics.Registry in the manager.
func WithRegisterer(reg prometheus.Registerer) Option {
	return func(d *Dispatcher) { reg.MustRegister(d.dispatched, d.dropped) }
}

// WithClock sets the clock (default: real clock).
func WithClock(c clock.PassiveClock) Option { return func(d *Dispatcher) { d.clock = c } }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return func(d *Dispatcher) { d.log = l } }

// WithQueueSize bounds the queue (default DefaultQueueSize); a full queue drops.
func WithQueueSize(n int) Option {
	return func(d *Dispatcher) { d.queue = make(chan item, max(n, 1)) }
}

// WithWorkers sets the number of workers (default DefaultWorkers).
func WithWorkers(n int) Option { return func(d *Dispatcher) { d.workers = n } }

// WithTimeout bounds the dispatch of one holder: forward plus handler (default 30 s).
func WithTimeout(t time.Duration) Option { return func(d *Dispatcher) { d.timeout = t } }

// WithDrainTimeout bounds the drain at shutdown (default DefaultDrainTimeout; keep it below
// the pod's terminationGracePeriodSeconds).
func WithDrainTimeout(t time.Duration) Option { return func(d *Dispatcher) { d.drain = t } }

// NewDispatcher returns a dispatcher for the process running in pod self, deciding with
// pods and running the handlers of registry.
func NewDispatcher(pods PodView, self lease.PodRef, registry *Registry, opts ...Option) *Dispatcher {
	d := &Dispatcher{
		pods:     pods,
		self:     self,
		handlers: registry,
		clock:    clock.RealClock{},
		log:      logr.Discard(),
		workers:  DefaultWorkers,
		timeout:  DefaultTimeout,
		drain:    DefaultDrainTimeout,
		queue:    make(chan item, DefaultQueueSize),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "vance_lease_revocation_dropped_total",
			Help: "Revoked holders not dispatched because the dispatcher's queue was full.",
		}),
		dispatched: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vance_lease_revocation_dispatch_total",
			Help: "Revoked holders dispatched, by matrix action and outcome (ok, error).",
		}, []string{"action", "outcome"}),
	}
	for _, o := range opts {
		o(d)
	}
	if d.forwarder == nil {
		d.forwarder = noForwarder{}
	}
	if d.metrics == nil {
		d.metrics = metrics.Default()
	}
	if d.workers < 1 {
		d.workers = 1
	}
	return d
}

// Revoked takes holders that a reaper, a sweep or an operator has just deleted (reason
// idle, pod or revoke), counts them in vance_lease_reap_total{reason} and queues them for
// dispatch. It never blocks: when the queue is full the holder is dropped with a log line
// and vance_lease_revocation_dropped_total (its slot is free anyway; the app learns of the
// loss at its next check).
func (d *Dispatcher) Revoked(ctx context.Context, reason string, holders []lease.Holder) {
	for _, h := range holders {
		d.metrics.Reap.WithLabelValues(reason).Inc()
		select {
		case d.queue <- item{reason: reason, holder: h}:
		default:
			d.dropped.Inc()
			logr.FromContextOrDiscard(ctx).Error(nil, "Revocation queue full, handler not dispatched",
				"holder", h.ID, "type", h.Type, "resource", h.Resource, "reason", reason, "pod", h.Pod.String())
		}
	}
}

// Start runs the workers until ctx is done (the manager got SIGTERM), then drains: what is
// still queued is dispatched, for at most the drain timeout, after which the dispatches in
// flight are cancelled and the rest is dropped with a log line. The holders are already gone
// from the store either way; a crash loses the queue without a drain (docs/operations.md).
func (d *Dispatcher) Start(ctx context.Context) error {
	// The workers' context outlives ctx by the drain: a forward or a session DELETE started
	// during the drain must not be cancelled by the very signal that started it.
	wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	var wg sync.WaitGroup
	for range d.workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					d.drainQueue(wctx)
					return
				case it := <-d.queue:
					d.dispatch(wctx, it)
				}
			}
		})
	}
	<-ctx.Done()
	if n := len(d.queue); n > 0 {
		d.log.Info("Draining the revocation queue before stopping", "queued", n, "timeout", d.drain)
	}
	stop := time.AfterFunc(d.drain, cancel)
	defer stop.Stop()
	wg.Wait()
	if n := len(d.queue); n > 0 {
		d.log.Info("Dispatcher stopped with revocations still queued, their handlers will not run", "queued", n)
	}
	return nil
}

// drainQueue dispatches what is queued until the queue is empty or ctx (the drain timeout)
// ends.
func (d *Dispatcher) drainQueue(ctx context.Context) {
	for ctx.Err() == nil {
		select {
		case it := <-d.queue:
			d.dispatch(ctx, it)
		default:
			return
		}
	}
}

// NeedLeaderElection is false: every replica dispatches what it reaped.
func (d *Dispatcher) NeedLeaderElection() bool { return false }

// dispatch runs the matrix for one holder.
func (d *Dispatcher) dispatch(ctx context.Context, it item) {
	h := it.holder
	start := d.clock.Now()
	log := d.log.WithValues("holder", h.ID, "type", h.Type, "resource", h.Resource,
		"reason", it.reason, "pod", h.Pod.String(), "podBound", h.PodBound)
	ctx, cancel := contextWithTimeout(ctx, d.timeout)
	defer cancel()
	ctx = logr.NewContext(ctx, log)

	self := liveness.IsSelf(h.Pod, d.self)
	if !self && !d.pods.WaitForSync(ctx) {
		log.Error(ctx.Err(), "Pod view not synced, revocation not dispatched")
		d.dispatched.WithLabelValues("none", "error").Inc()
		return
	}
	in := Input{Self: self, PodBound: h.PodBound}
	var ip string
	if !self {
		v, err := d.pods.Confirm(ctx, h.Pod)
		in.Alive, in.Unknown, ip = v.Alive, err != nil, v.IP
		if err != nil {
			log.Info("Holder pod liveness unknown, nothing destructive is done", "error", err.Error())
		}
	}
	action := Decide(in)
	var forwardErr error
	if action == ActionForward {
		forwardErr = d.forward(ctx, h, ip, it.reason)
		if forwardErr != nil {
			in.Unreachable = true
			action = Decide(in)
			log.Info("Holder pod unreachable, taking the dead path", "error", forwardErr.Error(), "action", action)
		}
	}
	var err error
	switch action {
	case ActionLocal:
		err = d.runHandler(ctx, FromHolder(h, it.reason, SiteHolderPod))
	case ActionReaper:
		err = d.runHandler(ctx, FromHolder(h, it.reason, SiteReaper))
	}
	outcome := "ok"
	if err != nil {
		outcome = "error"
		log.Error(err, "Revocation handler failed", "action", action)
	} else {
		log.Info("Lease revoked", "action", action, "tookMs", d.clock.Since(start).Milliseconds())
	}
	d.dispatched.WithLabelValues(string(action), outcome).Inc()
	d.recordEvent(h, it.reason, action, in.Unknown, forwardErr, err)
}

func (d *Dispatcher) forward(ctx context.Context, h lease.Holder, ip, reason string) error {
	if ip == "" {
		return fmt.Errorf("pod %s has no endpoint", h.Pod)
	}
	return d.forwarder.Forward(ctx, ip, FromHolder(h, reason, SiteHolderPod))
}

func (d *Dispatcher) runHandler(ctx context.Context, r Revocation) error {
	h, ok := d.handlers.Handler(r.Type)
	if !ok {
		return fmt.Errorf("no handler for lease type %q", r.Type)
	}
	if err := h.OnRevoked(ctx, r); err != nil {
		return fmt.Errorf("%s handler at %s: %w", r.Type, r.Site, err)
	}
	return nil
}

// recordEvent puts an Event on the holder's Pod, so that kubectl describe pod shows it.
func (d *Dispatcher) recordEvent(h lease.Holder, reason string, action Action, unknown bool, forwardErr, err error) {
	if d.recorder == nil || h.Pod.Name == "" || h.Pod.Namespace == "" {
		return
	}
	subject := fmt.Sprintf("Lease %s (type %s, resource %s)", h.ID, h.Type, h.Resource)
	if err != nil {
		d.recorder.PodEvent(h.Pod, true, EventReasonRevocationFailed, actionVerb(action),
			fmt.Sprintf("%s revoked (%s): %s", subject, reason, lease.Clip(err.Error(), 512)))
		return
	}
	note := map[Action]string{
		ActionLocal:       "handler ran in this pod",
		ActionForward:     "forwarded to the pod's lease agent",
		ActionReleaseOnly: "slot released; the pod-bound resource died with the pod",
		ActionReaper:      "handler ran on the reaper with the holder's payload",
	}[action]
	switch {
	case unknown:
		note = "pod liveness unknown; slot released, no handler run"
	case forwardErr != nil:
		note = "agent unreachable; " + note
	}
	if h.ReclaimedFor != "" {
		// Who reclaimed what (docs/borrowing.md): the slot was borrowed above the tenant's cap.
		note = fmt.Sprintf("borrowed above tenant %s's cap, reclaimed for %s; %s", h.Tenant, h.ReclaimedFor, note)
	}
	d.recorder.PodEvent(h.Pod, false, EventReasonRevoked, actionVerb(action),
		fmt.Sprintf("%s revoked (%s): %s", subject, reason, note))
}

// actionVerb is the Event's action (UpperCamelCase).
func actionVerb(a Action) string {
	switch a {
	case ActionLocal:
		return "RunHandler"
	case ActionForward:
		return "Forward"
	case ActionReleaseOnly:
		return "Release"
	default:
		return "Cleanup"
	}
}

// contextWithTimeout bounds ctx by d; d of zero or less leaves it unbounded.
func contextWithTimeout(ctx context.Context, d time.Duration) (context.Context, context.CancelFunc) {
	if d <= 0 {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, d)
}
