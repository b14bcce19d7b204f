// Package v1alpha1 contains the types of the live.lease.vancetope.io API group: the live
// holders and counters of the lease store, served by the manager as an aggregated API (not
// CRDs, nothing is stored in etcd). The group is separate from lease.vancetope.io because a
// group-version is served either by CRDs or by one APIService, never both. See
// docs/live-api.md.
//
// +kubebuilder:object:generate=true
// +kubebuilder:skip
// +groupName=live.lease.vancetope.io
// +k8s:openapi-gen=true
package v1alpha1
