package cli_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/cli"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/envtestbin"
)

// memSource is an in-memory LayerSource.
type memSource map[definition.LayerKey][]definition.Layer

func (m memSource) Layers(_ context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	return m[key], nil
}

func (m memSource) SystemLayers(context.Context) ([]definition.Layer, error) {
	var out []definition.Layer
	for k, docs := range m {
		if k.Kind() == definition.KindSystem {
			out = append(out, docs...)
		}
	}
	return out, nil
}

type failingSource struct{ err error }

func (f failingSource) SystemLayers(context.Context) ([]definition.Layer, error) {
	return nil, f.err
}

func (f failingSource) Layers(context.Context, definition.LayerKey) ([]definition.Layer, error) {
	return nil, f.err
}

func layer(kind definition.Kind, source, tenant, project string, mod func(*definition.Layer)) definition.Layer {
	l := definition.Layer{Kind: kind, Source: source, Name: "tex", Tenant: tenant, Project: project}
	mod(&l)
	return l
}

func add(src memSource, ls ...definition.Layer) memSource {
	for _, l := range ls {
		k := definition.LayerKey{Name: l.Name, Tenant: l.Tenant, Project: l.Project}
		src[k] = append(src[k], l)
	}
	return src
}

var (
	systemTex = layer(definition.KindSystem, "LeaseDefinition lease-system/tex", "_vance", "_tenant", func(l *definition.Layer) {
		l.Levels.Global = ptr.To[int32](8)
		l.WaitMs = ptr.To[int32](5000)
	})
	tenantTex = layer(definition.KindTenant, "LeaseDefinition acme/tex-acme", "acme", "_tenant", func(l *definition.Layer) {
		l.Levels.Tenant = ptr.To[int32](2)
		l.Levels.Global = ptr.To[int32](100) // not owned: ignored
	})
	projectTex = layer(definition.KindProject, "LeaseDefinition acme/tex-website", "acme", "website", func(l *definition.Layer) {
		l.Levels.Project = ptr.To[int32](1)
		l.TTLSeconds = ptr.To[int32](300)
		l.Resource = ptr.To("mine")        // not owned: ignored
		l.Levels.Tenant = ptr.To[int32](9) // not owned: ignored
	})
)

func TestRenderExplanation(t *testing.T) {
	builtins, err := definition.LoadBuiltins(fstest.MapFS{
		"pool.yaml": {Data: []byte("name: pool\nlevels: {user: 1}\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name                   string
		source                 definition.LayerSource
		lease, tenant, project string
		want                   string
		wantErr                error
	}{
		{
			name:   "all four layers, with ignored fields",
			source: add(memSource{}, systemTex, tenantTex, projectTex),
			lease:  "tex", tenant: "acme", project: "website",
			want: `Lease tex in acme/website, as an acquisition sees it (read now, no cache):

FIELD            VALUE     FROM
resource         tex       default (the lease name)
levels.global    8         system: LeaseDefinition lease-system/tex
levels.tenant    2         tenant: LeaseDefinition acme/tex-acme
levels.project   1         project: LeaseDefinition acme/tex-website
levels.user      -         not capped
ttlSeconds       300       project: LeaseDefinition acme/tex-website
waitMs           5000      system: LeaseDefinition lease-system/tex
fairness         process   default

Layers (widest first):
  LAYER     DOCUMENT
  builtin   built-in tex.yaml
  system    LeaseDefinition lease-system/tex
  tenant    LeaseDefinition acme/tex-acme
  project   LeaseDefinition acme/tex-website

Ignored fields (set on a layer that does not own them):
  tenant: LeaseDefinition acme/tex-acme: levels.global
  project: LeaseDefinition acme/tex-website: resource, levels.tenant
`,
		},
		{
			name:   "built-in only, tenant-wide scope",
			source: memSource{},
			lease:  "tex", tenant: "acme", project: "_tenant",
			want: `Lease tex in acme/_tenant (tenant-wide: no project layer), as an acquisition sees it (read now, no cache):

FIELD            VALUE     FROM
resource         tex       default (the lease name)
levels.global    6         builtin: built-in tex.yaml
levels.tenant    3         builtin: built-in tex.yaml
levels.project   1         builtin: built-in tex.yaml
levels.user      -         not capped
ttlSeconds       120       builtin: built-in tex.yaml
waitMs           10000     builtin: built-in tex.yaml
fairness         process   default

Layers (widest first):
  LAYER     DOCUMENT
  builtin   built-in tex.yaml
  system    none
  tenant    none

Ignored fields: none
`,
		},
		{
			name:   "a lease nobody defines is a NOOP",
			source: nil,
			lease:  "nosuch", tenant: "_vance", project: "_tenant",
			want: `Lease nosuch in _vance/_tenant (the system scope: built-in and system layers only), as an acquisition sees it (read now, no cache):
NOOP: no level is capped; an acquisition succeeds without touching the store.

FIELD            VALUE     FROM
resource         nosuch    default (the lease name)
levels.global    -         not capped
levels.tenant    -         not capped
levels.project   -         not capped
levels.user      -         not capped
ttlSeconds       120       default
waitMs           10000     default
fairness         process   default

Layers (widest first):
  LAYER     DOCUMENT
  builtin   none
  system    none

Ignored fields: none
`,
		},
		{
			name:   "defaults-dir built-in",
			source: memSource{},
			lease:  "pool", tenant: "acme", project: "p",
			want: `Lease pool in acme/p, as an acquisition sees it (read now, no cache):

FIELD            VALUE     FROM
resource         pool      default (the lease name)
levels.global    -         not capped
levels.tenant    -         not capped
levels.project   -         not capped
levels.user      1         builtin: defaults-dir pool.yaml
ttlSeconds       120       default
waitMs           10000     default
fairness         process   default

Layers (widest first):
  LAYER     DOCUMENT
  builtin   defaults-dir pool.yaml
  system    none
  tenant    none
  project   none

Ignored fields: none
`,
		},
		{
			name: "two documents for one scope fail closed",
			source: add(memSource{}, tenantTex,
				layer(definition.KindTenant, "LeaseDefinition other/tex-acme-2", "acme", "_tenant", func(l *definition.Layer) {})),
			lease: "tex", tenant: "acme", project: "website",
			wantErr: definition.ErrConflict,
		},
		{
			name:   "unreadable layers fail closed",
			source: failingSource{err: errors.New("connection refused")},
			lease:  "tex", tenant: "acme", project: "website",
			wantErr: definition.ErrLayerRead,
		},
		{
			name:   "bad scope",
			source: memSource{},
			lease:  "tex", tenant: "ac/me", project: "website",
			wantErr: lease.ErrInvalid,
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ex, err := cli.Explain(context.Background(), builtins, tc.source, tc.tenant, tc.project, tc.lease)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) {
					t.Fatalf("Explain = %v, want %v", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Explain: %v", err)
			}
			var b strings.Builder
			if err := cli.RenderExplanation(&b, ex); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("rendered (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDefinitionAgainstCluster runs `kubectl lease definition` against a real API server
// (envtest) through a kubeconfig file, as an operator would.
func TestDefinitionAgainstCluster(t *testing.T) {
	dir, err := envtestbin.AssetsDir()
	if err != nil {
		t.Skip(err.Error())
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: dir,
	}
	cfg, err := env.Start()
	if err != nil {
		t.Fatalf("starting envtest: %v", err)
	}
	t.Cleanup(func() {
		if err := env.Stop(); err != nil {
			t.Errorf("stopping envtest: %v", err)
		}
	})
	scheme := runtime.NewScheme()
	if err := leasev1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := corev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	k8s, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		t.Fatal(err)
	}
	ctx := ctxT(t)
	// The system namespace (kubectl lease's default, as under make run) and tenant namespaces.
	for name, tenant := range map[string]string{"lease-system": "", "acme": "acme", "acme-2": "acme", "globex": "globex"} {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if tenant != "" {
			ns.Labels = map[string]string{tenancy.TenantLabel: tenant}
		}
		if err := k8s.Create(ctx, ns); err != nil {
			t.Fatalf("creating namespace %s: %v", name, err)
		}
	}
	for _, ld := range []*leasev1alpha1.LeaseDefinition{
		{
			ObjectMeta: metav1.ObjectMeta{Name: "tex-system", Namespace: "lease-system"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "_vance", Project: "_tenant",
				Levels: &leasev1alpha1.LeaseLevels{Global: ptr.To[int32](8)}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "tex-acme", Namespace: "acme"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "acme", Project: "_tenant",
				Levels: &leasev1alpha1.LeaseLevels{Tenant: ptr.To[int32](2), Global: ptr.To[int32](50)}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "tex-website", Namespace: "acme"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "acme", Project: "website",
				Levels: &leasev1alpha1.LeaseLevels{Project: ptr.To[int32](2)}, TTLSeconds: ptr.To[int32](300)},
		},
		{ // another tenant's document must not leak into acme's merge
			ObjectMeta: metav1.ObjectMeta{Name: "tex-globex", Namespace: "globex"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "globex", Project: "_tenant",
				Levels: &leasev1alpha1.LeaseLevels{Tenant: ptr.To[int32](1)}},
		},
		{ // documents in namespaces that do not own their layer count for nothing, as in the manager
			ObjectMeta: metav1.ObjectMeta{Name: "tex-system", Namespace: "default"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "_vance", Project: "_tenant",
				Levels: &leasev1alpha1.LeaseLevels{Global: ptr.To[int32](1)}},
		},
		{
			ObjectMeta: metav1.ObjectMeta{Name: "tex-acme", Namespace: "globex"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "acme", Project: "_tenant",
				Levels: &leasev1alpha1.LeaseLevels{Tenant: ptr.To[int32](1)}},
		},
	} {
		if err := k8s.Create(ctx, ld); err != nil {
			t.Fatalf("creating %s: %v", ld.Name, err)
		}
	}

	user, err := env.AddUser(envtest.User{Name: "operator", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := user.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "kubeconfig")
	if err := os.WriteFile(path, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}

	r := mustRun(t, nil, "definition", "tex", "--tenant", "acme", "--project", "website", "--kubeconfig", path, "-o", "json")
	type defJSON struct {
		Name, Tenant, Project, Resource string
		Levels                          map[string]int
		TTLSeconds                      float64
		WaitMs                          int64
		Fairness                        string
		NoOp                            bool
		Origin                          map[string]string
		Layers                          []struct{ Kind, Source string }
		Ignored                         []struct {
			Kind, Source string
			Fields       []string
		}
	}
	got := decodeStrict[defJSON](t, r.stdout)
	want := defJSON{
		Name: "tex", Tenant: "acme", Project: "website", Resource: "tex",
		Levels:     map[string]int{"global": 8, "tenant": 2, "project": 2},
		TTLSeconds: 300, WaitMs: 10000, Fairness: "process",
		Origin: map[string]string{
			"resource":       "default",
			"levels.global":  "system: LeaseDefinition lease-system/tex-system",
			"levels.tenant":  "tenant: LeaseDefinition acme/tex-acme",
			"levels.project": "project: LeaseDefinition acme/tex-website",
			"levels.user":    "default",
			"ttlSeconds":     "project: LeaseDefinition acme/tex-website",
			"waitMs":         "builtin: built-in tex.yaml",
			"fairness":       "default",
		},
		Layers: []struct{ Kind, Source string }{
			{"builtin", "built-in tex.yaml"},
			{"system", "LeaseDefinition lease-system/tex-system"},
			{"tenant", "LeaseDefinition acme/tex-acme"},
			{"project", "LeaseDefinition acme/tex-website"},
		},
		Ignored: []struct {
			Kind, Source string
			Fields       []string
		}{{"tenant", "LeaseDefinition acme/tex-acme", []string{"levels.global"}}},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("definition -o json (-want +got):\n%s", diff)
	}

	// The table names the layers; a namespace without documents leaves only the built-in.
	r = mustRun(t, nil, "definition", "tex", "--tenant", "acme", "--project", "website", "--kubeconfig", path)
	if !strings.Contains(r.stdout, "levels.tenant    2         tenant: LeaseDefinition acme/tex-acme") {
		t.Errorf("definition table:\n%s", r.stdout)
	}
	r = mustRun(t, nil, "definition", "tex", "--tenant", "acme", "--project", "website", "--kubeconfig", path,
		"--definitions-namespace", "kube-system", "-o", "json")
	if got := decodeStrict[defJSON](t, r.stdout); got.Levels["global"] != 6 || len(got.Layers) != 1 {
		t.Errorf("definition in an empty namespace = %+v, want the built-in only", got)
	}

	// A conflict fails closed, with what that means for acquisitions.
	dup := &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Name: "tex-acme-dup", Namespace: "acme-2"},
		Spec:       leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "acme", Project: "_tenant"},
	}
	if err := k8s.Create(ctx, dup); err != nil {
		t.Fatal(err)
	}
	mustFail(t, nil, []string{"definition", "tex", "--tenant", "acme", "--project", "website", "--kubeconfig", path},
		"conflicting lease definitions", "LeaseDefinition acme-2/tex-acme-dup, LeaseDefinition acme/tex-acme",
		"answer LEASE_UNAVAILABLE until this is fixed")

	mustFail(t, nil, []string{"definition", "tex", "--kubeconfig", path}, "--tenant is required")
	mustFail(t, nil, []string{"definition", "tex", "--tenant", "acme", "--kubeconfig", filepath.Join(t.TempDir(), "missing")},
		"loading the kubeconfig")
}
