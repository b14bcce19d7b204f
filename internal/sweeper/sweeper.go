// Package sweeper runs the scheduled reaper round (docs/design.md, "Reaping"): every reap interval
// (default 30 s) an idle reap over all resources, a pod-dead reap (holders whose pod is dead
// by the one liveness predicate) and a reconcile of the counters; and, between rounds, an
// immediate pod-dead reap for every pod the informer reports deleted or finished, so that a
// dead pod's slots come back at once rather than after the interval.
//
// Every reaped holder goes to the revocation listener (the dispatcher), which runs the
// handlers. Any number of replicas may sweep at the same time without leader election: a
// holder is deleted by findOneAndDelete and only the deleter decrements and dispatches it,
// so concurrent sweeps neither double-count nor double-dispatch; reconcile is a
// compare-and-set.
package sweeper

import (
	"context"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// DefaultInterval is the default reap interval (--reap-interval).
const DefaultInterval = 30 * time.Second

// confirmTimeout bounds the API server read that confirms a pod's death.
const confirmTimeout = 10 * time.Second

// Reasons passed to the listener, as in the reap metric.
const (
	ReasonIdle = metrics.ReapIdle
	ReasonPod  = metrics.ReapPod
)

// Store is the part of the lease store a sweep uses (*leasestore.Store).
type Store interface {
	// SweepRound reads the holders once: it reaps the idle ones and returns the holders'
	// pods and bookings, which ReconcileRound compares with the counters.
	SweepRound(ctx context.Context) (leasestore.Round, error)
	ReconcileRound(ctx context.Context, r leasestore.Round) (leasestore.ReconcileResult, error)
	HolderPodsOf(ctx context.Context, pods []lease.PodRef) ([]lease.PodRef, error)
	ReapPod(ctx context.Context, pod lease.PodRef) ([]lease.Holder, error)
}

// Liveness is the part of the pod view a sweep uses (*podwatch.Watcher).
type Liveness interface {
	// WaitForSync blocks until the informer has listed the pods once.
	WaitForSync(ctx context.Context) bool
	// Confirm is the liveness predicate: the cache, confirmed with the API server before a
	// pod is called dead (the same source the dispatcher decides with).
	Confirm(ctx context.Context, pod lease.PodRef) (liveness.Verdict, error)
}

// Listener receives reaped holders (the revocation dispatcher). It must not block.
type Listener interface {
	Revoked(ctx context.Context, reason string, holders []lease.Holder)
}

var _ Store = (*leasestore.Store)(nil)

// Result summarises one round.
type Result struct {
	Idle      int
	Pod       int
	Reconcile leasestore.ReconcileResult
}

// Sweeper is the scheduled reaper, a manager Runnable without leader election.
type Sweeper struct {
	store    Store
	pods     Liveness
	listener Listener
	interval time.Duration
	clock    clock.WithTicker
	metrics  *metrics.Metrics
	log      logr.Logger

	mu      sync.Mutex
	pending map[lease.PodRef]bool
	wake    chan struct{}
}

// Option configures a Sweeper.
type Option func(*Sweeper)

// WithInterval sets the reap interval (default DefaultInterval).
func WithInterval(d time.Duration) Option { return func(s *Sweeper) { s.interval = d } }

// WithClock sets the clock that ticks the rounds (default: real clock).
func WithClock(c clock.WithTicker) Option { return func(s *Sweeper) { s.clock = c } }

// WithMetrics sets the metrics (default: metrics.Default()). Reaps are counted by the
// listener (the dispatcher counts every reap path alike); the sweeper counts reconcile.
func WithMetrics(m *metrics.Metrics) Option { return func(s *Sweeper) { s.metrics = m } }

// WithLogger sets the logger (default: discard).
func WithLogger(l logr.Logger) Option { return func(s *Sweeper) { s.log = l } }

// New returns a sweeper over store that asks pods for liveness and hands reaped holders to
// listener. Wire the informer's notifications with watcher.OnPodGone(sweeper.PodGone).
func New(store Store, pods Liveness, listener Listener, opts ...Option) *Sweeper {
	s := &Sweeper{
		store:    store,
		pods:     pods,
		listener: listener,
		interval: DefaultInterval,
		clock:    clock.RealClock{},
		log:      logr.Discard(),
		pending:  map[lease.PodRef]bool{},
		wake:     make(chan struct{}, 1),
	}
	for _, o := range opts {
		o(s)
	}
	if s.metrics == nil {
		s.metrics = metrics.Default()
	}
	if s.interval <= 0 {
		s.interval = DefaultInterval
	}
	return s
}

// NeedLeaderElection is false: concurrent sweeps are safe (delete idempotence).
func (s *Sweeper) NeedLeaderElection() bool { return false }

// PodGone queues an immediate pod-dead reap of pod (called by the informer when a pod is
// deleted or finishes). It never blocks.
func (s *Sweeper) PodGone(pod lease.PodRef) {
	if pod.Name == "" {
		return
	}
	s.mu.Lock()
	s.pending[pod] = true
	s.mu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// Start waits for the pod informer, sweeps once, and then every interval, reaping gone pods
// as they are reported, until ctx is done.
func (s *Sweeper) Start(ctx context.Context) error {
	if !s.pods.WaitForSync(ctx) {
		return nil // ctx done before the informer synced
	}
	ticker := s.clock.NewTicker(s.interval)
	defer ticker.Stop()
	s.logRound(s.Sweep(ctx))
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C():
			s.logRound(s.Sweep(ctx))
		case <-s.wake:
			s.reapGone(ctx)
		}
	}
}

// Sweep runs one round now: idle reap, pod-dead reap, reconcile (also the operator's
// "lease sweep"), on one read of the holders (leasestore.SweepRound). A failing step does not
// stop the others; holders reaped before an error are still dispatched. When the holders
// could not be read, no pod is judged and no counter reconciled. The error is the first
// step's error.
func (s *Sweeper) Sweep(ctx context.Context) (Result, error) {
	var res Result
	var errs []error

	round, err := s.store.SweepRound(ctx)
	s.dispatch(ctx, ReasonIdle, round.Idle)
	res.Idle = len(round.Idle)
	if err != nil {
		errs = append(errs, err)
	}

	n, err := s.reapDeadPods(ctx, round.Pods)
	res.Pod = n
	if err != nil {
		errs = append(errs, err)
	}

	rr, err := s.store.ReconcileRound(ctx, round)
	res.Reconcile = rr
	// Corrected and recreated counters both had a wrong count; deleted ones are dormant
	// documents no holder books any more.
	if fixed := rr.Corrected; fixed > 0 {
		s.metrics.Reconcile.WithLabelValues(metrics.ReconcileCorrected).Add(float64(fixed))
	}
	if err != nil {
		errs = append(errs, err)
	}
	if len(errs) > 0 {
		return res, errs[0]
	}
	return res, nil
}

// reapDeadPods reaps the holders of every holder pod that is dead.
func (s *Sweeper) reapDeadPods(ctx context.Context, pods []lease.PodRef) (int, error) {
	n := 0
	var first error
	for _, p := range pods {
		if p.Name == "" {
			continue // a holder without a pod is only reaped when idle
		}
		reaped, err := s.reapIfDead(ctx, p)
		n += reaped
		if err != nil && first == nil {
			first = err
		}
	}
	return n, first
}

// reapIfDead reaps pod's holders when the cache and the API server both call it dead.
func (s *Sweeper) reapIfDead(ctx context.Context, pod lease.PodRef) (int, error) {
	cctx, cancel := context.WithTimeout(ctx, confirmTimeout)
	v, err := s.pods.Confirm(cctx, pod)
	cancel()
	if err != nil || v.Alive {
		// Alive, or not sure: leave it to the next round (the TTL still bounds it).
		return 0, err
	}
	reason := v.Reason
	holders, err := s.store.ReapPod(ctx, pod)
	s.dispatch(ctx, ReasonPod, holders)
	if len(holders) > 0 {
		s.log.Info("Reaped holders of dead pod", "pod", pod.String(), "uid", pod.UID, "liveness", reason, "holders", len(holders))
	}
	return len(holders), err
}

// reapGone reaps the pods reported gone since the last call. One store query finds which of
// them hold anything (most pods of a cluster hold nothing); only those are confirmed dead
// with the API server and reaped, per UID their holders recorded.
func (s *Sweeper) reapGone(ctx context.Context) {
	s.mu.Lock()
	pending := s.pending
	s.pending = map[lease.PodRef]bool{}
	s.mu.Unlock()
	gone := make([]lease.PodRef, 0, len(pending))
	for pod := range pending {
		gone = append(gone, pod)
	}
	holding, err := s.store.HolderPodsOf(ctx, gone)
	if err != nil {
		s.log.Error(err, "Immediate pod-dead reap failed; the next round retries", "pods", len(gone))
	}
	for _, p := range holding {
		if _, err := s.reapIfDead(ctx, p); err != nil {
			s.log.Error(err, "Immediate pod-dead reap failed; the next round retries", "pod", p.String())
		}
	}
}

func (s *Sweeper) dispatch(ctx context.Context, reason string, holders []lease.Holder) {
	if len(holders) > 0 && s.listener != nil {
		s.listener.Revoked(ctx, reason, holders)
	}
}

func (s *Sweeper) logRound(res Result, err error) {
	if err != nil {
		s.log.Error(err, "Sweep incomplete", "idle", res.Idle, "pod", res.Pod)
		return
	}
	if res.Idle > 0 || res.Pod > 0 || res.Reconcile.Corrected > 0 || res.Reconcile.Repaired > 0 || res.Reconcile.Deleted > 0 || res.Reconcile.Unmarked > 0 {
		s.log.Info("Sweep", "idle", res.Idle, "pod", res.Pod, "corrected", res.Reconcile.Corrected,
			"repaired", res.Reconcile.Repaired, "deleted", res.Reconcile.Deleted, "skipped", res.Reconcile.Skipped,
			"unmarked", res.Reconcile.Unmarked)
	} else {
		s.log.V(1).Info("Sweep found nothing")
	}
}
