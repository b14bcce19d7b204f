package liveapi

import (
	"context"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/watch"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/livefeed"
)

var countersResource = livev1alpha1.Resource(livev1alpha1.ResourceCounters)

// counterStorage serves leasecounters: get and list. Counters are few (levels × scopes of
// the resources in use), so a list is one answer without pages.
type counterStorage struct {
	views *views
	deps  Deps
}

var (
	_ rest.Storage              = (*counterStorage)(nil)
	_ rest.Scoper               = (*counterStorage)(nil)
	_ rest.Getter               = (*counterStorage)(nil)
	_ rest.Lister               = (*counterStorage)(nil)
	_ rest.Watcher              = (*counterStorage)(nil)
	_ rest.ShortNamesProvider   = (*counterStorage)(nil)
	_ rest.SingularNameProvider = (*counterStorage)(nil)
	_ rest.CategoriesProvider   = (*counterStorage)(nil)
)

func (s *counterStorage) New() runtime.Object     { return &livev1alpha1.LeaseCounter{} }
func (s *counterStorage) NewList() runtime.Object { return &livev1alpha1.LeaseCounterList{} }
func (s *counterStorage) Destroy()                {}
func (s *counterStorage) NamespaceScoped() bool   { return true }
func (s *counterStorage) ShortNames() []string    { return []string{livev1alpha1.ShortCounters} }
func (s *counterStorage) GetSingularName() string { return "leasecounter" }
func (s *counterStorage) Categories() []string    { return []string{categoryLease} }

// counters reads the counters the namespace of ctx shows, narrowed by resource and level.
func (s *counterStorage) counters(ctx context.Context, f leasestore.CounterFilter) ([]livev1alpha1.LeaseCounter, error) {
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	if sc.kind == scopeNone {
		return nil, nil
	}
	if sc.kind == scopeTenant {
		if f.Tenant != "" && f.Tenant != sc.tenant {
			return nil, nil // another tenant's counters never appear here
		}
		// The tenant filter leaves the global level out.
		f.Tenant = sc.tenant
	}
	cs, err := s.deps.Store.ListCounters(ctx, f)
	if err != nil {
		return nil, storeError(s.deps.Log, "listing counters", err)
	}
	seen(s.deps, nil, nil, cs)
	return s.render(ctx, sc, cs), nil
}

// render turns counters into the objects the scope shows, in each of their namespaces it
// shows, with their caps.
func (s *counterStorage) render(ctx context.Context, sc scope, cs []lease.Counter) []livev1alpha1.LeaseCounter {
	type shown struct {
		c   lease.Counter
		nss []string
	}
	var visible []shown
	var booked []lease.Counter
	for _, c := range cs {
		if nss := sc.in(s.views.counterNamespaces(c)); len(nss) > 0 {
			visible = append(visible, shown{c, nss})
			booked = append(booked, c)
		}
	}
	// Only the counters this namespace shows have their bookers resolved.
	var res map[lease.DefinitionRef]resolution
	if s.deps.Caps != nil && len(booked) > 0 {
		res = resolveBookers(ctx, s.deps.Caps, booked)
	}
	var out []livev1alpha1.LeaseCounter
	for _, v := range visible {
		for _, ns := range v.nss {
			obj := counterObject(v.c, ns)
			if s.deps.Caps != nil {
				cc := capOf(v.c, res)
				obj.Cap, obj.CapReason, obj.CapNote = cc.Cap, cc.Reason, cc.Note
			}
			out = append(out, obj)
		}
	}
	return out
}

func (s *counterStorage) Get(ctx context.Context, name string, _ *metav1.GetOptions) (runtime.Object, error) {
	f := leasestore.CounterFilter{}
	if r, l, ok := splitCounterName(name); ok {
		f.Resource, f.Level = r, l
	}
	rv := listVersion(s.deps)
	cs, err := s.counters(ctx, f)
	if err != nil {
		return nil, err
	}
	for i := range cs {
		if cs[i].Name == name {
			cs[i].ResourceVersion = rv
			return &cs[i], nil
		}
	}
	return nil, apierrors.NewNotFound(countersResource, name)
}

// counterSel is a list or watch request's selection of counters: the store filter it
// narrows the read with, and the full selectors.
type counterSel struct {
	filter leasestore.CounterFilter
	labels labels.Selector
	fields fields.Selector
}

func (s counterSel) matches(c *livev1alpha1.LeaseCounter) bool {
	return s.labels.Matches(labels.Set(c.Labels)) && s.fields.Matches(counterFields(c))
}

// counterSelection translates selectors. An unknown field is a 400, as Kubernetes answers.
func counterSelection(o *metainternalversion.ListOptions) (counterSel, error) {
	sel := counterSel{labels: labels.Everything(), fields: fields.Everything()}
	if o != nil && o.LabelSelector != nil {
		sel.labels = o.LabelSelector
		reqs, _ := sel.labels.Requirements()
		for _, r := range reqs {
			v, ok := equality(r.Operator(), r.Values().List())
			switch {
			case ok && r.Key() == livev1alpha1.LabelResource:
				sel.filter.Resource = v
			case ok && r.Key() == livev1alpha1.LabelLevel:
				sel.filter.Level = lease.Level(v)
			}
		}
	}
	if o != nil && o.FieldSelector != nil {
		sel.fields = o.FieldSelector
		for _, r := range sel.fields.Requirements() {
			switch r.Field {
			case fieldName, fieldNS:
			case fieldCounterTenant:
				// Narrows the store's read to the tenant's counters and holders (their
				// tenant indexes); the namespace's tenant still wins (counters above).
				if r.Operator == selection.Equals || r.Operator == selection.DoubleEquals {
					sel.filter.Tenant = r.Value
				}
			default:
				return sel, apierrors.NewBadRequest("field label not supported: " + r.Field +
					" (leasecounters select on metadata.name, metadata.namespace and tenant; use labels for resource and level)")
			}
		}
	}
	return sel, nil
}

func (s *counterStorage) List(ctx context.Context, o *metainternalversion.ListOptions) (runtime.Object, error) {
	sel, err := counterSelection(o)
	if err != nil {
		return nil, err
	}
	list := &livev1alpha1.LeaseCounterList{Items: []livev1alpha1.LeaseCounter{}}
	list.ResourceVersion = listVersion(s.deps) // before the read: a watch from it misses nothing
	cs, err := s.counters(ctx, sel.filter)
	if err != nil {
		return nil, err
	}
	for _, c := range cs {
		if sel.matches(&c) {
			c.ResourceVersion = list.ResourceVersion
			list.Items = append(list.Items, c)
		}
	}
	return list, nil
}

// Watch follows the counters the request's namespace and selectors show, from the feed.
func (s *counterStorage) Watch(ctx context.Context, o *metainternalversion.ListOptions) (watch.Interface, error) {
	sel, err := counterSelection(o)
	if err != nil {
		return nil, err
	}
	sc := s.views.scopeOf(genericapirequest.NamespaceValue(ctx))
	if sc.kind == scopeTenant && sel.filter.Tenant != "" && sel.filter.Tenant != sc.tenant {
		sc.kind = scopeNone // another tenant's counters never appear here
	}
	return serveWatch(ctx, s.deps, livev1alpha1.ResourceCounters, o, livefeed.KindCounter, s.showCounter(sc, sel), s.New)
}

func (s *counterStorage) ConvertToTable(_ context.Context, obj runtime.Object, _ runtime.Object) (*metav1.Table, error) {
	return counterTable(obj, s.deps.Clock.Now())
}

// splitCounterName reads resource and level back from a counter name, to narrow the read.
func splitCounterName(name string) (string, lease.Level, bool) {
	for _, l := range lease.Levels {
		sep := "." + string(l)
		for i := 0; i+len(sep) <= len(name); i++ {
			if name[i:i+len(sep)] == sep && (i+len(sep) == len(name) || name[i+len(sep)] == '.') {
				return name[:i], l, true
			}
		}
	}
	return "", "", false
}
