package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Labels set on LeaseHolder objects, so that label selectors pick holders by resource, type,
// project, user and pod. A value that is not a valid label value (for example a user ID
// with '@') is left out; such holders are found with a field selector on spec instead.
const (
	LabelResource     = GroupName + "/resource"
	LabelType         = GroupName + "/type"
	LabelProject      = GroupName + "/project"
	LabelUser         = GroupName + "/user"
	LabelPodName      = GroupName + "/pod-name"
	LabelPodNamespace = GroupName + "/pod-namespace"
	LabelLevel        = GroupName + "/level"
)

// FieldCounterTenant is the field selector that picks the counters of one tenant (the
// global level belongs to none); the server narrows its store read by it.
const FieldCounterTenant = "tenant"

// LeaseHolder is one live lease: a slot booked on a resource at every capped level. Its
// name is the holder's public ID ("lh-" and 24 hex digits), derived from the token but no
// way back to it: the token, which releases the lease, is never shown. Deleting it revokes
// the lease.
// +kubebuilder:object:root=true
type LeaseHolder struct {
	metav1.TypeMeta `json:",inline"`
	// metadata: name is the public holder ID, creationTimestamp the acquisition time.
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is what the holder asked for.
	Spec LeaseHolderSpec `json:"spec"`
	// status is the holder's state as the store and the pod watcher see it.
	Status LeaseHolderStatus `json:"status"`
}

// LeaseHolderSpec is the request a holder was admitted with.
type LeaseHolderSpec struct {
	// lease is the name of the LeaseDefinition the lease was resolved from; for a holder of
	// several resources, its parts' names joined by "+" (parts has each).
	Lease string `json:"lease"`
	// resource is the counter key the lease books; for a holder of several resources, its
	// parts' resources joined by "+". A selector on resource matches such a holder by any of
	// them.
	Resource string `json:"resource"`
	// parts are the resources of a holder that books several at once, all or none, in the
	// order of their resources (docs/waiting.md, "Several resources at once"); absent for a
	// holder of one.
	// +optional
	// +listType=map
	// +listMapKey=resource
	Parts []LeasePart `json:"parts,omitempty"`
	// type is the lease type (selects the revocation handler).
	Type string `json:"type"`
	// tenant is the logical tenant ID.
	Tenant string `json:"tenant"`
	// project is the logical project ID.
	Project string `json:"project"`
	// user is the logical user ID.
	// +optional
	User string `json:"user,omitempty"`
	// holderRef is the caller's own reference.
	// +optional
	HolderRef string `json:"holderRef,omitempty"`
	// pod is namespace/name of the holding pod; empty when no pod holds it.
	// +optional
	Pod string `json:"pod,omitempty"`
	// podUID is the UID of the holding pod.
	// +optional
	PodUID string `json:"podUID,omitempty"`
	// podBound says whether the lease dies with its pod.
	PodBound bool `json:"podBound"`
	// ttlSeconds is the idle time after which the holder is reaped.
	TTLSeconds int64 `json:"ttlSeconds"`
	// payload are the holder's key/value annotations.
	// +optional
	Payload map[string]string `json:"payload,omitempty"`
}

// LeasePart is one resource of a holder that books several.
type LeasePart struct {
	// lease is the name of the LeaseDefinition the part was resolved from.
	Lease string `json:"lease"`
	// resource is the counter key the part books.
	Resource string `json:"resource"`
}

// LeaseHolderStatus is the live state of a holder.
type LeaseHolderStatus struct {
	// state is PENDING while the levels are booked, HELD afterwards.
	State string `json:"state"`
	// levels are the counter keys booked by the holder.
	// +optional
	// +listType=atomic
	Levels []string `json:"levels,omitempty"`
	// acquiredAt is the store's time of acquisition.
	// +optional
	AcquiredAt metav1.Time `json:"acquiredAt,omitzero"`
	// lastSeenAt is the store's time of the last check.
	// +optional
	LastSeenAt metav1.Time `json:"lastSeenAt,omitzero"`
	// fence is the grant's fencing token: it strictly increases with every grant of the
	// resource; 0 before the grant. For a holder of several resources, the first part's
	// (parts has each).
	// +optional
	Fence int64 `json:"fence,omitempty"`
	// parts are the fences of a holder of several resources, one per part of spec.parts, in
	// its order; absent for a holder of one.
	// +optional
	// +listType=map
	// +listMapKey=resource
	Parts []LeasePartStatus `json:"parts,omitempty"`
	// borrowed is true when the holder's tenant slot was granted above its tenant cap, from
	// capacity other tenants left idle; it is reclaimed first (docs/borrowing.md).
	// +optional
	Borrowed bool `json:"borrowed,omitempty"`
	// podAlive is "True" or "False" as the manager's pod watcher sees the pod, "Unknown"
	// when this server has no pod view, empty for a holder without a pod.
	// +optional
	PodAlive string `json:"podAlive,omitempty"`
	// podReason says why a pod counts as dead.
	// +optional
	PodReason string `json:"podReason,omitempty"`
}

// LeasePartStatus is the live state of one part of a holder of several resources.
type LeasePartStatus struct {
	// resource is the part's resource (spec.parts).
	Resource string `json:"resource"`
	// fence is the part's fencing token: it strictly increases with every grant of its
	// resource; 0 before the grant.
	// +optional
	Fence int64 `json:"fence,omitempty"`
}

// LeaseHolderList is a page of holders.
// +kubebuilder:object:root=true
type LeaseHolderList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LeaseHolder `json:"items"`
}

// LeaseCounter is one counter of the store: the number of holders of a resource at one
// level and scope.
// +kubebuilder:object:root=true
type LeaseCounter struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// resource is the counted resource.
	Resource string `json:"resource"`
	// level is user, project, tenant or global.
	Level string `json:"level"`
	// scope is tenant/user, tenant/project, tenant or *.
	Scope string `json:"scope"`
	// tenant is the tenant whose level the counter counts; empty for the global level,
	// which belongs to no tenant. A field selector on it narrows the store's read.
	// +optional
	Tenant string `json:"tenant,omitempty"`
	// key is the counter's key in the store.
	Key string `json:"key"`
	// count is the number of the counter's entries: one per booked slot, each naming the
	// holder that books it.
	Count int64 `json:"count"`
	// booked is the number of the entries whose holder exists; count and booked differ only
	// while an entry names a holder that is gone (a booking that arrived after its holder's
	// release), until the repair removes it.
	Booked int64 `json:"booked"`
	// drift is true when count and booked differ.
	Drift bool `json:"drift"`
	// holders are the public IDs of the holders the entries name, sorted: exactly who books
	// the level.
	// +optional
	// +listType=atomic
	Holders []string `json:"holders,omitempty"`
	// gone are those of holders whose holder no longer exists: entries the repair removes.
	// +optional
	// +listType=atomic
	Gone []string `json:"gone,omitempty"`
	// waiting is the number of acquisitions waiting in the counter's line for one of its
	// slots. While anyone waits the count stays at the cap: a freed slot goes to the oldest
	// waiter, and newcomers queue behind.
	// +optional
	Waiting int64 `json:"waiting,omitempty"`
	// borrowed is the number of the booking holders whose slot of this counter was granted
	// above its cap, from capacity other tenants left idle; only a tenant counter has them,
	// and they are reclaimed first (docs/borrowing.md).
	// +optional
	Borrowed int64 `json:"borrowed,omitempty"`
	// cap is the level's cap in the current definitions of the holders that book the
	// counter; absent when it is not known (see capReason). It reflects the definitions as
	// they are now, not the cap a holder was admitted against.
	// +optional
	Cap int64 `json:"cap,omitempty"`
	// capReason says why cap is absent: NotBooked, Unresolved, Ambiguous or Uncapped.
	// +optional
	CapReason string `json:"capReason,omitempty"`
	// capNote explains capReason for people (which definitions disagree, which one could
	// not be resolved).
	// +optional
	CapNote string `json:"capNote,omitempty"`
	// updatedAt is the store's time of the last change.
	// +optional
	UpdatedAt metav1.Time `json:"updatedAt,omitzero"`
}

// Reasons of LeaseCounter.capReason: why a counter publishes no cap (docs/live-api.md,
// "Caps").
const (
	// CapReasonNotBooked: no holder books the counter (count 0, or drift), so no definition
	// says what its cap is.
	CapReasonNotBooked = "NotBooked"
	// CapReasonUnresolved: the definition of a holder that books the counter could not be
	// resolved now (unavailable, deleted, or it now names another resource).
	CapReasonUnresolved = "Unresolved"
	// CapReasonAmbiguous: the holders that book the counter were admitted under definitions
	// that now give the level different caps (several lease names share the resource).
	CapReasonAmbiguous = "Ambiguous"
	// CapReasonUncapped: the current definitions do not cap the level any more.
	CapReasonUncapped = "Uncapped"
)

// LeaseCounterList is a list of counters.
// +kubebuilder:object:root=true
type LeaseCounterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LeaseCounter `json:"items"`
}

// PodRevocation asks the manager to revoke every holder of a pod (create only, in the
// system namespace; nothing is kept). The answer carries what was revoked.
// +kubebuilder:object:root=true
type PodRevocation struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// podNamespace is the namespace of the pod whose holders are revoked.
	PodNamespace string `json:"podNamespace"`
	// podName is the name of the pod.
	PodName string `json:"podName"`
	// revoked are the public IDs of the holders revoked (filled in by the server).
	// +optional
	// +listType=atomic
	Revoked []string `json:"revoked,omitempty"`
	// holders are the revoked holders as they were (filled in by the server).
	// +optional
	// +listType=atomic
	Holders []LeaseHolder `json:"holders,omitempty"`
}

// Sweep asks the manager for one reaper round now (create only, in the system namespace).
// +kubebuilder:object:root=true
type Sweep struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// result is the round's counts (filled in by the server).
	// +optional
	Result SweepResult `json:"result"`
}

// SweepResult counts what a sweep did.
type SweepResult struct {
	// idle counts holders reaped idle.
	Idle int64 `json:"idle"`
	// pod counts holders of dead pods reaped.
	Pod int64 `json:"pod"`
	// reconcile is the round's reconcile.
	Reconcile ReconcileResult `json:"reconcile"`
}

// Reconcile asks the manager to correct counter drift now (create only, in the system
// namespace).
// +kubebuilder:object:root=true
type Reconcile struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// result is what the reconcile did (filled in by the server).
	// +optional
	Result ReconcileResult `json:"result"`
}

// ReconcileResult counts what a reconcile did.
type ReconcileResult struct {
	Corrected int64 `json:"corrected"`
	Deleted   int64 `json:"deleted"`
	Skipped   int64 `json:"skipped"`
	// repaired: entries removed because the holder they name was gone (docs/design.md,
	// "Bookings"); corrected counts the counters they were removed from.
	Repaired int64 `json:"repaired,omitempty"`
	// unmarked: holders whose borrowed mark was dropped, their tenant being back within its
	// cap (docs/borrowing.md, "The mark").
	Unmarked int64 `json:"unmarked,omitempty"`
}

// LeaseWaiter is an acquisition waiting in the line of a full level for one of its slots. Its
// name is the waiting holder's public ID; it becomes a LeaseHolder of the same name when a
// slot is handed to it, and disappears when its wait ends without one.
// +kubebuilder:object:root=true
type LeaseWaiter struct {
	metav1.TypeMeta `json:",inline"`
	// metadata: name is the public holder ID, creationTimestamp when it lined up.
	metav1.ObjectMeta `json:"metadata,omitempty"`
	// spec is what the acquisition asked for.
	Spec LeaseHolderSpec `json:"spec"`
	// status is where it waits.
	Status LeaseWaiterStatus `json:"status"`
}

// LeaseWaiterStatus is a waiter's place.
type LeaseWaiterStatus struct {
	// resource is the resource of the level it waits at: for an acquisition of several
	// resources (spec.parts), that of the part it waits on; the parts before it are booked,
	// those after it not yet.
	// +optional
	Resource string `json:"resource,omitempty"`
	// lease is the lease name it waits under there: for an acquisition of several
	// resources, the name of the part it waits on.
	// +optional
	Lease string `json:"lease,omitempty"`
	// level is the full level it waits at: user, project, tenant or global.
	Level string `json:"level"`
	// scope is that level's scope (tenant/user, tenant/project, tenant or *).
	Scope string `json:"scope"`
	// key is the counter key of that level in the store.
	Key string `json:"key"`
	// cap is the level's cap when the acquisition lined up.
	// +optional
	Cap int64 `json:"cap,omitempty"`
	// since is when it lined up: its place in the line, kept from level to level.
	// +optional
	Since metav1.Time `json:"since,omitzero"`
	// priority is its priority: waiters of a higher priority are served first, oldest first
	// within a priority; raised to the highest once it waited longer than its definition's
	// age bound (docs/waiting.md, "Priority").
	// +optional
	Priority int64 `json:"priority,omitempty"`
	// position is the number of live waiters ahead of it in the line, of every tenant: those
	// of a higher priority, then the older ones of its own.
	Position int64 `json:"position"`
	// estimatedWaitMs estimates the wait from its position, from the resource's recent hold
	// times; absent before the resource has handed over a slot. An estimate, never a
	// promise.
	// +optional
	EstimatedWaitMs int64 `json:"estimatedWaitMs,omitempty"`
	// lapsed is true when its process stopped renewing its place: slots pass it over until
	// it renews, and its idle time reaps it.
	// +optional
	Lapsed bool `json:"lapsed,omitempty"`
}

// LeaseWaiterList is a list of waiters.
// +kubebuilder:object:root=true
type LeaseWaiterList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []LeaseWaiter `json:"items"`
}
