package tenantview

import (
	"context"
	"fmt"
	"sync"
	"time"

	authorizationv1 "k8s.io/api/authorization/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

// The live API's resources the view uses (docs/live-api.md).
var (
	HoldersResource  = livev1alpha1.GroupVersion.WithResource(livev1alpha1.ResourceHolders)
	CountersResource = livev1alpha1.GroupVersion.WithResource(livev1alpha1.ResourceCounters)
	WaitersResource  = livev1alpha1.GroupVersion.WithResource(livev1alpha1.ResourceWaiters)
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
		h, err := holderFrom(o.Object)
		if err != nil {
			return nil, err
		}
		out = append(out, h)
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
		c, err := counterFrom(o.Object)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// ListWaiters lists the leasewaiters of namespace.
func (k *KubeSource) ListWaiters(ctx context.Context, namespace string) ([]Waiter, error) {
	list, err := k.dyn.Resource(WaitersResource).Namespace(namespace).List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	out := make([]Waiter, 0, len(list.Items))
	for _, o := range list.Items {
		var w livev1alpha1.LeaseWaiter
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &w); err != nil {
			return nil, fmt.Errorf("decoding a LeaseWaiter: %w", err)
		}
		var part string
		if len(w.Spec.Parts) > 0 {
			part = w.Status.Resource
		}
		out = append(out, Waiter{
			Name: w.Name, Lease: w.Spec.Lease, Resource: w.Spec.Resource, WaitsOn: part, Project: w.Spec.Project, User: w.Spec.User,
			Pod: w.Spec.Pod, Level: w.Status.Level, Scope: w.Status.Scope, Position: w.Status.Position,
			EstimatedWait: time.Duration(w.Status.EstimatedWaitMs) * time.Millisecond, Since: w.Status.Since.Time,
			Lapsed: w.Status.Lapsed, Priority: w.Status.Priority,
		})
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

// holderFrom reads a LeaseHolder object.
func holderFrom(o map[string]any) (Holder, error) {
	var h livev1alpha1.LeaseHolder
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o, &h); err != nil {
		return Holder{}, fmt.Errorf("decoding a LeaseHolder: %w", err)
	}
	return Holder{
		Name: h.Name, Lease: h.Spec.Lease, Resource: h.Spec.Resource, Type: h.Spec.Type,
		Tenant: h.Spec.Tenant, Project: h.Spec.Project, User: h.Spec.User, Pod: h.Spec.Pod,
		PodAlive: h.Status.PodAlive, PodReason: h.Status.PodReason, TTL: time.Duration(h.Spec.TTLSeconds) * time.Second,
		AcquiredAt: h.Status.AcquiredAt.Time, LastSeenAt: h.Status.LastSeenAt.Time, Borrowed: h.Status.Borrowed,
	}, nil
}

// counterFrom reads a LeaseCounter object, with the cap the server publishes (or why it
// publishes none; docs/live-api.md, "Caps").
func counterFrom(o map[string]any) (Counter, error) {
	var c livev1alpha1.LeaseCounter
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o, &c); err != nil {
		return Counter{}, fmt.Errorf("decoding a LeaseCounter: %w", err)
	}
	return Counter{Resource: c.Resource, Level: c.Level, Scope: c.Scope, Count: c.Count, Booked: c.Booked, Waiting: c.Waiting,
		Borrowed: c.Borrowed, Cap: c.Cap, CapReason: c.CapReason, CapNote: c.CapNote, UpdatedAt: c.UpdatedAt.Time}, nil
}

var _ Changes = (*KubeSource)(nil)

// Changes follows the holders, waiters and counters of namespace with the live API's watches,
// as the user: a value on the channel (of one) says something changed since the last. It
// resumes a watch that ends (the server's timeout, a manager restart) from a fresh list, and
// then reports a change, since one may have come meanwhile. The channel closes when ctx ends.
func (k *KubeSource) Changes(ctx context.Context, namespace string) (<-chan struct{}, error) {
	out := make(chan struct{}, 1)
	signal := func() {
		select {
		case out <- struct{}{}:
		default:
		}
	}
	var wg sync.WaitGroup
	for _, res := range []schema.GroupVersionResource{HoldersResource, WaitersResource, CountersResource} {
		c := k.dyn.Resource(res).Namespace(namespace)
		// The first list answers now: a user who may not watch hears so at once.
		list, err := c.List(ctx, metav1.ListOptions{Limit: 1})
		if err != nil {
			return nil, err
		}
		wg.Add(1)
		go func(rv string) {
			defer wg.Done()
			for first := true; ctx.Err() == nil; first = false {
				if !first {
					list, err := c.List(ctx, metav1.ListOptions{Limit: 1})
					if err != nil {
						pause(ctx)
						continue
					}
					rv = list.GetResourceVersion()
					signal()
				}
				w, err := c.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
				if err != nil {
					pause(ctx)
					continue
				}
				for e := range w.ResultChan() {
					if e.Type == watch.Error {
						break
					}
					if e.Type != watch.Bookmark {
						signal()
					}
				}
				w.Stop()
			}
		}(list.GetResourceVersion())
	}
	go func() {
		wg.Wait()
		close(out)
	}()
	return out, nil
}

// pause waits a second before the next try of a watch, or until ctx ends.
func pause(ctx context.Context) {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}
