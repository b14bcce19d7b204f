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
	// would book.
	ReviewGranted = "granted"
	// ReviewBusy: a level is full now; status.busy is the first full level, narrow to wide.
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
	// resource is the counter key the lease books.
	// +optional
	Resource string `json:"resource,omitempty"`
	// levels are the levels a grant would book, narrow to wide (granted).
	// +optional
	// +listType=atomic
	Levels []ReviewLevel `json:"levels,omitempty"`
	// busy is the first full level, narrow to wide (busy).
	// +optional
	Busy *ReviewBusyLevel `json:"busy,omitempty"`
	// message says the outcome for people.
	// +optional
	Message string `json:"message,omitempty"`
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
