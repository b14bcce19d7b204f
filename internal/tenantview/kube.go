package tenantview

import (
	"context"
	"fmt"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// The live API's resources the view uses (docs/live-api.md).
var (
	HoldersResource  = schema.GroupVersionResource{Group: "live.lease.vancetope.io", Version: "v1alpha1", Resource: "leaseholders"}
	CountersResource = schema.GroupVersionResource{Group: "live.lease.vancetope.io", Version: "v1alpha1", Resource: "leasecounters"}
)

// KubeSource is the Source over the live API, called with the credentials of cfg: the
// user's kubeconfig, never a service account of its own.
type KubeSource struct {
	dyn  dynamic.Interface
	auth kubernetes.Interface
}

var _ Source = (*KubeSource)(nil)

// NewKubeSource returns a source calling the API server of cfg as cfg's user.
func NewKubeSource(cfg *rest.Config) (*KubeSource, error) {
	dyn, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("live API client for %s: %w", cfg.Host, err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("authorization client for %s: %w", cfg.Host, err)
	}
	return &KubeSource{dyn: dyn, auth: cs}, nil
}

// ListHolders lists the leaseholders of namespace.
func (k *KubeSource) ListHolders(ctx context.Context, namespace string) ([]Holder, error) {
	list, err := k.dyn.Resource(HoldersResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]Holder, 0, len(list.Items))
	for _, o := range list.Items {
		out = append(out, holderFrom(o.Object, o.GetName()))
	}
	return out, nil
}

// ListCounters lists the leasecounters of namespace.
func (k *KubeSource) ListCounters(ctx context.Context, namespace string) ([]Counter, error) {
	list, err := k.dyn.Resource(CountersResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]Counter, 0, len(list.Items))
	for _, o := range list.Items {
		out = append(out, counterFrom(o.Object))
	}
	return out, nil
}

// RevokeHolder deletes the leaseholder: the live API revokes it.
func (k *KubeSource) RevokeHolder(ctx context.Context, namespace, name string) error {
	return k.dyn.Resource(HoldersResource).Namespace(namespace).Delete(ctx, name, metav1.DeleteOptions{})
}

// CanRevoke asks the API server whether the user may delete leaseholders in namespace.
func (k *KubeSource) CanRevoke(ctx context.Context, namespace string) (bool, error) {
	r, err := k.auth.AuthorizationV1().SelfSubjectAccessReviews().Create(ctx, &authorizationv1.SelfSubjectAccessReview{
		Spec: authorizationv1.SelfSubjectAccessReviewSpec{ResourceAttributes: &authorizationv1.ResourceAttributes{
			Namespace: namespace, Verb: "delete", Group: HoldersResource.Group, Version: HoldersResource.Version,
			Resource: HoldersResource.Resource,
		}},
	}, metav1.CreateOptions{})
	if err != nil {
		return false, fmt.Errorf("asking whether leaseholders may be deleted in %s: %w", namespace, err)
	}
	return r.Status.Allowed, nil
}

// holderFrom reads a LeaseHolder object. Missing fields stay zero: the view shows what the
// server sent.
func holderFrom(o map[string]any, name string) Holder {
	s := func(path ...string) string { v, _, _ := unstructured.NestedString(o, path...); return v }
	ttl, _, _ := unstructured.NestedInt64(o, "spec", "ttlSeconds")
	return Holder{
		Name: name, Lease: s("spec", "lease"), Resource: s("spec", "resource"), Type: s("spec", "type"),
		Tenant: s("spec", "tenant"), Project: s("spec", "project"), User: s("spec", "user"), Pod: s("spec", "pod"),
		PodAlive: s("status", "podAlive"), PodReason: s("status", "podReason"), TTL: time.Duration(ttl) * time.Second,
		AcquiredAt: timeOf(s("status", "acquiredAt")), LastSeenAt: timeOf(s("status", "lastSeenAt")),
	}
}

// counterFrom reads a LeaseCounter object. cap is read when the server publishes it.
func counterFrom(o map[string]any) Counter {
	s := func(f string) string { v, _, _ := unstructured.NestedString(o, f); return v }
	i := func(f string) int64 { v, _, _ := unstructured.NestedInt64(o, f); return v }
	return Counter{Resource: s("resource"), Level: s("level"), Scope: s("scope"), Count: i("count"), Booked: i("booked"),
		Cap: i("cap"), UpdatedAt: timeOf(s("updatedAt"))}
}

func timeOf(v string) time.Time {
	t, err := time.Parse(time.RFC3339, v)
	if err != nil {
		return time.Time{}
	}
	return t
}
