package k8stenancy

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/vancetope/lease-operator/internal/tenancy"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IndexTenant indexes Namespace objects in a controller-runtime cache by the value of
// tenancy.TenantLabel (registered by SetupIndex), so that a consumer of the cache can list a tenant's
// namespaces with client.MatchingFields{IndexTenant: tenant}.
const IndexTenant = "lease.vancetope.io/tenant"

// SetupIndex registers IndexTenant on Namespaces. Call it before the cache starts.
func SetupIndex(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &corev1.Namespace{}, IndexTenant, tenantIndexFunc); err != nil {
		return fmt.Errorf("indexing Namespaces by tenant: %w", err)
	}
	return nil
}

func tenantIndexFunc(o client.Object) []string {
	if t := o.GetLabels()[tenancy.TenantLabel]; t != "" {
		return []string{t}
	}
	return nil
}

// informerIndex is the name of Informed's own index on the Namespace informer.
const informerIndex = "lease.vancetope.io/tenancy"

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Informed is the Map of a cluster: it reads the Namespace informer of a controller-runtime
// cache through an index by tenancy.TenantLabel. Because it reads the informer's own store, it agrees
// with every event handler of that informer: a controller that reacts to a Namespace event
// sees the new tenant in TenantOf. It is safe for concurrent use.
type Informed struct {
	system   string
	informer toolscache.SharedIndexInformer

	mu       sync.Mutex
	handlers []func(namespace string)
}

var _ tenancy.Map = (*Informed)(nil)

// NewInformed returns the Map of the namespaces the informers see, with system as the system
// namespace. Call it before the cache starts, so that OnChange sees every relabel. The
// Namespace informer is cluster-scoped, whatever namespaces the cache is restricted to; the
// process needs get, list and watch on namespaces.
func NewInformed(ctx context.Context, informers cache.Informers, system string) (*Informed, error) {
	i, err := informers.GetInformer(ctx, &corev1.Namespace{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Namespace informer: %w", err)
	}
	informer, ok := i.(toolscache.SharedIndexInformer)
	if !ok {
		return nil, fmt.Errorf("the Namespace informer is a %T, not a SharedIndexInformer", i)
	}
	if err := informer.AddIndexers(toolscache.Indexers{informerIndex: func(obj any) ([]string, error) {
		if ns, ok := obj.(*corev1.Namespace); ok {
			return tenantIndexFunc(ns), nil
		}
		return nil, nil
	}}); err != nil {
		return nil, fmt.Errorf("indexing the Namespace informer by tenant: %w", err)
	}
	m := &Informed{system: system, informer: informer}
	if _, err := informer.AddEventHandler(m.handler()); err != nil {
		return nil, fmt.Errorf("adding the tenancy handler to the Namespace informer: %w", err)
	}
	return m, nil
}

// HasSynced reports whether the informer has listed every namespace once. Until then TenantOf
// may answer false for a tenant namespace: a caller that must not decide on a partial view
// (the definition resolver) fails closed meanwhile.
func (m *Informed) HasSynced() bool { return m.informer.HasSynced() }

// OnChange registers f to be called with the name of every namespace whose tenant changes:
// labelled, relabelled, unlabelled, or created or deleted with the label. f is called after
// the change is visible through TenantOf and NamespacesOf. It runs on the informer's goroutine
// and must not block.
func (m *Informed) OnChange(f func(namespace string)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.handlers = append(m.handlers, f)
}

// SystemNamespace implements Map.
func (m *Informed) SystemNamespace() string { return m.system }

// TenantOf implements Map.
func (m *Informed) TenantOf(namespace string) (string, bool) {
	obj, ok, err := m.informer.GetIndexer().GetByKey(namespace)
	if err != nil || !ok {
		return "", false
	}
	ns, isNS := obj.(*corev1.Namespace)
	if !isNS {
		return "", false
	}
	t := ns.Labels[tenancy.TenantLabel]
	return t, t != ""
}

// NamespacesOf implements Map.
func (m *Informed) NamespacesOf(tenant string) []string {
	out := []string{}
	if tenant == "" {
		return out
	}
	objs, err := m.informer.GetIndexer().ByIndex(informerIndex, tenant)
	if err != nil {
		return out
	}
	for _, obj := range objs {
		if ns, ok := obj.(*corev1.Namespace); ok {
			out = append(out, ns.Name)
		}
	}
	slices.Sort(out)
	return out
}

// NamespacedTenants implements Map.
func (m *Informed) NamespacedTenants() []string {
	out := slices.Clone(m.informer.GetIndexer().ListIndexFuncValues(informerIndex))
	out = slices.DeleteFunc(out, func(t string) bool { return t == "" })
	slices.Sort(out)
	return out
}

func (m *Informed) handler() toolscache.ResourceEventHandler {
	return changeHandler(func(namespace string) {
		m.mu.Lock()
		handlers := slices.Clone(m.handlers)
		m.mu.Unlock()
		for _, h := range handlers {
			h(namespace)
		}
	})
}

// changeHandler calls notify with the name of each namespace whose tenant label an informer
// event changes.
func changeHandler(notify func(namespace string)) toolscache.ResourceEventHandler {
	tenant := func(obj any) (string, string, bool) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj = tomb.Obj
		}
		ns, ok := obj.(*corev1.Namespace)
		if !ok {
			return "", "", false
		}
		return ns.Name, ns.Labels[tenancy.TenantLabel], true
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) {
			if name, t, ok := tenant(obj); ok && t != "" {
				notify(name)
			}
		},
		UpdateFunc: func(oldObj, newObj any) {
			_, before, okOld := tenant(oldObj)
			name, after, okNew := tenant(newObj)
			if okOld && okNew && before != after {
				notify(name)
			}
		},
		DeleteFunc: func(obj any) {
			if name, t, ok := tenant(obj); ok && t != "" {
				notify(name)
			}
		},
	}
}
