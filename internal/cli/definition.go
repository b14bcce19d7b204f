package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// ClusterSource is a definition.LayerSource over a direct (uncached) client: it lists the
// LeaseDefinitions once, on first use, and filters them in memory. k8ssource.Source needs the
// manager cache's field index, which a direct client does not have. One ClusterSource serves one
// command: the merge then sees one consistent list, and nothing outlives the command. Like the
// manager's source it keeps only the documents whose namespace owns their layer
// (docs/tenancy.md).
type ClusterSource struct {
	reader    client.Reader
	namespace string
	tenants   tenancy.Map

	once  sync.Once
	items []leasev1alpha1.LeaseDefinition
	err   error
}

var (
	_ definition.LayerSource = (*ClusterSource)(nil)
	_ definition.LayerSource = (*recordingSource)(nil)
)

// NewClusterSource returns a source over reader, listing in namespace ("" for all), that
// decides with tenants which namespace may hold which layer.
func NewClusterSource(reader client.Reader, namespace string, tenants tenancy.Map) *ClusterSource {
	return &ClusterSource{reader: reader, namespace: namespace, tenants: tenants}
}

// ClusterTenants reads the tenant namespaces of the cluster once: a tenancy.Static with system
// as the system namespace.
func ClusterTenants(ctx context.Context, reader client.Reader, system string) (tenancy.Static, error) {
	var list corev1.NamespaceList
	if err := reader.List(ctx, &list, client.HasLabels{tenancy.TenantLabel}); err != nil {
		return tenancy.Static{}, fmt.Errorf("listing the tenant namespaces (labelled %s): %w", tenancy.TenantLabel, err)
	}
	m := tenancy.Static{System: system, Tenants: map[string]string{}}
	for _, ns := range list.Items {
		m.Tenants[ns.Name] = ns.Labels[tenancy.TenantLabel]
	}
	return m, nil
}

// Layers returns the documents stored under key, sorted by source.
func (s *ClusterSource) Layers(ctx context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	if err := s.load(ctx); err != nil {
		return nil, err
	}
	var out []definition.Layer
	for i := range s.items {
		if _, _, ok := k8ssource.Permitted(&s.items[i], s.tenants); !ok {
			continue
		}
		if k8ssource.KeyOf(&s.items[i]) == key {
			out = append(out, k8ssource.LayerFrom(&s.items[i]))
		}
	}
	slices.SortFunc(out, func(a, b definition.Layer) int { return strings.Compare(a.Source, b.Source) })
	return out, nil
}

// SystemLayers returns the permitted system-layer documents, sorted by source.
func (s *ClusterSource) SystemLayers(ctx context.Context) ([]definition.Layer, error) {
	if err := s.load(ctx); err != nil {
		return nil, err
	}
	return k8ssource.SystemLayersOf(s.items, s.tenants), nil
}

// load lists the LeaseDefinitions once.
func (s *ClusterSource) load(ctx context.Context) error {
	s.once.Do(func() {
		var list leasev1alpha1.LeaseDefinitionList
		var opts []client.ListOption
		if s.namespace != "" {
			opts = append(opts, client.InNamespace(s.namespace))
		}
		if err := s.reader.List(ctx, &list, opts...); err != nil {
			s.err = fmt.Errorf("listing LeaseDefinitions: %w", err)
			return
		}
		s.items = list.Items
	})
	return s.err
}

// recordingSource remembers the documents a resolution read, for the provenance output.
type recordingSource struct {
	inner definition.LayerSource
	mu    sync.Mutex
	read  []definition.Layer
}

func (r *recordingSource) Layers(ctx context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	docs, err := r.inner.Layers(ctx, key)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.read = append(r.read, docs...)
	return docs, err
}

func (r *recordingSource) SystemLayers(ctx context.Context) ([]definition.Layer, error) {
	return r.inner.SystemLayers(ctx)
}

// Explanation is a merged definition in one scope, with the documents it was merged from.
type Explanation struct {
	// Scope is the lease name and the (tenant, project) of the resolution.
	Scope definition.LayerKey
	// Result is the merge with its provenance.
	Result definition.Result
	// Layers are the documents found, widest first (built-in, system, tenant, project).
	Layers []definition.Layer
}

// Explain merges the definition of name in (tenant, project) from builtins and source
// (nil for none) as an acquisition would, bypassing any cache, and returns it with the
// documents it used.
func Explain(ctx context.Context, builtins *definition.Builtins, source definition.LayerSource, tenant, project, name string) (Explanation, error) {
	rec := &recordingSource{inner: source}
	var src definition.LayerSource
	if source != nil {
		src = rec
	}
	res, err := definition.NewResolver(builtins, src).Explain(ctx, tenant, project, name)
	if err != nil {
		return Explanation{}, err
	}
	ex := Explanation{Scope: definition.LayerKey{Name: name, Tenant: tenant, Project: project}, Result: res}
	if b, err := builtins.Layer(name); err == nil && b != nil {
		ex.Layers = append(ex.Layers, *b)
	}
	ex.Layers = append(ex.Layers, rec.read...)
	return ex, nil
}

// definitionJSON is the -o json answer of definition.
type definitionJSON struct {
	Name       string         `json:"name"`
	Tenant     string         `json:"tenant"`
	Project    string         `json:"project"`
	Resource   string         `json:"resource"`
	Levels     map[string]int `json:"levels"`
	TTLSeconds float64        `json:"ttlSeconds"`
	WaitMs     int64          `json:"waitMs"`
	Fairness   string         `json:"fairness"`
	// MaxPriority and PriorityAgeBoundSeconds: docs/waiting.md, "Priority"; absent while
	// no layer sets them (optionalField).
	MaxPriority             int     `json:"maxPriority,omitempty"`
	PriorityAgeBoundSeconds float64 `json:"priorityAgeBoundSeconds,omitempty"`
	// Borrowing: docs/borrowing.md; absent while off.
	Borrowing *borrowingJSON    `json:"borrowing,omitempty"`
	NoOp      bool              `json:"noop"`
	Origin    map[string]string `json:"origin"`
	Layers    []layerJSON       `json:"layers"`
	Ignored   []ignoredJSON     `json:"ignored"`
}

type borrowingJSON struct {
	MaxBorrowed  int     `json:"maxBorrowed"`
	GraceSeconds float64 `json:"graceSeconds"`
}

type layerJSON struct {
	Kind   string `json:"kind"`
	Source string `json:"source"`
}

type ignoredJSON struct {
	Kind   string   `json:"kind"`
	Source string   `json:"source"`
	Fields []string `json:"fields"`
}

// toDefinitionJSON converts an explanation; origin values are "<kind>: <source>", or
// "default" for a field no layer sets.
func toDefinitionJSON(ex Explanation) definitionJSON {
	d := ex.Result.Definition
	out := definitionJSON{
		Name: ex.Scope.Name, Tenant: ex.Scope.Tenant, Project: ex.Scope.Project,
		Resource: d.Resource, TTLSeconds: d.TTL.Seconds(), WaitMs: d.Wait.Milliseconds(), Fairness: string(d.Fairness), NoOp: d.NoOp(),
		MaxPriority: d.MaxPriority, PriorityAgeBoundSeconds: d.PriorityAgeBound.Seconds(),
		Levels: map[string]int{}, Origin: map[string]string{}, Layers: []layerJSON{}, Ignored: []ignoredJSON{},
	}
	if b := d.Borrowing; b.Enabled {
		out.Borrowing = &borrowingJSON{MaxBorrowed: b.MaxBorrowed, GraceSeconds: b.Grace.Seconds()}
	}
	for _, lv := range []struct {
		name string
		cap  int
	}{{"global", d.Caps.Global}, {"tenant", d.Caps.Tenant}, {"project", d.Caps.Project}, {"user", d.Caps.User}} {
		if lv.cap > 0 {
			out.Levels[lv.name] = lv.cap
		}
	}
	kinds := kindsBySource(ex.Layers)
	for _, f := range definition.AllFields() {
		if src, ok := ex.Result.Origin[f]; ok {
			out.Origin[string(f)] = string(kinds[src]) + ": " + src
		} else if !optionalField[f] {
			out.Origin[string(f)] = "default"
		}
	}
	for _, l := range ex.Layers {
		out.Layers = append(out.Layers, layerJSON{Kind: string(l.Kind), Source: l.Source})
	}
	for _, ig := range ex.Result.Ignored {
		fields := make([]string, 0, len(ig.Fields))
		for _, f := range ig.Fields {
			fields = append(fields, string(f))
		}
		out.Ignored = append(out.Ignored, ignoredJSON{Kind: string(ig.Kind), Source: ig.Source, Fields: fields})
	}
	return out
}

// optionalField marks the fields the explanation shows only when a layer sets them: the
// priorities (docs/waiting.md, "Priority") and borrowing (docs/borrowing.md), which most
// definitions never use.
var optionalField = map[definition.Field]bool{
	definition.FieldMaxPriority: true, definition.FieldPriorityAge: true,
	definition.FieldBorrowEnabled: true, definition.FieldBorrowMax: true, definition.FieldBorrowGrace: true,
}

func kindsBySource(layers []definition.Layer) map[string]definition.Kind {
	m := make(map[string]definition.Kind, len(layers))
	for _, l := range layers {
		m[l.Source] = l.Kind
	}
	return m
}

// RenderExplanation writes the merged definition with the layer each field came from, the
// layers found and the ignored fields.
func RenderExplanation(w io.Writer, ex Explanation) error {
	d := ex.Result.Definition
	scope := ex.Scope.Tenant + "/" + ex.Scope.Project
	switch definition.KindOf(ex.Scope.Tenant, ex.Scope.Project) {
	case definition.KindSystem:
		scope += " (the system scope: built-in and system layers only)"
	case definition.KindTenant:
		scope += " (tenant-wide: no project layer)"
	}
	p := newPrinter(w)
	p.printf("Lease %s in %s, as an acquisition sees it (read now, no cache):\n", ex.Scope.Name, scope)
	if d.NoOp() {
		p.println("NOOP: no level is capped; an acquisition succeeds without touching the store.")
	}
	p.println()

	kinds := kindsBySource(ex.Layers)
	from := func(f definition.Field, def string) string {
		src, ok := ex.Result.Origin[f]
		if !ok {
			return def
		}
		return string(kinds[src]) + ": " + src
	}
	capValue := func(c int) string {
		if c == 0 {
			return "-"
		}
		return strconv.Itoa(c)
	}
	var ft strings.Builder
	t := newTable(&ft, "FIELD", "VALUE", "FROM")
	t.row(string(definition.FieldResource), d.Resource, from(definition.FieldResource, "default (the lease name)"))
	t.row(string(definition.FieldLevelsGlobal), capValue(d.Caps.Global), from(definition.FieldLevelsGlobal, "not capped"))
	t.row(string(definition.FieldLevelsTenant), capValue(d.Caps.Tenant), from(definition.FieldLevelsTenant, "not capped"))
	t.row(string(definition.FieldLevelsProject), capValue(d.Caps.Project), from(definition.FieldLevelsProject, "not capped"))
	t.row(string(definition.FieldLevelsUser), capValue(d.Caps.User), from(definition.FieldLevelsUser, "not capped"))
	t.row(string(definition.FieldTTLSeconds), strconv.FormatFloat(d.TTL.Seconds(), 'f', -1, 64), from(definition.FieldTTLSeconds, "default"))
	t.row(string(definition.FieldWaitMs), strconv.FormatInt(d.Wait.Milliseconds(), 10), from(definition.FieldWaitMs, "default"))
	t.row(string(definition.FieldFairness), string(d.Fairness), from(definition.FieldFairness, "default"))
	if _, ok := ex.Result.Origin[definition.FieldMaxPriority]; ok {
		t.row(string(definition.FieldMaxPriority), strconv.Itoa(d.MaxPriority), from(definition.FieldMaxPriority, "default"))
	}
	if _, ok := ex.Result.Origin[definition.FieldPriorityAge]; ok {
		t.row(string(definition.FieldPriorityAge), strconv.FormatFloat(d.PriorityAgeBound.Seconds(), 'f', -1, 64), from(definition.FieldPriorityAge, "default"))
	}
	if _, ok := ex.Result.Origin[definition.FieldBorrowEnabled]; ok {
		t.row(string(definition.FieldBorrowEnabled), strconv.FormatBool(d.Borrowing.Enabled), from(definition.FieldBorrowEnabled, "default"))
		if d.Borrowing.Enabled {
			t.row(string(definition.FieldBorrowMax), strconv.Itoa(d.Borrowing.MaxBorrowed), from(definition.FieldBorrowMax, "default"))
			t.row(string(definition.FieldBorrowGrace), strconv.FormatFloat(d.Borrowing.Grace.Seconds(), 'f', -1, 64), from(definition.FieldBorrowGrace, "default"))
		}
	}
	if err := t.flush(); err != nil {
		return err
	}
	p.print(ft.String())

	p.println("\nLayers (widest first):")
	found := map[definition.Kind]string{}
	for _, l := range ex.Layers {
		found[l.Kind] = l.Source
	}
	var lt strings.Builder
	tt := newTable(&lt, "LAYER", "DOCUMENT")
	for _, k := range layerKinds(ex.Scope) {
		src, ok := found[k]
		if !ok {
			src = "none"
		}
		tt.row(string(k), src)
	}
	if err := tt.flush(); err != nil {
		return err
	}
	p.print(indented(lt.String()))

	if len(ex.Result.Ignored) == 0 {
		p.println("\nIgnored fields: none")
		return p.done()
	}
	p.println("\nIgnored fields (set on a layer that does not own them):")
	for _, ig := range ex.Result.Ignored {
		fields := make([]string, 0, len(ig.Fields))
		for _, f := range ig.Fields {
			fields = append(fields, string(f))
		}
		p.printf("  %s: %s: %s\n", ig.Kind, ig.Source, strings.Join(fields, ", "))
	}
	return p.done()
}

// layerKinds are the layers that apply to a scope, widest first.
func layerKinds(scope definition.LayerKey) []definition.Kind {
	kinds := []definition.Kind{definition.KindBuiltin}
	for _, k := range definition.ScopeKeys(scope.Tenant, scope.Project, scope.Name) {
		kinds = append(kinds, k.Kind())
	}
	return kinds
}

// kubeFlags are the flags that locate the cluster (global flags of the plugin).
type kubeFlags struct {
	kubeconfig string
	context    string
}

// kubeClient returns a direct (uncached) client for LeaseDefinitions.
func (o *options) kubeClient() (client.Client, string, error) {
	cfg, err := o.restConfig()
	if err != nil {
		return nil, "", err
	}
	scheme := runtime.NewScheme()
	if err := leasev1alpha1.AddToScheme(scheme); err != nil {
		return nil, "", fmt.Errorf("building the scheme: %w", err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		return nil, "", fmt.Errorf("building the scheme: %w", err)
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, "", fmt.Errorf("creating the cluster client for %s: %w", cfg.Host, err)
	}
	return c, cfg.Host, nil
}

func newDefinitionCommand(o *options) *cobra.Command {
	var (
		tenant, project string
		namespace       string
		systemNamespace string
		defaultsDir     string
		out             outputFlag
	)
	c := &cobra.Command{
		Use:   "definition NAME --tenant TENANT [--project PROJECT]",
		Short: "Show the merged definition of a lease in a scope, with the layer each field came from",
		Long: `Merge the definition of lease NAME for an acquisition in TENANT/PROJECT, field by field, as the
manager would: the built-in layer (compiled in, plus --defaults-dir), then the system, tenant and
project LeaseDefinitions read now from the cluster, without any cache. Shows for each field the
layer it came from, the documents found, and the fields a layer set but does not own (ignored).

--project defaults to _tenant, the tenant-wide scope; --tenant _vance with --project _tenant is
the system scope. If the manager runs with --defaults-dir, pass the same directory, otherwise the
built-in layer here is the compiled-in one only. If the manager watches only some namespaces
(--namespaces), restrict to them with --definitions-namespace. Documents outside the namespace
that owns their layer count for nothing, as in the manager: pass the manager's
--system-namespace (docs/tenancy.md).`,
		Example: `  kubectl lease definition tex --tenant acme --project website
  kubectl lease definition browser --tenant acme -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := out.validate(); err != nil {
				return err
			}
			name := args[0]
			if tenant == "" {
				return &usageError{command: cmd.CommandPath(), err: errors.New("--tenant is required")}
			}
			var defaults fs.FS
			if defaultsDir != "" {
				defaults = os.DirFS(defaultsDir)
			}
			builtins, err := definition.LoadBuiltins(defaults)
			if err != nil {
				return fmt.Errorf("loading the built-in definitions: %w", err)
			}
			warn := newPrinter(o.streams.ErrOut)
			for _, p := range builtins.Problems() {
				warn.printf("Warning: broken built-in definition (its lease is unavailable everywhere): %v\n", p)
			}
			if err := warn.done(); err != nil {
				return err
			}
			kc, host, err := o.kubeClient()
			if err != nil {
				return err
			}
			ctx, cancel := o.withTimeout(cmd.Context())
			defer cancel()
			tenants, err := ClusterTenants(ctx, kc, systemNamespace)
			if err != nil {
				return err
			}
			ex, err := Explain(ctx, builtins, NewClusterSource(kc, namespace, tenants), tenant, project, name)
			if err != nil {
				return explainError(err, name, tenant, project, host)
			}
			if out.json() {
				return writeJSON(o.streams.Out, toDefinitionJSON(ex))
			}
			return RenderExplanation(o.streams.Out, ex)
		},
	}
	c.Flags().StringVar(&tenant, "tenant", "", "tenant of the acquisition (required; _vance for the system scope)")
	c.Flags().StringVar(&project, "project", definition.TenantProject, "project of the acquisition (_tenant: the tenant-wide scope)")
	c.Flags().StringVar(&namespace, "definitions-namespace", "", "read LeaseDefinitions only from this namespace (default: all, as the manager does)")
	c.Flags().StringVar(&systemNamespace, "system-namespace", o.env(settings.EnvSystemNamespace, "lease-system"),
		"the manager's system namespace, the only one whose system-layer documents count (env "+settings.EnvSystemNamespace+")")
	c.Flags().StringVar(&defaultsDir, "defaults-dir", "", "directory of extra built-in definitions <name>.yaml, as the manager's --defaults-dir")
	out.bind(c)
	return c
}

// explainError says what a failed resolution means for acquisitions.
func explainError(err error, name, tenant, project, host string) error {
	switch {
	case errors.Is(err, lease.ErrInvalid):
		return err
	case errors.Is(err, definition.ErrLayerRead):
		return fmt.Errorf("cannot read the LeaseDefinitions from the cluster %s: %w; check --kubeconfig/--context and that you may list leasedefinitions.lease.vancetope.io", host, err)
	case errors.Is(err, lease.ErrUnavailable):
		return fmt.Errorf("%w\nAcquisitions of %s in %s/%s answer LEASE_UNAVAILABLE until this is fixed (fail closed)", err, name, tenant, project)
	}
	return err
}
