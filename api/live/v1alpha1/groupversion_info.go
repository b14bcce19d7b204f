package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupName is the API group of the live view.
const GroupName = "live.lease.vancetope.io"

// Resource names (plural and short). Never "leases": that name belongs to
// coordination.k8s.io and always wins discovery.
const (
	ResourceHolders  = "leaseholders"
	ResourceCounters = "leasecounters"
	ShortHolders     = "lh"
	ShortCounters    = "lc"
	ResourceWaiters  = "leasewaiters"
	ShortWaiters     = "lw"
	// The operator's actions: create-only resources in the system namespace.
	ResourcePodRevocations = "podrevocations"
	ResourceSweeps         = "sweeps"
	ResourceReconciles     = "reconciles"
	// ResourceAcquisitionReviews: create-only, in a tenant's namespace (or the system
	// namespace): what an acquisition would answer now.
	ResourceAcquisitionReviews = "leaseacquisitionreviews"
)

var (
	// GroupVersion is the group and version of the objects in this package.
	GroupVersion = schema.GroupVersion{Group: GroupName, Version: "v1alpha1"}

	// SchemeBuilder adds the types of this package to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

// Resource returns the group-qualified resource.
func Resource(resource string) schema.GroupResource {
	return GroupVersion.WithResource(resource).GroupResource()
}

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion,
		&LeaseHolder{}, &LeaseHolderList{},
		&LeaseCounter{}, &LeaseCounterList{},
		&LeaseWaiter{}, &LeaseWaiterList{},
		&PodRevocation{}, &Sweep{}, &Reconcile{},
		&LeaseAcquisitionReview{},
	)
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
