// Package v1alpha1 contains the API types of the lease.vancetope.io group, version v1alpha1.
// It depends only on k8s.io/apimachinery, so clients (such as kubectl-lease) can import it
// cheaply.
//
// +kubebuilder:object:generate=true
// +groupName=lease.vancetope.io
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

var (
	// GroupVersion is the group and version of the objects in this package.
	GroupVersion = schema.GroupVersion{Group: "lease.vancetope.io", Version: "v1alpha1"}

	// SchemeBuilder adds the types of this package to a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)

	// AddToScheme adds the types of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme
)

func addKnownTypes(scheme *runtime.Scheme) error {
	scheme.AddKnownTypes(GroupVersion, &LeaseDefinition{}, &LeaseDefinitionList{})
	metav1.AddToGroupVersion(scheme, GroupVersion)
	return nil
}
