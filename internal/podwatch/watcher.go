package podwatch

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	toolscache "k8s.io/client-go/tools/cache"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
)

// indexPodIP is the cache index of pods by every IP in status.podIPs (and status.podIP).
const indexPodIP = "lease.vancetope.io/podIP"

// options are what the Options of New set.
type options struct {
	// Self is the pod this process runs in (from the downward API); it is always alive.
	Self lease.PodRef
	// Namespaces restricts the watch to these namespaces; empty watches all of them.
	Namespaces []string
	// LabelSelector restricts the watch to matching pods; nil watches every pod. The
	// default is deliberately everything: a holder's pod is whatever pod called the
	// admission API (identified by IP on the manager), with or without the agent sidecar,
	// and a holder pod outside the selector would look dead and be reaped. Set it (e.g.
	// lease.vancetope.io/agent=true) only when every lease holder carries the label.
	LabelSelector labels.Selector
	// Clock is used for the deletion deadline of terminating pods (default: real clock).
	Clock clock.PassiveClock
	// Logger (default: discard).
	Logger logr.Logger
	// UnknownIPTTL and UnknownIPs bound the memory of addresses without a pod;
	// LookupRate and LookupBurst the API server lookups of Identify (lookup.go).
	UnknownIPTTL time.Duration
	UnknownIPs   int
	LookupRate   float64
	LookupBurst  int
	// Registerer registers the lookup counter (nil: not registered).
	Registerer prometheus.Registerer
}

// defaultOptions are the options before any Option is applied.
func defaultOptions() options {
	return options{UnknownIPTTL: DefaultUnknownIPTTL, UnknownIPs: DefaultUnknownIPs,
		LookupRate: DefaultLookupRate, LookupBurst: DefaultLookupBurst}
}

// Option configures a Watcher.
type Option func(*options)

// WithSelf names the pod this process runs in (from the downward API); it is always alive.
func WithSelf(pod lease.PodRef) Option { return func(o *options) { o.Self = pod } }

// WithNamespaces restricts the watch to these namespaces; none watches all of them.
func WithNamespaces(ns ...string) Option { return func(o *options) { o.Namespaces = ns } }

// WithLabelSelector restricts the watch to matching pods (see options.LabelSelector for why
// the default is every pod).
func WithLabelSelector(sel labels.Selector) Option { return func(o *options) { o.LabelSelector = sel } }

// WithClock sets the clock of terminating pods' deletion deadlines (default: real clock).
func WithClock(clk clock.PassiveClock) Option { return func(o *options) { o.Clock = clk } }

// WithLogger sets the logger (default: discard).
func WithLogger(log logr.Logger) Option { return func(o *options) { o.Logger = log } }

// WithUnknownIPCache sets how long Identify answers "no pod" for an address the API server
// had no pod for without asking again, and how many such addresses it keeps (default
// DefaultUnknownIPTTL, DefaultUnknownIPs). A ttl of 0 keeps none.
func WithUnknownIPCache(ttl time.Duration, size int) Option {
	return func(o *options) { o.UnknownIPTTL, o.UnknownIPs = ttl, size }
}

// WithLookupLimit sets the rate (per second) and burst of Identify's API server lookups
// (default DefaultLookupRate, DefaultLookupBurst); a caller over it is refused as unavailable.
// A rate of 0 or less is no limit (the cost before the bound, for benchmarks).
func WithLookupLimit(perSecond float64, burst int) Option {
	return func(o *options) { o.LookupRate, o.LookupBurst = perSecond, burst }
}

// WithRegisterer registers the counter of Identify's lookups,
// vance_lease_pod_identity_lookups_total (docs/observability.md).
func WithRegisterer(reg prometheus.Registerer) Option { return func(o *options) { o.Registerer = reg } }

// Watcher is the pod informer: a controller-runtime cache of stripped pods (StripPod) with
// an index by pod IP, plus an uncached reader to confirm a death before anything is reaped.
// It is a manager Runnable that needs no leader election (every replica keeps its own).
type Watcher struct {
	cache    cache.Cache
	informer cache.Informer
	api      client.Reader
	self     lease.PodRef
	ns       []string // watched namespaces; empty: all
	clock    clock.PassiveClock
	log      logr.Logger
	lookups  *lookups

	mu   sync.Mutex
	gone []func(lease.PodRef)
}

var (
	_ manager.Runnable               = (*Watcher)(nil)
	_ manager.LeaderElectionRunnable = (*Watcher)(nil)
)

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch

// New builds a Watcher for the cluster of cfg. It does not contact the API server until
// Start. RBAC: get, list, watch on pods (in the watched namespaces).
func New(cfg *rest.Config, opt ...Option) (*Watcher, error) {
	opts := defaultOptions()
	for _, o := range opt {
		o(&opts)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, fmt.Errorf("building scheme: %w", err)
	}
	byObject := cache.ByObject{Label: opts.LabelSelector, Transform: StripPod}
	copts := cache.Options{Scheme: scheme, ByObject: map[client.Object]cache.ByObject{&corev1.Pod{}: byObject}}
	if len(opts.Namespaces) > 0 {
		copts.DefaultNamespaces = map[string]cache.Config{}
		for _, ns := range opts.Namespaces {
			copts.DefaultNamespaces[ns] = cache.Config{}
		}
	}
	c, err := cache.New(cfg, copts)
	if err != nil {
		return nil, fmt.Errorf("creating pod cache: %w", err)
	}
	api, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, fmt.Errorf("creating pod reader: %w", err)
	}
	return newWatcher(context.Background(), c, api, opts)
}

func newWatcher(ctx context.Context, c cache.Cache, api client.Reader, opts options) (*Watcher, error) {
	w := &Watcher{cache: c, api: api, self: opts.Self, ns: opts.Namespaces, clock: opts.Clock, log: opts.Logger}
	if w.clock == nil {
		w.clock = clock.RealClock{}
	}
	if w.log.GetSink() == nil {
		w.log = logr.Discard()
	}
	counter := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "vance_lease_pod_identity_lookups_total",
		Help: "Callers of the admission API whose address the pod cache did not know, by how they were answered (found, none, cached-none, limited, error).",
	}, []string{"result"})
	if opts.Registerer != nil {
		if err := opts.Registerer.Register(counter); err != nil {
			return nil, fmt.Errorf("registering the lookup counter: %w", err)
		}
	}
	refusals := &refusalLog{clock: w.clock, log: w.log, every: time.Second, perSecond: opts.LookupRate, burst: opts.LookupBurst}
	w.lookups = newLookups(w.clock, newUnknownIPs(opts.UnknownIPTTL, opts.UnknownIPs), opts.LookupRate, opts.LookupBurst,
		w.listByIP, func(result string) {
			counter.WithLabelValues(result).Inc()
			if result == LookupLimited {
				refusals.refused()
			}
		})
	if err := c.IndexField(ctx, &corev1.Pod{}, indexPodIP, podIPs); err != nil {
		return nil, fmt.Errorf("indexing pods by IP: %w", err)
	}
	inf, err := c.GetInformer(ctx, &corev1.Pod{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting pod informer: %w", err)
	}
	if _, err := inf.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		UpdateFunc: w.onUpdate,
		DeleteFunc: w.onDelete,
	}); err != nil {
		return nil, fmt.Errorf("watching pods: %w", err)
	}
	w.informer = inf
	return w, nil
}

// Start runs the informer until ctx is done.
func (w *Watcher) Start(ctx context.Context) error {
	return w.cache.Start(ctx)
}

// NeedLeaderElection is false: every replica needs its own view of the pods.
func (w *Watcher) NeedLeaderElection() bool { return false }

// WaitForSync blocks until the informer has listed all pods once (true), or ctx is done
// (false). Nobody may conclude "dead" before that: an empty cache says every pod is gone.
func (w *Watcher) WaitForSync(ctx context.Context) bool {
	return w.cache.WaitForCacheSync(ctx)
}

// ReadyCheck is a healthz.Checker that fails until the pod informer has synced.
func (w *Watcher) ReadyCheck(_ *http.Request) error {
	if !w.informer.HasSynced() {
		return errors.New("pod informer not synced")
	}
	return nil
}

// Self returns the pod of this process.
func (w *Watcher) Self() lease.PodRef { return w.self }

// OnPodGone registers fn to be called, on the informer's goroutine, with every pod that is
// deleted or reaches a terminal phase (Succeeded/Failed). fn must not block. Register
// before Start.
func (w *Watcher) OnPodGone(fn func(lease.PodRef)) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gone = append(w.gone, fn)
}

// Alive applies the liveness predicate to pod with the cached object.
func (w *Watcher) Alive(pod lease.PodRef) bool {
	_, alive := w.Status(pod)
	return alive
}

// Status is Alive with the reason (see the Reason constants), for logs and views.
func (w *Watcher) Status(pod lease.PodRef) (reason string, alive bool) {
	if pod.Name == "" || liveness.IsSelf(pod, w.self) {
		return Liveness(pod, w.self, nil, w.clock.Now())
	}
	obj, err := w.cached(pod)
	if err != nil {
		w.log.V(1).Info("Cannot read pod from cache", "pod", pod.String(), "error", err.Error())
		return liveness.ReasonUnknown, false
	}
	return Liveness(pod, w.self, obj, w.clock.Now())
}

// Confirm is the liveness decision before anything destructive (a pod reap, the dead path
// of a dispatch): alive when the cache says so; a pod the cache calls dead, or cannot read,
// is read from the API server, which has the last word. So a pod created a moment ago, or
// outside the watched namespaces or selector, is not treated as dead. A read error is
// returned and means "do not decide dead".
func (w *Watcher) Confirm(ctx context.Context, pod lease.PodRef) (liveness.Verdict, error) {
	now := w.clock.Now()
	if pod.Name == "" || liveness.IsSelf(pod, w.self) {
		reason, alive := Liveness(pod, w.self, nil, now)
		return liveness.Verdict{Alive: alive, Reason: reason}, nil
	}
	if obj, err := w.cached(pod); err == nil {
		if reason, alive := Liveness(pod, w.self, obj, now); alive {
			return liveness.Verdict{Alive: true, Reason: reason, IP: PodIP(obj)}, nil
		}
	}
	obj := &corev1.Pod{}
	err := w.api.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: pod.Name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		obj = nil
	case err != nil:
		return liveness.Verdict{Reason: liveness.ReasonUnknown}, fmt.Errorf("reading pod %s: %w", pod, err)
	}
	reason, alive := Liveness(pod, w.self, obj, now)
	v := liveness.Verdict{Alive: alive, Reason: reason}
	if alive {
		v.IP = PodIP(obj)
	}
	return v, nil
}

// ConfirmDead is Confirm for callers that only ask "dead?": dead only when the API server
// agrees with the cache.
func (w *Watcher) ConfirmDead(ctx context.Context, pod lease.PodRef) (dead bool, reason string, err error) {
	v, err := w.Confirm(ctx, pod)
	if err != nil {
		return false, v.Reason, err
	}
	return !v.Alive, v.Reason, nil
}

// Endpoint returns the IP of pod when the pod is alive (the address its agent listens on).
func (w *Watcher) Endpoint(pod lease.PodRef) (ip string, ok bool) {
	if pod.Name == "" {
		return "", false
	}
	obj, err := w.cached(pod)
	if err != nil || obj == nil {
		return "", false
	}
	if _, alive := Liveness(pod, lease.PodRef{}, obj, w.clock.Now()); !alive {
		return "", false
	}
	// A pod not started yet is alive, but has no endpoint.
	ip = PodIP(obj)
	return ip, ip != ""
}

// PodByIP identifies the pod that has ip (the source address of a caller of the manager's
// HTTP API). Only running pods count (finished pods keep their IP in the object while the
// address is reused), and host-network pods never match (they share the node's IP). ok is
// false when no pod or more than one pod matches.
func (w *Watcher) PodByIP(ip string) (lease.PodRef, bool) {
	key, ok := normalizeIP(ip)
	if !ok {
		return lease.PodRef{}, false
	}
	var list corev1.PodList
	if err := w.cache.List(context.Background(), &list, client.MatchingFields{indexPodIP: key}); err != nil {
		w.log.V(1).Info("Cannot list pods by IP", "ip", key, "error", err.Error())
		return lease.PodRef{}, false
	}
	var found []lease.PodRef
	now := w.clock.Now()
	for i := range list.Items {
		p := &list.Items[i]
		if p.Spec.HostNetwork {
			continue
		}
		if _, alive := Liveness(RefOf(p), lease.PodRef{}, p, now); alive {
			found = append(found, RefOf(p))
		}
	}
	if len(found) != 1 {
		return lease.PodRef{}, false
	}
	return found[0], true
}

// Identify returns the pod that has ip, the source address of a caller of the manager's
// API. When the cache does not know exactly one live pod with ip (the informer lags behind
// a pod that just started, or two pods seem to share the address), the API server decides.
// No pod with ip there either: the zero PodRef (the caller is no pod, e.g. a developer's
// curl). Still more than one, or the API server cannot be read: an error satisfying
// lease.ErrUnavailable, because a holder stored without its pod would never be pod-reaped
// (docs/operations.md, "Pod identity"). The API server is asked within a bound (lookup.go):
// an address it had no pod for is no pod for a short time without asking again, and over
// the rate limit a caller is refused as unavailable.
func (w *Watcher) Identify(ctx context.Context, ip string) (lease.PodRef, error) {
	if ref, ok := w.PodByIP(ip); ok {
		return ref, nil
	}
	key, ok := normalizeIP(ip)
	if !ok {
		return lease.PodRef{}, nil
	}
	return w.lookups.identify(ctx, key)
}

// listByIP asks the API server which running pod has ip (normalized), in the watched
// namespaces: the zero PodRef for none.
func (w *Watcher) listByIP(ctx context.Context, key string) (lease.PodRef, error) {
	namespaces := w.ns
	if len(namespaces) == 0 {
		namespaces = []string{""} // all
	}
	var found []lease.PodRef
	now := w.clock.Now()
	for _, ns := range namespaces {
		var list corev1.PodList
		if err := w.api.List(ctx, &list, client.InNamespace(ns), client.MatchingFields{"status.podIP": key}); err != nil {
			return lease.PodRef{}, lease.Unavailable("identifying the pod of "+key, err)
		}
		for i := range list.Items {
			p := &list.Items[i]
			if p.Spec.HostNetwork {
				continue
			}
			if _, alive := Liveness(RefOf(p), lease.PodRef{}, p, now); alive {
				found = append(found, RefOf(p))
			}
		}
	}
	switch len(found) {
	case 0:
		return lease.PodRef{}, nil
	case 1:
		return found[0], nil
	default:
		return lease.PodRef{}, lease.Unavailable("identifying the pod of "+key,
			fmt.Errorf("%d running pods have this IP (%s, %s, ...)", len(found), found[0], found[1]))
	}
}

// cached reads pod from the cache; a missing pod is (nil, nil).
func (w *Watcher) cached(pod lease.PodRef) (*corev1.Pod, error) {
	obj := &corev1.Pod{}
	err := w.cache.Get(context.Background(), client.ObjectKey{Namespace: pod.Namespace, Name: pod.Name}, obj)
	switch {
	case apierrors.IsNotFound(err):
		return nil, nil
	case err != nil:
		return nil, fmt.Errorf("reading pod %s from cache: %w", pod, err)
	}
	return obj, nil
}

func (w *Watcher) onUpdate(oldObj, newObj any) {
	oldPod, ok1 := oldObj.(*corev1.Pod)
	newPod, ok2 := newObj.(*corev1.Pod)
	if !ok1 || !ok2 {
		return
	}
	if !Finished(oldPod) && Finished(newPod) {
		w.emit(RefOf(newPod))
	}
}

func (w *Watcher) onDelete(obj any) {
	if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tomb.Obj
	}
	if pod, ok := obj.(*corev1.Pod); ok {
		w.emit(RefOf(pod))
	}
}

func (w *Watcher) emit(ref lease.PodRef) {
	w.mu.Lock()
	fns := append([]func(lease.PodRef){}, w.gone...)
	w.mu.Unlock()
	w.log.V(1).Info("Pod gone", "pod", ref.String(), "uid", ref.UID)
	for _, fn := range fns {
		fn(ref)
	}
}

// podIPs is the index function of indexPodIP.
func podIPs(o client.Object) []string {
	pod, ok := o.(*corev1.Pod)
	if !ok {
		return nil
	}
	seen := map[string]bool{}
	var out []string
	add := func(ip string) {
		if key, ok := normalizeIP(ip); ok && !seen[key] {
			seen[key] = true
			out = append(out, key)
		}
	}
	add(pod.Status.PodIP)
	for _, ip := range pod.Status.PodIPs {
		add(ip.IP)
	}
	return out
}

// normalizeIP returns the canonical text of ip (IPv4-mapped IPv6 unmapped, zone dropped).
func normalizeIP(ip string) (string, bool) {
	addr, err := netip.ParseAddr(ip)
	if err != nil {
		return "", false
	}
	return addr.Unmap().WithZone("").String(), true
}
