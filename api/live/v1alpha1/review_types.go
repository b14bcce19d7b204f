package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LeaseAcquisitionReview asks the manager what an acquisition would answer now, without
// acquiring: the admission API's dry run (docs/api.md, "Dry run") for people, as a
// SubjectAccessReview asks the authorizer. Create it in a tenant's namespace, whose tenant
// it asks for, or in the system namespace naming any tenant; the answer is in status and
// nothing is kept (docs/live-api.md, "Acquisition reviews").
// +kubebuilder:object:root=true
type LeaseAcquisitionReview struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	// spec is the acquisition to review.
	// +required
	Spec LeaseAcquisitionReviewSpec `json:"spec"`
	// status is the answer (filled in by the server).
	// +optional
	Status LeaseAcquisitionReviewStatus `json:"status,omitzero"`
}

// LeaseAcquisitionReviewSpec is an acquisition as the admission API takes it, without what
// only a holder has (holder reference, payload, pod).
type LeaseAcquisitionReviewSpec struct {
	// lease is the name of the lease definition; empty or "none" is no lease (NOOP).
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Lease string `json:"lease,omitempty"`
	// leases names several leases to review as one acquisition, granted all together or not
	// at all (docs/api.md, "Several leases at once"): 1 to 8 names, none twice, no two
	// booking the same resource; exclusive with lease.
	// +optional
	// +listType=atomic
	// +kubebuilder:validation:MaxItems=8
	// +kubebuilder:validation:items:MaxLength=64
	Leases []string `json:"leases,omitempty"`
	// tenant is the tenant to act for. In a tenant's namespace it is that namespace's tenant
	// (the default; another one is refused); in the system namespace it is required.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Tenant string `json:"tenant,omitempty"`
	// project is the project to act for.
	// +required
	// +kubebuilder:validation:MaxLength=64
	Project string `json:"project"`
	// user is the user to act for; required when the definition caps the user level.
	// +optional
	// +kubebuilder:validation:MaxLength=128
	User string `json:"user,omitempty"`
	// type is the lease type. It selects only the revocation handler, so it may be left
	// out; a type that is given must have a handler.
	// +optional
	// +kubebuilder:validation:MaxLength=64
	Type string `json:"type,omitempty"`
}

// Outcomes of a LeaseAcquisitionReview (status.outcome).
const (
	// ReviewGranted: every capped level has room now; status.levels are the levels a grant
	// would book (status.parts each lease's, for a review of several).
	ReviewGranted = "granted"
	// ReviewBusy: a level is full now; status.busy is the first full level, narrow to wide
	// (of the first full lease in the order of the resources, for a review of several).
	ReviewBusy = "busy"
	// ReviewNoOp: no lease applies (no reference, or a definition without caps).
	ReviewNoOp = "noop"
	// ReviewError: an acquisition would fail now with LEASE_UNAVAILABLE (the lease's
	// definition is broken, in conflict or unreadable); status.message says which.
	ReviewError = "error"
)

// LeaseAcquisitionReviewStatus is what an acquisition would answer now.
type LeaseAcquisitionReviewStatus struct {
	// outcome is granted, busy, noop or error.
	// +optional
	Outcome string `json:"outcome,omitempty"`
	// tenant is the tenant the review was made for (the namespace's, in a tenant's
	// namespace).
	// +optional
	Tenant string `json:"tenant,omitempty"`
	// resource is the counter key the lease books. For a review of several leases
	// (spec.leases), the parts' resources joined by "+" when granted (parts has each), the
	// full part's resource when busy.
	// +optional
	Resource string `json:"resource,omitempty"`
	// levels are the levels a grant would book, narrow to wide (granted); absent for a
	// review of several leases (parts has each part's).
	// +optional
	// +listType=atomic
	Levels []ReviewLevel `json:"levels,omitempty"`
	// parts are the leases of a granted review of several (spec.leases) that book
	// something, in the order of their resources, as an acquisition would book them; a
	// lease that caps no level books nothing and is left out. Absent for a review of one
	// lease.
	// +optional
	// +listType=map
	// +listMapKey=resource
	Parts []ReviewPart `json:"parts,omitempty"`
	// busy is the first full level, narrow to wide (busy); for a review of several leases,
	// of the first full lease in the order of the resources, which busy.lease names.
	// +optional
	Busy *ReviewBusyLevel `json:"busy,omitempty"`
	// message says the outcome for people.
	// +optional
	Message string `json:"message,omitempty"`
}

// ReviewPart is one lease of a granted review of several leases.
type ReviewPart struct {
	// lease is the name of the lease definition.
	Lease string `json:"lease"`
	// resource is the counter key the lease books.
	Resource string `json:"resource"`
	// levels are the levels a grant would book for it, narrow to wide.
	// +listType=atomic
	Levels []ReviewLevel `json:"levels"`
}

// ReviewLevel is one capped level a grant would book.
type ReviewLevel struct {
	// level is user, project, tenant or global.
	Level string `json:"level"`
	// scope is tenant/user, tenant/project, tenant or *.
	Scope string `json:"scope"`
	// cap is the level's cap.
	Cap int64 `json:"cap"`
}

// ReviewBusyLevel is the admission API's busy diagnosis: the first full level.
type ReviewBusyLevel struct {
	// lease is the lease whose level is full, for a review of several leases
	// (spec.leases); absent for a review of one.
	// +optional
	Lease string `json:"lease,omitempty"`
	// level is user, project, tenant or global.
	Level string `json:"level"`
	// scope is tenant/user, tenant/project, tenant or *.
	Scope string `json:"scope"`
	// count is the number of slots in use at the level.
	Count int64 `json:"count"`
	// cap is the level's cap.
	Cap int64 `json:"cap"`
	// position is the number of live waiters in the level's line, all of whom an
	// acquisition now would wait behind; absent when the store did not tell it in time.
	// +optional
	Position *int64 `json:"position,omitempty"`
	// estimatedWaitMs estimates the wait from there, from the resource's recent hold times;
	// absent without them. Never a promise.
	// +optional
	EstimatedWaitMs int64 `json:"estimatedWaitMs,omitempty"`
}
