package tenancy

import (
	"context"
	"fmt"
	"slices"
	"sync"

	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// IndexTenant indexes Namespace objects in a controller-runtime cache by the value of
// TenantLabel (registered by SetupIndex), so that a consumer of the cache can list a tenant's
// namespaces with client.MatchingFields{IndexTenant: tenant}.
const IndexTenant = "lease.vancetope.io/tenant"

// SetupIndex registers IndexTenant on Namespaces. Call it before the cache starts.
func SetupIndex(ctx context.Context, indexer client.FieldIndexer) error {
	if err := indexer.IndexField(ctx, &corev1.Namespace{}, IndexTenant, func(o client.Object) []string {
		if t := o.GetLabels()[TenantLabel]; t != "" {
			return []string{t}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("indexing Namespaces by tenant: %w", err)
	}
	return nil
}

// +kubebuilder:rbac:groups="",resources=namespaces,verbs=get;list;watch

// Informed is the Map of a cluster: it follows the Namespace informer of a controller-runtime
// cache and keeps an index of namespaces by tenant. It is safe for concurrent use.
type Informed struct {
	system string

	mu       sync.RWMutex
	tenantOf map[string]string              // namespace -> tenant (labelled namespaces only)
	byTenant map[string]map[string]struct{} // tenant -> namespaces
	handlers []func(namespace string)
	synced   func() bool
}

var _ Map = (*Informed)(nil)

// NewInformed returns the Map of the namespaces the informers see, with system as the system
// namespace. Call it before the cache starts (or at least before relying on OnChange), so that
// no relabel is missed. The Namespace informer is cluster-scoped, whatever namespaces the
// cache is restricted to; the process needs get, list and watch on namespaces.
func NewInformed(ctx context.Context, informers cache.Informers, system string) (*Informed, error) {
	m := &Informed{
		system:   system,
		tenantOf: map[string]string{},
		byTenant: map[string]map[string]struct{}{},
	}
	informer, err := informers.GetInformer(ctx, &corev1.Namespace{}, cache.BlockUntilSynced(false))
	if err != nil {
		return nil, fmt.Errorf("getting the Namespace informer: %w", err)
	}
	reg, err := informer.AddEventHandler(m.handler())
	if err != nil {
		return nil, fmt.Errorf("adding the tenancy handler to the Namespace informer: %w", err)
	}
	m.synced = reg.HasSynced
	return m, nil
}

// HasSynced reports whether the map has seen every namespace of the informer's first list.
// Until then TenantOf may answer false for a tenant namespace: callers that must not decide on
// a partial map (the resolver) wait for it, for example through the cache's WaitForCacheSync.
func (m *Informed) HasSynced() bool { return m.synced != nil && m.synced() }

// OnChange registers f to be called with the name of every namespace whose tenant changes:
// labelled, relabelled, unlabelled, or deleted or created with the label. Register before the
// cache starts to see the initial labelled namespaces too. f runs on the informer's goroutine
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
	m.mu.RLock()
	defer m.mu.RUnlock()
	t, ok := m.tenantOf[namespace]
	return t, ok
}

// NamespacesOf implements Map.
func (m *Informed) NamespacesOf(tenant string) []string {
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]string, 0, len(m.byTenant[tenant]))
	for ns := range m.byTenant[tenant] {
		out = append(out, ns)
	}
	slices.Sort(out)
	return out
}

func (m *Informed) handler() toolscache.ResourceEventHandler {
	set := func(obj any, deleted bool) {
		if tomb, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
			obj, deleted = tomb.Obj, true
		}
		ns, ok := obj.(*corev1.Namespace)
		if !ok {
			return
		}
		tenant := ""
		if !deleted {
			tenant = ns.Labels[TenantLabel]
		}
		if m.set(ns.Name, tenant) {
			m.mu.RLock()
			handlers := slices.Clone(m.handlers)
			m.mu.RUnlock()
			for _, h := range handlers {
				h(ns.Name)
			}
		}
	}
	return toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(obj any) { set(obj, false) },
		UpdateFunc: func(_, obj any) { set(obj, false) },
		DeleteFunc: func(obj any) { set(obj, true) },
	}
}

// set records the tenant of a namespace ("" for none) and reports whether it changed.
func (m *Informed) set(namespace, tenant string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	old, had := m.tenantOf[namespace]
	if (had && old == tenant) || (!had && tenant == "") {
		return false
	}
	if had {
		delete(m.byTenant[old], namespace)
		if len(m.byTenant[old]) == 0 {
			delete(m.byTenant, old)
		}
		delete(m.tenantOf, namespace)
	}
	if tenant != "" {
		m.tenantOf[namespace] = tenant
		if m.byTenant[tenant] == nil {
			m.byTenant[tenant] = map[string]struct{}{}
		}
		m.byTenant[tenant][namespace] = struct{}{}
	}
	return true
}
