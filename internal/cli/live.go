package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/runtime/serializer"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// The live API (docs/live-api.md) is how the plugin reads and acts: with the kubeconfig's
// credentials, through the kube-apiserver, within what RBAC grants. --force is the
// break-glass path straight to MongoDB.

var (
	liveScheme = runtime.NewScheme()
	liveCodecs = serializer.NewCodecFactory(liveScheme)
	liveParams = runtime.NewParameterCodec(liveScheme)
)

func init() {
	utilruntime.Must(livev1alpha1.AddToScheme(liveScheme))
	metav1.AddToGroupVersion(liveScheme, schema.GroupVersion{Version: "v1"})
}

// Defaults of the live API flags.
const (
	// EnvSystemNamespace names the manager's system namespace, where the operator's actions
	// are created.
	EnvSystemNamespace     = "LEASE_SYSTEM_NAMESPACE"
	DefaultSystemNamespace = "lease-operator-system"
	// listPage is the page size of the plugin's lists.
	listPage = 500
)

// liveClient calls the live API.
type liveClient struct {
	rc   *rest.RESTClient
	host string
	// namespace is -n; empty means all namespaces.
	namespace string
	// contextNamespace is the namespace the kubeconfig's context names, if it names one:
	// where a user refused cluster-wide reads instead.
	contextNamespace string
	// system is the manager's system namespace, where the actions are created, as given by
	// --system-namespace or $LEASE_SYSTEM_NAMESPACE; empty: found on first use
	// (systemNamespace).
	system string
	// systemFrom says where system came from, for error messages.
	systemFrom string
}

// clientConfig loads the kubeconfig: --kubeconfig, else $KUBECONFIG, else ~/.kube/config.
func (o *options) clientConfig() clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	if o.kube.kubeconfig != "" {
		rules.ExplicitPath = o.kube.kubeconfig
	} else if env := o.getenv(clientcmd.RecommendedConfigPathEnvVar); env != "" {
		rules.Precedence = strings.Split(env, ":")
	}
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{CurrentContext: o.kube.context})
}

func (o *options) restConfig() (*rest.Config, error) {
	cfg, err := o.clientConfig().ClientConfig()
	if err != nil {
		return nil, fmt.Errorf("loading the kubeconfig: %w (or --force to read MongoDB directly)", err)
	}
	cfg.UserAgent = "kubectl-lease"
	return cfg, nil
}

func (o *options) live() (*liveClient, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, err
	}
	cfg = rest.CopyConfig(cfg)
	cfg.GroupVersion = &livev1alpha1.GroupVersion
	cfg.APIPath = "/apis"
	cfg.NegotiatedSerializer = liveCodecs.WithoutConversion()
	rc, err := rest.RESTClientFor(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating the client for %s: %w", cfg.Host, err)
	}
	c := &liveClient{rc: rc, host: cfg.Host, namespace: o.namespace}
	switch {
	case o.systemNamespace != "":
		c.system, c.systemFrom = o.systemNamespace, "--system-namespace"
	case o.getenv(EnvSystemNamespace) != "":
		c.system, c.systemFrom = o.getenv(EnvSystemNamespace), "$"+EnvSystemNamespace
	}
	if raw, err := o.clientConfig().RawConfig(); err == nil {
		name := o.kube.context
		if name == "" {
			name = raw.CurrentContext
		}
		if ctx, ok := raw.Contexts[name]; ok {
			c.contextNamespace = ctx.Namespace
		}
	}
	return c, nil
}

// wrap explains a failed call: what the user can do about it.
func (c *liveClient) wrap(op string, err error) error {
	var status apierrors.APIStatus
	switch {
	case apierrors.IsForbidden(err) && c.namespace == "":
		return fmt.Errorf("%s: %w (RBAC grants you less than every namespace: try -n NAMESPACE)", op, err)
	case apierrors.IsNotFound(err) && errors.As(err, &status) && status.Status().Details != nil && status.Status().Details.Name == "":
		return fmt.Errorf("%s: the live API %s is not served by %s (is the manager running and `kubectl get apiservice v1alpha1.%s` Available?): %w; --force reads MongoDB directly",
			op, livev1alpha1.GroupVersion, c.host, livev1alpha1.GroupName, err)
	case apierrors.IsServiceUnavailable(err) || apierrors.IsInternalError(err) || errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w; if no manager answers, --force acts directly in MongoDB (no handler runs)", op, err)
	}
	return fmt.Errorf("%s: %w", op, err)
}

// narrowOnForbidden moves a read refused across all namespaces to the kubeconfig context's
// namespace, as kubectl reads there by default; it reports whether to retry.
func (c *liveClient) narrowOnForbidden(err error) bool {
	if c.namespace == "" && c.contextNamespace != "" && apierrors.IsForbidden(err) {
		c.namespace = c.contextNamespace
		return true
	}
	return false
}

// holderSelectors turns the plugin's holder filter into selectors.
func holderSelectors(f leasestore.HolderFilter) (labelSel, fieldSel string) {
	var labels []string
	for _, l := range []struct{ key, v string }{
		{livev1alpha1.LabelResource, f.Resource}, {livev1alpha1.LabelType, f.Type},
	} {
		if l.v != "" {
			labels = append(labels, l.key+"="+l.v)
		}
	}
	fs := fields.Set{}
	for k, v := range map[string]string{"metadata.name": f.ID, "spec.tenant": f.Tenant, "spec.pod": f.Pod,
		"spec.project": f.Project, "spec.user": f.User} {
		if v != "" {
			fs[k] = v
		}
	}
	return strings.Join(labels, ","), fields.SelectorFromSet(fs).String()
}

// listHolders reads every page of the holders matching f in the client's namespace.
func (c *liveClient) listHolders(ctx context.Context, f leasestore.HolderFilter) ([]livev1alpha1.LeaseHolder, error) {
	hs, _, err := c.listHoldersAt(ctx, f)
	return hs, err
}

// listHoldersAt is listHolders with the resourceVersion of its first page, from which a
// watch misses nothing the pages did not show.
func (c *liveClient) listHoldersAt(ctx context.Context, f leasestore.HolderFilter) ([]livev1alpha1.LeaseHolder, string, error) {
	labelSel, fieldSel := holderSelectors(f)
	opts := metav1.ListOptions{LabelSelector: labelSel, FieldSelector: fieldSel, Limit: listPage}
	var out []livev1alpha1.LeaseHolder
	rv := ""
	for {
		var list livev1alpha1.LeaseHolderList
		err := c.rc.Get().Namespace(c.namespace).Resource(livev1alpha1.ResourceHolders).
			VersionedParams(&opts, liveParams).Do(ctx).Into(&list)
		if err != nil && len(out) == 0 && c.narrowOnForbidden(err) {
			continue
		}
		if err != nil {
			return nil, "", c.wrap("listing holders", err)
		}
		if rv == "" {
			rv = list.ResourceVersion
		}
		out = append(out, list.Items...)
		if list.Continue == "" {
			return out, rv, nil
		}
		opts.Continue = list.Continue
	}
}

// watchHolders follows the holders matching f in the client's namespace from resource version
// rv, calling on with each change, until ctx ends, on fails, or the watch can no longer resume
// (the error then says so: apierrors.IsResourceExpired). It returns the last version seen.
func (c *liveClient) watchHolders(ctx context.Context, f leasestore.HolderFilter, rv string,
	on func(watch.EventType, livev1alpha1.LeaseHolder) error) (string, error) {
	labelSel, fieldSel := holderSelectors(f)
	opts := metav1.ListOptions{LabelSelector: labelSel, FieldSelector: fieldSel, ResourceVersion: rv,
		AllowWatchBookmarks: true, Watch: true}
	w, err := c.rc.Get().Namespace(c.namespace).Resource(livev1alpha1.ResourceHolders).
		VersionedParams(&opts, liveParams).Watch(ctx)
	if err != nil {
		return rv, c.wrap("watching holders", err)
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return rv, nil
		case e, ok := <-w.ResultChan():
			if !ok {
				return rv, nil // the server ended the watch (its timeout): resume from rv
			}
			switch e.Type {
			case watch.Error:
				return rv, c.wrap("watching holders", apierrors.FromObject(e.Object))
			case watch.Bookmark:
				if h, ok := e.Object.(*livev1alpha1.LeaseHolder); ok {
					rv = h.ResourceVersion
				}
			case watch.Added, watch.Modified, watch.Deleted:
				h, ok := e.Object.(*livev1alpha1.LeaseHolder)
				if !ok {
					return rv, fmt.Errorf("watching holders: unexpected %T", e.Object)
				}
				rv = h.ResourceVersion
				if err := on(e.Type, *h); err != nil {
					return rv, err
				}
			}
		}
	}
}

// findHolder finds the holder with public ID id (in the client's namespace, or any); with a
// tenant, only that tenant's. The first namespace it appears in is the one to act in.
func (c *liveClient) findHolder(ctx context.Context, id, tenant string) (livev1alpha1.LeaseHolder, error) {
	hs, err := c.listHolders(ctx, leasestore.HolderFilter{ID: id, Tenant: tenant})
	if err != nil {
		return livev1alpha1.LeaseHolder{}, err
	}
	if len(hs) == 0 {
		msg := "no holder " + id
		if tenant != "" {
			msg += " in tenant " + tenant
		}
		if c.namespace != "" {
			msg += " in namespace " + c.namespace
		}
		return livev1alpha1.LeaseHolder{}, errors.New(msg + " (released, reaped or revoked already?)")
	}
	return hs[0], nil
}

func (c *liveClient) listCounters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error) {
	var labels []string
	if f.Resource != "" {
		labels = append(labels, livev1alpha1.LabelResource+"="+f.Resource)
	}
	if f.Level != "" {
		labels = append(labels, livev1alpha1.LabelLevel+"="+string(f.Level))
	}
	// The tenant goes to the server as a field selector, so that it reads that tenant's
	// counters and holders alone rather than every one of them.
	opts := metav1.ListOptions{LabelSelector: strings.Join(labels, ",")}
	if f.Tenant != "" {
		opts.FieldSelector = fields.OneTermEqualSelector(livev1alpha1.FieldCounterTenant, f.Tenant).String()
	}
	var list livev1alpha1.LeaseCounterList
	get := func() error {
		return c.rc.Get().Namespace(c.namespace).Resource(livev1alpha1.ResourceCounters).
			VersionedParams(&opts, liveParams).Do(ctx).Into(&list)
	}
	err := get()
	if err != nil && c.narrowOnForbidden(err) {
		err = get()
	}
	if err != nil {
		return nil, c.wrap("listing counters", err)
	}
	// A counter appears once per namespace of its tenant: show each once.
	seen := map[string]bool{}
	var out []lease.Counter
	for _, lc := range list.Items {
		if seen[lc.Key] || (f.Tenant != "" && (lc.Level == string(lease.LevelGlobal) || strings.SplitN(lc.Scope, "/", 2)[0] != f.Tenant)) {
			continue
		}
		seen[lc.Key] = true
		out = append(out, lease.Counter{Key: lc.Key, Resource: lc.Resource, Level: lease.Level(lc.Level), Scope: lc.Scope,
			Count: int(lc.Count), Booked: int(lc.Booked), Holders: lc.Holders, Gone: lc.Gone, Waiting: int(lc.Waiting), Borrowed: int(lc.Borrowed), UpdatedAt: lc.UpdatedAt.Time})
	}
	return out, nil
}

// revoke deletes the holder in its namespace: the server revokes it with the namespace's
// tenant bound and runs its handler.
func (c *liveClient) revoke(ctx context.Context, h livev1alpha1.LeaseHolder) (livev1alpha1.LeaseHolder, error) {
	var gone livev1alpha1.LeaseHolder
	err := c.rc.Delete().Namespace(h.Namespace).Resource(livev1alpha1.ResourceHolders).Name(h.Name).Do(ctx).Into(&gone)
	if err != nil {
		return gone, c.wrap("revoking holder "+h.Name, err)
	}
	return gone, nil
}

// liveAPIService is the name of the live API's APIService.
var liveAPIService = livev1alpha1.GroupVersion.Version + "." + livev1alpha1.GroupVersion.Group

// systemNamespace returns the manager's system namespace: --system-namespace, else
// $LEASE_SYSTEM_NAMESPACE, else the namespace of the live API's Service, which the manager
// serves from its own namespace (the system namespace unless the manager's
// --system-namespace says otherwise; the server then refuses and names it), else
// DefaultSystemNamespace. Reading the APIService needs `get apiservices`, which cluster
// administrators and the live-operator role have.
func (c *liveClient) systemNamespace(ctx context.Context) string {
	if c.system != "" {
		return c.system
	}
	var svc struct {
		Spec struct {
			Service *struct {
				Namespace string `json:"namespace"`
			} `json:"service"`
		} `json:"spec"`
	}
	raw, err := c.rc.Get().AbsPath("/apis/apiregistration.k8s.io/v1/apiservices", liveAPIService).DoRaw(ctx)
	if err == nil {
		err = json.Unmarshal(raw, &svc)
	}
	switch {
	case err == nil && svc.Spec.Service != nil && svc.Spec.Service.Namespace != "":
		c.system = svc.Spec.Service.Namespace
		c.systemFrom = "the namespace of the live API's Service (APIService " + liveAPIService + ")"
	case err == nil:
		c.system = DefaultSystemNamespace
		c.systemFrom = "the default: neither --system-namespace nor $" + EnvSystemNamespace + " is set, and the APIService " + liveAPIService + " names no Service"
	default:
		c.system = DefaultSystemNamespace
		c.systemFrom = fmt.Sprintf("the default: neither --system-namespace nor $%s is set, and the APIService %s could not be read (%v)",
			EnvSystemNamespace, liveAPIService, err)
	}
	return c.system
}

// create runs one of the operator's actions in the system namespace.
func (c *liveClient) create(ctx context.Context, resource string, obj, into runtime.Object) error {
	ns := c.systemNamespace(ctx)
	err := c.rc.Post().Namespace(ns).Resource(resource).Body(obj).Do(ctx).Into(into)
	if err == nil {
		return nil
	}
	op := "creating " + resource + " in " + ns
	if !apierrors.IsForbidden(err) {
		return c.wrap(op, err)
	}
	// Actions go to one namespace: -n does not apply, and "less than every namespace" is
	// beside the point. Either the namespace is not the manager's system namespace (the
	// live API refused, and its message names the right one) or RBAC refused.
	var status apierrors.APIStatus
	if errors.As(err, &status) && strings.Contains(status.Status().Message, " are created in the system namespace ") {
		return fmt.Errorf("%s: %w; %s is not the manager's system namespace (it came from %s): pass --system-namespace NAMESPACE or set %s=NAMESPACE to the namespace named above",
			op, err, ns, c.systemFrom, EnvSystemNamespace)
	}
	return fmt.Errorf("%s: %w; RBAC does not let you create %s in namespace %s (the live-operator ClusterRole grants it, docs/live-api.md); %s came from %s: if the manager's system namespace is another, pass --system-namespace or set %s",
		op, err, resource, ns, ns, c.systemFrom, EnvSystemNamespace)
}

// holderOf reads a holder object back into the domain type the renderers print.
func holderOf(o livev1alpha1.LeaseHolder) lease.Holder {
	ns, name, _ := strings.Cut(o.Spec.Pod, "/")
	h := lease.Holder{
		ID: o.Name, State: lease.HolderState(o.Status.State), LeaseName: o.Spec.Lease, Resource: o.Spec.Resource,
		Type: o.Spec.Type, Tenant: o.Spec.Tenant, Project: o.Spec.Project, User: o.Spec.User, HolderRef: o.Spec.HolderRef,
		Pod:      lease.PodRef{Namespace: ns, Name: name, UID: o.Spec.PodUID},
		PodBound: o.Spec.PodBound, Payload: o.Spec.Payload, TTL: time.Duration(o.Spec.TTLSeconds) * time.Second,
		Levels: o.Status.Levels, AcquiredAt: o.Status.AcquiredAt.Time, LastSeenAt: o.Status.LastSeenAt.Time, Fence: o.Status.Fence,
	}
	setParts(&h, o.Spec.Parts, o.Status.Parts)
	return h
}

// setParts gives a holder read from an object of several resources its parts, and the first
// part's lease name and resource as the store's holder has them (the object's spec joins
// them all).
func setParts(h *lease.Holder, spec []livev1alpha1.LeasePart, status []livev1alpha1.LeasePartStatus) {
	if len(spec) == 0 {
		return
	}
	fences := make(map[string]int64, len(status))
	for _, p := range status {
		fences[p.Resource] = p.Fence
	}
	h.Parts = make([]lease.Part, len(spec))
	for i, p := range spec {
		h.Parts[i] = lease.Part{LeaseName: p.Lease, Resource: p.Resource, Fence: fences[p.Resource]}
	}
	h.LeaseName, h.Resource = spec[0].Lease, spec[0].Resource
}

func holdersOf(os []livev1alpha1.LeaseHolder) []lease.Holder {
	seen := map[string]bool{}
	var out []lease.Holder
	for _, o := range os {
		// A holder appears once per namespace of its tenant: show it once.
		if !seen[o.Name] {
			seen[o.Name] = true
			out = append(out, holderOf(o))
		}
	}
	return out
}

// reader is where list, show and counters read: the live API, or MongoDB with --force.
type reader interface {
	holders(ctx context.Context, f leasestore.HolderFilter) ([]lease.Holder, error)
	holder(ctx context.Context, id string) (lease.Holder, error)
	counters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error)
	waiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error)
	// now is the time ages are measured against.
	now(ctx context.Context) (time.Time, error)
	// where names what was read, for "nothing found" messages.
	where() string
	close()
}

// reader opens the live API, or with force the store.
// openReader opens the reader of a read command (the live API, or with force the store) under
// the command's timeout; done closes both.
func (o *options) openReader(ctx context.Context, force bool) (context.Context, reader, func(), error) {
	ctx, cancel := o.withTimeout(ctx)
	r, err := o.reader(force)
	if err != nil {
		cancel()
		return nil, nil, nil, err
	}
	return ctx, r, func() { r.close(); cancel() }, nil
}

func (o *options) reader(force bool) (reader, error) {
	if force {
		s, err := o.openStore()
		if err != nil {
			return nil, err
		}
		return storeReader{s}, nil
	}
	c, err := o.live()
	if err != nil {
		return nil, err
	}
	return liveReader{c}, nil
}

type liveReader struct{ c *liveClient }

func (r liveReader) holders(ctx context.Context, f leasestore.HolderFilter) ([]lease.Holder, error) {
	os, err := r.c.listHolders(ctx, f)
	return holdersOf(os), err
}

func (r liveReader) holder(ctx context.Context, id string) (lease.Holder, error) {
	o, err := r.c.findHolder(ctx, id, "")
	if err != nil {
		return lease.Holder{}, err
	}
	return holderOf(o), nil
}

func (r liveReader) counters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error) {
	return r.c.listCounters(ctx, f)
}

func (r liveReader) waiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error) {
	return r.c.listWaiters(ctx, f)
}

func (r liveReader) now(context.Context) (time.Time, error) { return time.Now(), nil }

func (r liveReader) where() string {
	if r.c.namespace != "" {
		return "namespace " + r.c.namespace
	}
	return "the namespaces you may list"
}

func (r liveReader) close() {}

type storeReader struct{ s *store }

func (r storeReader) holders(ctx context.Context, f leasestore.HolderFilter) ([]lease.Holder, error) {
	hs, err := r.s.ListHolders(ctx, f)
	if err != nil {
		return nil, r.s.wrap("listing holders", err)
	}
	return hs, nil
}

func (r storeReader) holder(ctx context.Context, id string) (lease.Holder, error) {
	h, err := r.s.GetHolderByID(ctx, id)
	if errors.Is(err, lease.ErrLost) {
		return h, fmt.Errorf("no holder %s in database %s (released, reaped or revoked?)", id, r.s.db)
	}
	if err != nil {
		return h, r.s.wrap("reading holder "+id, err)
	}
	return h, nil
}

func (r storeReader) counters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error) {
	cs, err := r.s.ListCounters(ctx, f)
	if err != nil {
		return nil, r.s.wrap("listing counters", err)
	}
	return cs, nil
}

func (r storeReader) waiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error) {
	ws, err := r.s.ListWaiters(ctx, f)
	if err != nil {
		return nil, r.s.wrap("listing waiters", err)
	}
	return ws, nil
}

func (r storeReader) now(ctx context.Context) (time.Time, error) {
	t, err := r.s.ServerTime(ctx)
	if err != nil {
		return t, r.s.wrap("reading the server time", err)
	}
	return t, nil
}

func (r storeReader) where() string { return "database " + r.s.db }
func (r storeReader) close()        { r.s.close() }
