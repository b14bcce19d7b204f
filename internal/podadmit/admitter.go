package podadmit

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/builder"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	"sigs.k8s.io/controller-runtime/pkg/predicate"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// Acquirer takes and gives back leases (*leasing.Service).
type Acquirer interface {
	Acquire(ctx context.Context, req leasing.Request) (leasing.Lease, error)
	Release(ctx context.Context, token string) (string, error)
}

var _ Acquirer = (*leasing.Service)(nil)

// Definitions explains a lease reference (*definition.Resolver): a pod names a lease that
// must exist, where an HTTP caller's unknown name is a NOOP.
type Definitions interface {
	Explain(ctx context.Context, tenant, project, name string) (definition.Result, error)
}

var _ Definitions = (*definition.Resolver)(nil)

// Holders lists the leases held (*leasestore.Store): a pod whose lease was granted by a
// manager that stopped before it removed the gate is admitted with that lease, not given a
// second one.
type Holders interface {
	ListHolders(ctx context.Context, f leasestore.HolderFilter) ([]lease.Holder, error)
}

var _ Holders = (*leasestore.Store)(nil)

// Admitter acquires the lease of every gated pod on its behalf and removes its gate once the
// lease is granted. One acquisition runs per pod, from the pod's first reconcile until it
// is granted or the pod is gone; pods enter the line in the order they are reconciled
// (a reconcile returns once the pod's acquisition has its place).
type Admitter struct {
	client   client.Client
	acquirer Acquirer
	defs     Definitions
	holders  Holders
	tenants  tenancy.Map
	recorder events.EventRecorder
	clock    clock.Clock
	log      logr.Logger
	// retry is the pause before a definition or store error is tried again.
	retry time.Duration
	// placeWait bounds how long a reconcile waits for its pod's place in the line.
	placeWait time.Duration

	mu      sync.Mutex
	base    context.Context
	running map[types.NamespacedName]*podAcquisition
}

// podAcquisition is one pod's acquisition.
type podAcquisition struct {
	uid    types.UID
	cancel context.CancelFunc
}

// Option configures an Admitter.
type Option func(*Admitter)

// WithRetry sets the pause before a definition or store error is tried again (default 5 s).
func WithRetry(d time.Duration) Option { return func(a *Admitter) { a.retry = d } }

// WithClock sets the clock of the recorded grant times.
func WithClock(c clock.Clock) Option { return func(a *Admitter) { a.clock = c } }

// WithDefinitions makes a pod that names a lease no definition defines wait, with the
// reason, instead of being admitted as a NOOP.
func WithDefinitions(d Definitions) Option { return func(a *Admitter) { a.defs = d } }

// WithHolders makes the admitter adopt a lease already held for the pod (granted by a manager
// that stopped before it removed the gate) instead of acquiring another.
func WithHolders(h Holders) Option { return func(a *Admitter) { a.holders = h } }

// WithLogger sets the logger.
func WithLogger(l logr.Logger) Option { return func(a *Admitter) { a.log = l } }

// NewAdmitter returns an admitter that writes pods with c, acquires with acq, reads
// namespaces' tenants from tenants and records Events with recorder.
func NewAdmitter(c client.Client, acq Acquirer, tenants tenancy.Map, recorder events.EventRecorder, opts ...Option) *Admitter {
	a := &Admitter{client: c, acquirer: acq, tenants: tenants, recorder: recorder, clock: clock.RealClock{}, log: logr.Discard(),
		retry: 5 * time.Second, placeWait: 5 * time.Second, base: context.Background(), running: map[types.NamespacedName]*podAcquisition{}}
	for _, o := range opts {
		o(a)
	}
	return a
}

// +kubebuilder:rbac:groups="",resources=pods,verbs=get;list;watch;patch
// +kubebuilder:rbac:groups="",resources=pods/status,verbs=patch
// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch
// +kubebuilder:rbac:groups=events.k8s.io,resources=events,verbs=create;patch

// SetupWithManager runs the admitter on the manager's leader: it reconciles pods that ask
// for admission, and ends every acquisition when the manager stops.
func (a *Admitter) SetupWithManager(mgr ctrl.Manager) error {
	if err := mgr.Add(manager.RunnableFunc(func(ctx context.Context) error {
		a.mu.Lock()
		a.base = ctx
		a.mu.Unlock()
		<-ctx.Done()
		return nil
	})); err != nil {
		return err
	}
	return ctrl.NewControllerManagedBy(mgr).
		Named("podadmit").
		For(&corev1.Pod{}, builder.WithPredicates(predicate.NewPredicateFuncs(func(o client.Object) bool {
			p, ok := o.(*corev1.Pod)
			return ok && Wants(p)
		}))).
		Complete(a)
}

// Reconcile starts the acquisition of a gated pod, or ends the one of a pod that is gone,
// finished or no longer gated.
func (a *Admitter) Reconcile(ctx context.Context, req reconcile.Request) (reconcile.Result, error) {
	var pod corev1.Pod
	err := a.client.Get(ctx, req.NamespacedName, &pod)
	switch {
	case apierrors.IsNotFound(err):
		a.stop(req.NamespacedName, "")
		return reconcile.Result{}, nil
	case err != nil:
		return reconcile.Result{}, err
	}
	if !Wants(&pod) || !Gated(&pod) || pod.DeletionTimestamp != nil ||
		pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed {
		a.stop(req.NamespacedName, pod.UID)
		return reconcile.Result{}, nil
	}
	placed, started := a.start(&pod)
	if !started {
		return reconcile.Result{}, nil
	}
	// The next pod is reconciled after this one has its place: pods line up in the order
	// they came.
	select {
	case <-placed:
	case <-ctx.Done():
	case <-time.After(a.placeWait): // real time: a store that does not answer must not hold every pod
	}
	return reconcile.Result{}, nil
}

// start begins pod's acquisition unless one runs for it; placed is closed once it has its
// place in the line (or an answer).
func (a *Admitter) start(pod *corev1.Pod) (placed <-chan struct{}, started bool) {
	key := types.NamespacedName{Namespace: pod.Namespace, Name: pod.Name}
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.running[key]; ok {
		if cur.uid == pod.UID {
			return nil, false
		}
		cur.cancel() // an earlier pod of the same name
	}
	ctx, cancel := context.WithCancel(a.base)
	a.running[key] = &podAcquisition{uid: pod.UID, cancel: cancel}
	ch := make(chan struct{})
	var once sync.Once
	go a.admit(ctx, pod.DeepCopy(), func() { once.Do(func() { close(ch) }) })
	return ch, true
}

// stop ends the acquisition of the pod key (of uid, or whichever when uid is empty): its
// place in the line is given up; a lease it holds stays with the pod, whose end releases it.
func (a *Admitter) stop(key types.NamespacedName, uid types.UID) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if cur, ok := a.running[key]; ok && (uid == "" || cur.uid == uid) {
		cur.cancel()
		delete(a.running, key)
	}
}

// admit acquires pod's lease until it is granted, the wait the pod allows runs out, or ctx
// ends (the pod is gone). Definition and store errors are tried again after a pause, with
// the reason on the pod.
func (a *Admitter) admit(ctx context.Context, pod *corev1.Pod, placed func()) {
	defer placed()
	log := a.log.WithValues("pod", pod.Namespace+"/"+pod.Name)
	shown := ""
	for ctx.Err() == nil {
		names, l, reason, err := a.acquire(ctx, pod, placed)
		if err == nil {
			a.granted(context.WithoutCancel(ctx), pod, l, names, log)
			return
		}
		if ctx.Err() != nil {
			return
		}
		placed()
		if msg := err.Error(); msg != shown { // one Event per distinct reason
			shown = msg
			if reason == ReasonStoreUnavailable {
				// The driver's text (store hosts, topology) stays in the manager's log; the
				// pod's condition and Event, which its tenant reads, name the correlation id
				// (docs/security.md, "Errors without internal detail").
				id := lease.CorrelationID()
				log.Error(err, "The pod waits: the lease store is unavailable", "correlationId", id)
				a.waiting(ctx, pod, reason, "the lease store is unavailable (correlation id "+id+" in the manager's log)")
			} else {
				log.Info("The pod waits: its lease cannot be granted now", "reason", reason, "error", msg)
				a.waiting(ctx, pod, reason, msg)
			}
		}
		if reason == ReasonWaitExpired {
			return // the pod stays gated; deleting it ends its admission
		}
		select {
		case <-ctx.Done():
		case <-a.clock.After(a.retry):
		}
	}
}

// acquire is one acquisition for pod; reason classifies an error for the pod's condition.
// names are the leases of a pod of several (nil for a pod of one), acquired together.
func (a *Admitter) acquire(ctx context.Context, pod *corev1.Pod, placed func()) (names []string, l leasing.Lease, reason string, err error) {
	tenant, ok := a.tenants.TenantOf(pod.Namespace)
	if !ok {
		return nil, leasing.Lease{}, ReasonDefinitionError,
			fmt.Errorf("namespace %s has no label %s: it speaks for no tenant", pod.Namespace, tenancy.TenantLabel)
	}
	req, err := RequestOf(pod, tenant)
	if err != nil {
		return nil, leasing.Lease{}, ReasonDefinitionError, err
	}
	if l, ok, err := a.held(ctx, pod, req); err != nil {
		return nil, leasing.Lease{}, ReasonStoreUnavailable, err
	} else if ok {
		return req.Leases, l, "", nil
	}
	if err := a.defined(ctx, req); err != nil {
		return nil, leasing.Lease{}, ReasonDefinitionError, err
	}
	req.Queued = placed
	l, err = a.acquirer.Acquire(ctx, req)
	switch {
	case err == nil:
		return req.Leases, l, "", nil
	case errors.Is(err, lease.ErrBusy):
		return nil, l, ReasonWaitExpired, fmt.Errorf("the wait the pod allows (%s) ran out: %w", pod.Annotations[AnnotationMaxWait], err)
	case errors.Is(err, lease.ErrInvalid), isDefinitionError(err):
		return nil, l, ReasonDefinitionError, err
	default:
		return nil, l, ReasonStoreUnavailable, err
	}
}

// defined checks that a definition defines each lease req names for its tenant and project:
// for a pod an unknown name is an error, where an HTTP caller's is a NOOP. One unknown lease
// of several keeps the whole pod waiting.
func (a *Admitter) defined(ctx context.Context, req leasing.Request) error {
	if a.defs == nil || req.Lease == definition.NoneReference {
		return nil
	}
	names := req.Leases
	if names == nil {
		names = []string{req.Lease}
	}
	for _, name := range names {
		res, err := a.defs.Explain(ctx, req.Tenant, req.Project, name)
		if err != nil {
			return err
		}
		if len(res.Origin) == 0 && len(res.Ignored) == 0 {
			return fmt.Errorf("no LeaseDefinition defines lease %q for tenant %s, project %s", name, req.Tenant, req.Project)
		}
	}
	return nil
}

// held finds a lease granted for pod earlier (its holder bound to this incarnation of the
// pod, of the lease or leases req asks for).
func (a *Admitter) held(ctx context.Context, pod *corev1.Pod, req leasing.Request) (leasing.Lease, bool, error) {
	if a.holders == nil {
		return leasing.Lease{}, false, nil
	}
	hs, err := a.holders.ListHolders(ctx, leasestore.HolderFilter{Pod: pod.Namespace + "/" + pod.Name})
	if err != nil {
		return leasing.Lease{}, false, err
	}
	for _, h := range hs {
		if h.Pod.UID != string(pod.UID) || h.State != lease.StateHeld || !heldFor(h, req.Lease, req.Leases) {
			continue
		}
		if len(h.Parts) == 0 {
			return leasing.Lease{Token: h.Token, Name: h.LeaseName, Resource: h.Resource, TTL: h.TTL, Fence: h.Fence}, true, nil
		}
		l := leasing.Lease{Token: h.Token, Name: h.LeaseNames(), TTL: h.TTL}
		for _, p := range h.Parts {
			l.Parts = append(l.Parts, leasing.PartLease{Name: p.LeaseName, Resource: p.Resource, Fence: p.Fence})
		}
		return l, true, nil
	}
	return leasing.Lease{}, false, nil
}

// granted removes the gate and records the grant of the leases names (nil for a pod of one)
// on pod, in one write; a pod gone meanwhile gets its lease released. Only then is the
// admission reported (condition and Event).
func (a *Admitter) granted(ctx context.Context, pod *corev1.Pod, l leasing.Lease, names []string, log logr.Logger) {
	at := a.clock.Now()
	key := client.ObjectKeyFromObject(pod)
	for attempt := 0; ; attempt++ {
		var cur corev1.Pod
		err := a.client.Get(ctx, key, &cur)
		if apierrors.IsNotFound(err) || (err == nil && cur.UID != pod.UID) {
			a.giveBack(ctx, l, log, "the pod is gone")
			return
		}
		if err == nil {
			orig := cur.DeepCopy()
			cur.Spec.SchedulingGates = withoutGate(cur.Spec.SchedulingGates)
			if cur.Annotations == nil {
				cur.Annotations = map[string]string{}
			}
			for k, v := range admittedAnnotations(l, names, at) {
				cur.Annotations[k] = v
			}
			err = a.client.Patch(ctx, &cur, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{}))
			if err == nil {
				pod = &cur
				break
			}
			if apierrors.IsNotFound(err) {
				a.giveBack(ctx, l, log, "the pod is gone")
				return
			}
		}
		if attempt >= 10 || (!apierrors.IsConflict(err) && attempt >= 3) {
			// The lease stays with the pod: bound to it, it is released when the pod ends.
			log.Error(err, "Removing the admission gate failed; the lease is held for the pod", "holder", lease.HolderID(l.Token))
			return
		}
		time.Sleep(time.Duration(attempt+1) * 50 * time.Millisecond) // real time: a short back-off between conflicting writes
	}
	reason := ReasonGranted
	if l.NoOp {
		reason = ReasonNotRequired
	}
	note := grantedNote(l, names)
	a.condition(ctx, pod, corev1.ConditionTrue, reason, note)
	a.recorder.Eventf(pod, nil, corev1.EventTypeNormal, reason, "Admit", note)
	if names != nil {
		log.Info("Admitted a pod by leases", "leases", names, "holder", lease.HolderID(l.Token), "fences", fencesOf(l, names))
		return
	}
	log.Info("Admitted a pod by lease", "lease", l.Name, "holder", lease.HolderID(l.Token), "fence", l.Fence)
}

// giveBack releases a lease granted for a pod that is gone.
func (a *Admitter) giveBack(ctx context.Context, l leasing.Lease, log logr.Logger, why string) {
	if l.NoOp || l.Token == "" {
		return
	}
	if _, err := a.acquirer.Release(ctx, l.Token); err != nil {
		log.Error(err, "Releasing the lease of a pod that is gone failed; the pod reaper will", "holder", lease.HolderID(l.Token))
		return
	}
	log.Info("Released the lease granted for a pod", "reason", why, "holder", lease.HolderID(l.Token))
}

// waiting records why pod waits: the condition, and a Warning Event.
func (a *Admitter) waiting(ctx context.Context, pod *corev1.Pod, reason, msg string) {
	a.condition(ctx, pod, corev1.ConditionFalse, reason, msg)
	a.recorder.Eventf(pod, nil, corev1.EventTypeWarning, reason, "Admit", "The pod stays gated: %s", msg)
}

// condition sets ConditionAdmitted on pod's status (a strategic merge by condition type:
// other conditions, the kubelet's included, are left alone).
func (a *Admitter) condition(ctx context.Context, pod *corev1.Pod, status corev1.ConditionStatus, reason, msg string) {
	var cur corev1.Pod
	if err := a.client.Get(ctx, client.ObjectKeyFromObject(pod), &cur); err != nil || cur.UID != pod.UID {
		return
	}
	orig := cur.DeepCopy()
	c := corev1.PodCondition{Type: ConditionAdmitted, Status: status, Reason: reason, Message: msg,
		LastTransitionTime: metav1.NewTime(a.clock.Now())}
	replaced := false
	for i := range cur.Status.Conditions {
		if cur.Status.Conditions[i].Type == ConditionAdmitted {
			if cur.Status.Conditions[i].Status == status {
				c.LastTransitionTime = cur.Status.Conditions[i].LastTransitionTime
			}
			cur.Status.Conditions[i], replaced = c, true
		}
	}
	if !replaced {
		cur.Status.Conditions = append(cur.Status.Conditions, c)
	}
	if err := a.client.Status().Patch(ctx, &cur, client.StrategicMergeFrom(orig)); err != nil && !apierrors.IsNotFound(err) {
		a.log.Error(err, "Recording the admission condition failed", "pod", pod.Namespace+"/"+pod.Name)
	}
}
