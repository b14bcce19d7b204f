package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Scope names of the layers (docs/design.md, "Four layers, merged per field"). A
// LeaseDefinition with tenant SystemTenant and project TenantProject is the system layer, one
// with a tenant ID and project TenantProject is the tenant layer, and one with a tenant and a
// project ID is the project layer.
const (
	// SystemTenant is the tenant of the system layer.
	SystemTenant = "_vance"
	// TenantProject is the project of the system and the tenant layer.
	TenantProject = "_tenant"
)

// Condition types of a LeaseDefinition.
const (
	// ConditionReady is True when the object is valid, is the only one for its
	// (leaseName, tenant, project), and the merged definition at its scope resolves.
	ConditionReady = "Ready"
	// ConditionFieldsIgnored is True when the object sets fields its layer does not own; the
	// fields are listed in status.ignoredFields and take no effect.
	ConditionFieldsIgnored = "FieldsIgnored"
)

// Reasons of the Ready condition.
const (
	// ReasonResolved: the merged definition at this object's scope resolves (Ready=True).
	ReasonResolved = "Resolved"
	// ReasonInvalid: the object itself fails validation; its scopes are unavailable.
	ReasonInvalid = "Invalid"
	// ReasonConflict: another object has the same (leaseName, tenant, project); the scopes
	// that would use either of them are unavailable until one is removed.
	ReasonConflict = "Conflict"
	// ReasonLayerUnavailable: a layer this object's scope depends on (the built-in default or
	// a wider LeaseDefinition) is broken, so the scope is unavailable.
	ReasonLayerUnavailable = "LayerUnavailable"
	// ReasonNamespaceNotPermitted: the object's namespace does not own its layer (the system
	// layer outside the system namespace, or a tenant's layer outside that tenant's
	// namespaces); the object takes part in no merge and no conflict (docs/tenancy.md).
	ReasonNamespaceNotPermitted = "NamespaceNotPermitted"
	// ReasonCapNotPermitted: the object, a tenant layer, would book a resource against a cap
	// above the one the system layer sets for that resource, or move a lease the system layer
	// caps to another resource (docs/tenancy.md, "Caps belong to the resource"); the scopes
	// that use it are unavailable.
	ReasonCapNotPermitted = "CapNotPermitted"
)

// Reasons of the FieldsIgnored condition.
const (
	// ReasonFieldsNotOwned: some fields are set on a layer that does not own them.
	ReasonFieldsNotOwned = "FieldsNotOwned"
	// ReasonAllFieldsOwned: every field set is owned by this object's layer.
	ReasonAllFieldsOwned = "AllFieldsOwned"
)

// Fairness was the choice between two orders of waiters across processes. Deprecated: every
// full level now has one line in the store, served oldest first across processes, and both
// values behave alike (docs/waiting.md). The field is still accepted and shown.
// +kubebuilder:validation:Enum=process;global
type Fairness string

const (
	// FairnessProcess is accepted for compatibility; waiters are served oldest first across
	// processes.
	FairnessProcess Fairness = "process"
	// FairnessGlobal is accepted for compatibility; waiters are served oldest first across
	// processes.
	FairnessGlobal Fairness = "global"
)

// LeaseLevels are the quota caps of the four levels of the funnel. An unset level is not
// capped (pass-through); a cap of 1 makes the lease exclusive at that level.
type LeaseLevels struct {
	// global is the cap across all tenants, the resource ceiling. Owned by the built-in and
	// the system layer; ignored on a tenant or project layer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Global *int32 `json:"global,omitempty"`

	// tenant is the cap per tenant. Owned by the built-in, system and tenant layers; ignored
	// on a project layer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Tenant *int32 `json:"tenant,omitempty"`

	// project is the cap per project. Owned by every layer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	Project *int32 `json:"project,omitempty"`

	// user is the cap per user across the user's projects. Owned by every layer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	User *int32 `json:"user,omitempty"`
}

// LeaseDefinitionSpec is one layer document of a lease definition (docs/design.md).
// +kubebuilder:validation:XValidation:rule="self.tenant != '_vance' || self.project == '_tenant'",message="the system layer (tenant _vance) must have project _tenant"
type LeaseDefinitionSpec struct {
	// leaseName is the name consumers reference (for example tex or browser). Lease names are
	// path segments: a letter or digit, then up to 63 letters, digits, '_' or '-'. Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="leaseName is immutable"
	LeaseName string `json:"leaseName,omitempty"`

	// tenant is the scope's tenant: _vance for the system layer, otherwise a tenant ID (a
	// letter or digit, then up to 63 letters, digits, '_', '.' or '-'). Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(_vance|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="tenant is immutable"
	Tenant string `json:"tenant,omitempty"`

	// project is the scope's project: _tenant for the system and the tenant layer, otherwise a
	// project ID of the tenant (same syntax as a tenant ID). Immutable.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=64
	// +kubebuilder:validation:Pattern=`^(_tenant|[A-Za-z0-9][A-Za-z0-9_.-]{0,63})$`
	// +kubebuilder:validation:XValidation:rule="self == oldSelf",message="project is immutable"
	Project string `json:"project,omitempty"`

	// resource is the counter key; leases of different names with the same resource share one
	// funnel. Defaults to the lease name. Owned by the built-in, system and tenant layers;
	// ignored on a project layer.
	// +optional
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=128
	// +kubebuilder:validation:Pattern=`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`
	Resource *string `json:"resource,omitempty"`

	// levels are the caps this layer sets; unset levels are inherited from wider layers.
	// +optional
	Levels *LeaseLevels `json:"levels,omitempty"`

	// ttlSeconds is the idle time after the last check after which a holder is reaped. Owned
	// by every layer.
	// +optional
	// +kubebuilder:validation:Minimum=1
	// +kubebuilder:validation:Maximum=86400
	TTLSeconds *int32 `json:"ttlSeconds,omitempty"`

	// waitMs is how long an acquisition waits for a free slot before it fails busy; 0 fails
	// at once. Owned by every layer.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=600000
	WaitMs *int32 `json:"waitMs,omitempty"`

	// fairness is deprecated and has no effect: the waiters of a full level are served oldest
	// first across processes, through one line in the store, whatever it says. Accepted for
	// compatibility (process or global); owned by the system layer, ignored on a tenant or
	// project layer.
	// +optional
	Fairness *Fairness `json:"fairness,omitempty"`

	// maxPriority is the highest priority an acquisition of this lease may ask for; a request
	// above it is refused (400). Waiters of a full level are served highest priority first,
	// oldest first within a priority; priority never revokes a holder. Defaults to 0: only
	// priority 0. Owned by the built-in and the system layer; ignored on a tenant or project
	// layer, so that no tenant makes itself urgent (docs/waiting.md, "Priority").
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MaxPriority *int32 `json:"maxPriority,omitempty"`

	// priorityAgeBoundSeconds is the age after which a waiter is served as of the highest
	// priority (1000), so that a steady stream of urgent waiters cannot starve the others.
	// 0 (the default) is off. Owned by the built-in and the system layer.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=86400
	PriorityAgeBoundSeconds *int32 `json:"priorityAgeBoundSeconds,omitempty"`

	// borrowing lets a tenant use idle capacity above its tenant cap, up to the global cap,
	// while no other tenant below its cap waits; borrowed slots are reclaimed by revocation
	// when one does (docs/borrowing.md). Owned by the built-in and the system layer; ignored
	// on a tenant or project layer, so that no tenant lends itself another tenant's share.
	// +optional
	Borrowing *LeaseBorrowing `json:"borrowing,omitempty"`
}

// LeaseBorrowing is the borrowing of idle capacity across tenants (docs/borrowing.md). Each
// field merges on its own: a system layer may, say, set only graceSeconds.
type LeaseBorrowing struct {
	// enabled lets a tenant take slots above its tenant cap while the global level has room.
	// Defaults to false. Borrowing needs a tenant and a global cap; without both it does nothing.
	// +optional
	Enabled *bool `json:"enabled,omitempty"`

	// maxBorrowed bounds the slots one tenant may hold above its tenant cap; 0 (the default)
	// bounds them by the global cap only.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=100000
	MaxBorrowed *int32 `json:"maxBorrowed,omitempty"`

	// graceSeconds is how long a waiter of a tenant below its cap, blocked at the global
	// level, waits before a borrowed slot is revoked for it (reclaim). Defaults to 5.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=3600
	GraceSeconds *int32 `json:"graceSeconds,omitempty"`
}

// EffectiveBorrowing is the merged borrowing of a definition; present only when enabled.
type EffectiveBorrowing struct {
	// maxBorrowed bounds the slots one tenant may hold above its cap; 0 is the global cap.
	// +optional
	// +kubebuilder:validation:Minimum=0
	MaxBorrowed int32 `json:"maxBorrowed,omitempty"`

	// graceSeconds is the reclaim's grace.
	// +optional
	// +kubebuilder:validation:Minimum=0
	GraceSeconds int32 `json:"graceSeconds,omitempty"`
}

// EffectiveDefinition is the merged definition at an object's scope: what an acquisition in
// that scope gets.
type EffectiveDefinition struct {
	// resource is the counter key.
	// +required
	// +kubebuilder:validation:MinLength=1
	// +kubebuilder:validation:MaxLength=256
	Resource string `json:"resource,omitempty"`

	// levels are the merged caps; an absent level is not capped.
	// +optional
	Levels *LeaseLevels `json:"levels,omitempty"`

	// ttlSeconds is the merged idle TTL.
	// +required
	// +kubebuilder:validation:Minimum=1
	TTLSeconds int32 `json:"ttlSeconds,omitempty"`

	// waitMs is the merged wait for a free slot.
	// +required
	// +kubebuilder:validation:Minimum=0
	WaitMs *int32 `json:"waitMs,omitempty"`

	// fairness is the merged order across processes of the waiters at a full level.
	// +required
	Fairness Fairness `json:"fairness,omitempty"`

	// maxPriority is the merged highest priority a request may ask for.
	// +optional
	// +kubebuilder:validation:Minimum=0
	// +kubebuilder:validation:Maximum=1000
	MaxPriority int32 `json:"maxPriority,omitempty"`

	// priorityAgeBoundSeconds is the merged age after which a waiter is served as of the
	// highest priority; absent when off.
	// +optional
	// +kubebuilder:validation:Minimum=0
	PriorityAgeBoundSeconds int32 `json:"priorityAgeBoundSeconds,omitempty"`

	// borrowing is the merged borrowing; absent when off.
	// +optional
	Borrowing *EffectiveBorrowing `json:"borrowing,omitempty"`

	// noop is true when no level is capped: acquisitions succeed without touching the store.
	// +optional
	NoOp bool `json:"noop,omitempty"`
}

// LeaseDefinitionStatus is the observed state of a LeaseDefinition.
type LeaseDefinitionStatus struct {
	// conditions are Ready and FieldsIgnored.
	// +optional
	// +listType=map
	// +listMapKey=type
	// +kubebuilder:validation:MaxItems=8
	Conditions []metav1.Condition `json:"conditions,omitempty"`

	// observedGeneration is the generation of the spec the status was computed from.
	// +optional
	// +kubebuilder:validation:Minimum=0
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`

	// ignoredFields lists the fields set on this object that its layer does not own (for
	// example levels.global on a tenant layer). They take no effect.
	// +optional
	// +listType=set
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=32
	IgnoredFields []string `json:"ignoredFields,omitempty"`

	// effective is the merged definition at this object's scope (built-in, system, tenant and
	// project layers as far as they apply). Absent while the scope is unavailable.
	// +optional
	Effective *EffectiveDefinition `json:"effective,omitempty"`
}

// LeaseDefinition is one layer of a lease definition: the system layer (tenant _vance,
// project _tenant), a tenant layer (project _tenant) or a project layer. The definitions of
// a lease name are merged field by field, most specific owning layer first.
//
// +kubebuilder:object:root=true
// +kubebuilder:subresource:status
// +kubebuilder:resource:shortName=ldef
// +kubebuilder:printcolumn:name="Lease",type=string,JSONPath=`.spec.leaseName`
// +kubebuilder:printcolumn:name="Tenant",type=string,JSONPath=`.spec.tenant`
// +kubebuilder:printcolumn:name="Project",type=string,JSONPath=`.spec.project`
// +kubebuilder:printcolumn:name="Global",type=integer,JSONPath=`.spec.levels.global`
// +kubebuilder:printcolumn:name="Per-Tenant",type=integer,JSONPath=`.spec.levels.tenant`
// +kubebuilder:printcolumn:name="Per-Project",type=integer,JSONPath=`.spec.levels.project`
// +kubebuilder:printcolumn:name="Per-User",type=integer,JSONPath=`.spec.levels.user`
// +kubebuilder:printcolumn:name="TTL",type=integer,JSONPath=`.spec.ttlSeconds`
// +kubebuilder:printcolumn:name="Ready",type=string,JSONPath=`.status.conditions[?(@.type=="Ready")].status`
// +kubebuilder:printcolumn:name="Reason",type=string,priority=1,JSONPath=`.status.conditions[?(@.type=="Ready")].reason`
// +kubebuilder:printcolumn:name="Resource",type=string,priority=1,JSONPath=`.status.effective.resource`
// +kubebuilder:printcolumn:name="Fairness",type=string,priority=1,JSONPath=`.status.effective.fairness`
// +kubebuilder:printcolumn:name="Age",type=date,JSONPath=`.metadata.creationTimestamp`
type LeaseDefinition struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard object metadata.
	// +optional
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the layer document.
	// +required
	Spec LeaseDefinitionSpec `json:"spec,omitzero"`

	// status is the observed state.
	// +optional
	Status LeaseDefinitionStatus `json:"status,omitempty"`
}

// LeaseDefinitionList is a list of LeaseDefinition.
//
// +kubebuilder:object:root=true
type LeaseDefinitionList struct {
	metav1.TypeMeta `json:",inline"`
	// metadata is the standard list metadata.
	// +optional
	metav1.ListMeta `json:"metadata,omitempty"`

	// items are the LeaseDefinitions.
	Items []LeaseDefinition `json:"items"`
}
