package leasing

import (
	"context"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"k8s.io/utils/clock"
	"k8s.io/utils/lru"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/waitq"
)

// Store is the part of the lease store the admission service uses.
type Store interface {
	// Acquire makes one attempt at the funnel: a *lease.BusyError when a level is full.
	Acquire(ctx context.Context, req leasestore.AcquireRequest) (lease.Holder, error)
	// TouchParts is the check-at-use; it answers the holder's fence and the parts of a holder
	// of several resources (nil for a holder of one), each with its fence.
	TouchParts(ctx context.Context, token string) (fence int64, parts []lease.Part, err error)
	UpdatePayload(ctx context.Context, token string, payload map[string]string) error
	Release(ctx context.Context, token string) (released bool, err error)
	// SweepIdle deletes the idle holders of resource and returns them, with when the next
	// of the others goes idle.
	SweepIdle(ctx context.Context, resource string) (leasestore.IdleSweep, error)
	// Resume goes on with an acquisition waiting in a level's line; Withdraw ends it
	// (docs/waiting.md).
	Resume(ctx context.Context, req leasestore.AcquireRequest, granted string, look bool) (lease.Holder, error)
	Withdraw(ctx context.Context, token string) error
	// Repair removes the entries of one counter whose holder is gone.
	Repair(ctx context.Context, key string) (int, error)
	// Ahead counts the live waiters ahead of token in the line of key (all of them when
	// token is not in it); HoldTimes are the resource's recent hold times. A busy answer
	// explains itself with them.
	Ahead(ctx context.Context, key, token string) (int, error)
	HoldTimes(ctx context.Context, resource string) ([]time.Duration, error)
	// Probe reads the funnel's counters and returns the first full level, narrow to wide,
	// or nil; it writes nothing (the dry run).
	Probe(ctx context.Context, resource string, caps []lease.LevelCap, tenant, project, user string) (*lease.BusyError, error)
	// Reclaim revokes a borrowed slot for a waiter at the global level whose tenant is
	// within its cap (docs/borrowing.md).
	Reclaim(ctx context.Context, req leasestore.ReclaimRequest) (lease.Holder, bool, error)
	// GetHolderByID and Line let ReclaimFor check the waiter an agent names.
	GetHolderByID(ctx context.Context, id string) (lease.Holder, error)
	Line(ctx context.Context, key string) ([]leasestore.InLine, error)
}

var _ Store = (*leasestore.Store)(nil)

// Resolver resolves a lease reference or an inline definition to the merged definition.
type Resolver interface {
	// Resolve returns the merged definition of a name reference; "none" or "" is a NOOP.
	Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error)
	// ResolveInline checks an inline definition and returns it.
	ResolveInline(tenant, project string, spec definition.InlineSpec) (definition.Definition, error)
}

var _ Resolver = (*definition.Resolver)(nil)

// TypeRegistry knows the lease types that have a revocation handler. A type without one is
// rejected: the reaper must be able to dispatch its holders later.
type TypeRegistry interface {
	Has(leaseType string) bool
}

// RevocationListener receives holders removed by a reap (here: the lazy idle sweep), to run
// their handlers (docs/design.md, "Reaping"). Implementations must not block the caller; the
// service calls it from its own goroutine regardless, so an acquisition never waits for it.
// The listener counts the holders in vance_lease_reap_total{reason} (the dispatcher does so
// for every reap path); without a listener the service counts its lazy reaps itself.
type RevocationListener interface {
	Revoked(ctx context.Context, reason string, holders []lease.Holder)
}

// StaticTypes is a TypeRegistry of a fixed set of types.
type StaticTypes map[string]bool

var _ TypeRegistry = StaticTypes(nil)

// NewStaticTypes returns a registry that knows exactly the given types.
func NewStaticTypes(types ...string) StaticTypes {
	st := make(StaticTypes, len(types))
	for _, t := range types {
		st[t] = true
	}
	return st
}

// Has reports whether the type is known.
func (st StaticTypes) Has(leaseType string) bool { return st[leaseType] }

// Defaults of the options.
const (
	// DefaultSafetyTimer is the mean pause between a waiting acquisition's own looks at the
	// store when no wake-up comes (jittered by ±1/4): it bounds what a lost wake-up costs, and
	// the reads of a waiter to about one per second.
	DefaultSafetyTimer = time.Second
	// DefaultSweepInterval is how often, at most, one resource is swept lazily.
	DefaultSweepInterval = time.Second
	// DefaultTokenCacheSize bounds the in-process token→resource map that labels the check
	// and release metrics.
	DefaultTokenCacheSize = 10000
	// DefaultMaxResourceLabels bounds the distinct resource label values; further resources
	// are labelled "other".
	DefaultMaxResourceLabels = 200
)

// Metric label values used besides resource names.
const (
	// LabelUnknown labels a check or release whose token this process did not hand out.
	LabelUnknown = "unknown"
	// LabelOther labels resources beyond the label bound.
	LabelOther = "other"
	// LabelInline labels every inline (project-private) resource: their names carry tenant IDs.
	LabelInline = "mcp-inline"
	// LabelNone labels a NOOP acquisition that referenced no lease.
	LabelNone = "none"
)

// Release outcomes.
const (
	ReleaseOK              = metrics.ReleaseOK
	ReleaseAlreadyReleased = metrics.ReleaseAlreadyReleased
	ReleaseError           = metrics.ReleaseError
)

type config struct {
	listener       RevocationListener
	clock          clock.WithTicker
	metrics        *metrics.Metrics
	safety         time.Duration
	queue          *waitq.Queue
	sweepInterval  time.Duration
	idleReaper     IdleReaper
	reclaimRelay   ReclaimRelay
	tokenCacheSize int
	maxLabels      int
	storeTimeout   time.Duration
	random         func() float64
}

// IdleReaper runs the lazy idle sweep of one resource. It returns the holders it reaped for
// this service to hand to its listener, and how many more it freed whose holders it had
// dispatched itself (the manager, for an agent's relay); either makes a busy acquisition
// retry at once.
type IdleReaper func(ctx context.Context, target SweepTarget) (sweep leasestore.IdleSweep, dispatched int, err error)

// SweepTarget is what a lazy idle sweep is for: the resource, and the lease reference of the
// acquisition that found it full. The agent's relay names the reference, not the resource:
// the manager resolves it again for the calling pod's own tenant, so that a pod can sweep, and
// learn about, only resources its own tenant's definitions lead to (docs/security.md, "The
// sweep relay").
type SweepTarget struct {
	// Resource is the counter key the acquisition found full.
	Resource string
	// Tenant, Project and Lease are the acquisition's scope and lease name; Inline says that
	// Lease is the name of an inline definition (whose resource is built from the scope).
	Tenant, Project, Lease string
	Inline                 bool
}

// sweepTarget is the lazy sweep's target for an acquisition that found resource full: for
// one of several leases, the lease whose resource it is.
func sweepTarget(req leasestore.AcquireRequest, resource string) SweepTarget {
	name := req.LeaseName
	for _, p := range req.Parts {
		if p.Resource == resource {
			name = p.LeaseName
		}
	}
	return SweepTarget{Resource: resource, Tenant: req.Tenant, Project: req.Project, Lease: name,
		Inline: strings.HasPrefix(resource, definition.InlineResourcePrefix)}
}

// resourcesOf names the resources of an acquisition for a message.
func resourcesOf(req leasestore.AcquireRequest) string {
	if len(req.Parts) == 0 {
		return req.Resource
	}
	return lease.JoinParts(req.Parts, func(p leasestore.Part) string { return p.Resource })
}

// WithIdleReaper replaces the lazy sweep's store.ReapIdle: the lease agent, which watches no
// pods, asks the manager to sweep, so that the reaped holders go through the manager's
// dispatch matrix (docs/design.md, "Revocation and the dispatch matrix").
func WithIdleReaper(r IdleReaper) Option { return func(c *config) { c.idleReaper = r } }

// ReclaimRelay asks another process (the manager, for a lease agent) to reclaim a borrowed
// slot for the waiter with public ID waiter and to dispatch the revoked holder through its own
// listener (ReclaimFor). revoked reports whether it revoked one; an error means it could not
// be asked, and the service reclaims itself.
type ReclaimRelay func(ctx context.Context, waiter string) (revoked bool, err error)

// WithReclaimRelay makes a waiter's reclaim run on the manager, as WithIdleReaper does the
// lazy sweep: the lease agent's dispatcher knows no pod but its own and could only release the
// revoked holder, without its type's handler or an Event (docs/borrowing.md).
func WithReclaimRelay(r ReclaimRelay) Option { return func(c *config) { c.reclaimRelay = r } }

// WithRevocationListener hands the holders a lazy sweep reaps to l (the dispatcher); without
// one a reap is only counted and logged.
func WithRevocationListener(l RevocationListener) Option { return func(c *config) { c.listener = l } }

// WithClock sets the clock of waiting and the sweep gate (tests use a fake); default real.
func WithClock(clk clock.WithTicker) Option { return func(c *config) { c.clock = clk } }

// WithMetrics sets where the service counts; default unregistered metrics.
func WithMetrics(m *metrics.Metrics) Option { return func(c *config) { c.metrics = m } }

// Option configures a Service.
type Option func(*config)

// WithSafetyTimer sets the mean pause of a waiting acquisition's safety timer (docs/waiting.md).
func WithSafetyTimer(d time.Duration) Option { return func(c *config) { c.safety = d } }

// WithWaitQueue makes the service wait in q: the queue that the store's freed hook
// (leasestore.WithFreedHook(q.Freed)) and the process's notifier wake. Without it the
// service has a queue of its own that nothing wakes: its waiters run on their safety timers.
func WithWaitQueue(q *waitq.Queue) Option { return func(c *config) { c.queue = q } }

// WithSweepInterval sets how often, at most, the service runs the lazy idle sweep of one
// resource (when an acquisition finds it full, and again while it waits).
func WithSweepInterval(d time.Duration) Option {
	return func(c *config) { c.sweepInterval = d }
}

// WithStoreTimeout tells the service the store's operation timeout (leasestore.WithOpTimeout;
// default leasestore.DefaultOpTimeout): a store call left unanswered for longer than that is
// an outage, where a call that is only late when a waiter's deadline comes is the store's load
// (docs/waiting.md, "Deadlines and outages").
func WithStoreTimeout(d time.Duration) Option { return func(c *config) { c.storeTimeout = d } }

// WithTokenCacheSize bounds the token→resource map used for metric labels.
func WithTokenCacheSize(n int) Option { return func(c *config) { c.tokenCacheSize = n } }

// WithMaxResourceLabels bounds the number of distinct resource label values.
func WithMaxResourceLabels(n int) Option { return func(c *config) { c.maxLabels = n } }

// Service is the admission library: acquire, check, payload update and release.
type Service struct {
	store    Store
	resolver Resolver
	types    TypeRegistry
	listener RevocationListener
	clk      clock.WithTicker
	metrics  *metrics.Metrics
	cfg      config
	queue    *waitq.Queue

	tokens *tokenLabels
	labels *labelSet
	sweeps *sweepGate
	// repairs gates the repair of one counter key (Store.Repair).
	repairs *sweepGate

	dispatching sync.WaitGroup
	// background runs the store calls a wait does not wait for (wait.go).
	background sync.WaitGroup
	// watch records the answers and failures of an acquisition's store calls: evidence of an
	// outage (outage.go).
	watch *storeWatch
}

// NewService builds the admission service over its required collaborators; the revocation
// listener, the clock and the metrics are options (WithRevocationListener, WithClock,
// WithMetrics).
func NewService(store Store, resolver Resolver, types TypeRegistry, opts ...Option) *Service {
	cfg := config{
		safety:         DefaultSafetyTimer,
		sweepInterval:  DefaultSweepInterval,
		tokenCacheSize: DefaultTokenCacheSize,
		maxLabels:      DefaultMaxResourceLabels,
		storeTimeout:   leasestore.DefaultOpTimeout,
		random:         rand.Float64,
	}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.safety <= 0 {
		cfg.safety = DefaultSafetyTimer
	}
	if cfg.queue == nil {
		cfg.queue = waitq.New()
	}
	clk, m, listener := cfg.clock, cfg.metrics, cfg.listener
	if clk == nil {
		clk = clock.RealClock{}
	}
	if m == nil {
		m = metrics.New(nil)
	}
	return &Service{
		store:    store,
		resolver: resolver,
		types:    types,
		listener: listener,
		clk:      clk,
		metrics:  m,
		cfg:      cfg,
		queue:    cfg.queue,
		tokens:   newTokenLabels(cfg.tokenCacheSize),
		labels:   newLabelSet(cfg.maxLabels),
		sweeps:   newSweepGate(),
		repairs:  newSweepGate(),
		watch:    newStoreWatch(),
	}
}

// Drain waits until the revocation listener calls started by lazy sweeps have returned, or
// ctx is done. Call it on shutdown.
func (s *Service) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		s.dispatching.Wait()
		s.background.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dispatch hands reaped holders to the listener on its own goroutine: the acquiring call
// never waits for handlers.
func (s *Service) dispatch(ctx context.Context, reason string, holders []lease.Holder) {
	log := logf.FromContext(ctx)
	if s.listener == nil {
		for _, h := range holders {
			log.Info("Reaped holder without a revocation listener", "reason", reason,
				"holder", h.ID, "type", h.Type, "resource", h.Resource, "pod", h.Pod.String())
		}
		return
	}
	dctx := context.WithoutCancel(ctx)
	s.dispatching.Go(func() { s.listener.Revoked(dctx, reason, holders) })
}

// sweepGate limits the lazy sweep to once per interval and resource, except when a holder
// the last sweep saw has gone idle since; it keeps when that happens (the last sweep's next
// expiry) for the waiters' safety timers. It remembers at most sweepGateSize resources, the
// least recently used dropped first, with constant work per call: an acquisition names its
// resource (an inline definition a new one each time), so a flood of names must cost a fixed
// amount of memory and time. A resource dropped early is swept again sooner, no more.
type sweepGate struct {
	mu   sync.Mutex // makes a look-up and its update one step
	last *lru.Cache // resource → time.Time of the last sweep let through
	next *lru.Cache // resource → time.Time when the next holder the last sweep saw goes idle
}

// sweepGateSize is how many resources a gate remembers.
const sweepGateSize = 10000

func newSweepGate() *sweepGate {
	return &sweepGate{last: lru.New(sweepGateSize), next: lru.New(sweepGateSize)}
}

func (g *sweepGate) allow(resource string, now time.Time, every time.Duration) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	t, ok := g.last.Get(resource)
	due, known := g.next.Get(resource)
	if ok && now.Sub(t.(time.Time)) < every && (!known || now.Before(due.(time.Time))) {
		return false
	}
	g.last.Add(resource, now)
	return true
}

// swept records when the next holder of resource goes idle after a sweep (in d; 0: none).
func (g *sweepGate) swept(resource string, now time.Time, d time.Duration) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if d <= 0 {
		g.next.Remove(resource)
		return
	}
	g.next.Add(resource, now.Add(d))
}

// nextExpiry is when the next holder of resource the last sweep saw goes idle.
func (g *sweepGate) nextExpiry(resource string) (time.Time, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	at, ok := g.next.Get(resource)
	if !ok {
		return time.Time{}, false
	}
	return at.(time.Time), true
}
