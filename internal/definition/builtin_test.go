package definition

import (
	"context"
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
)

func TestParseDocument(t *testing.T) {
	cases := map[string]struct {
		file, data string
		want       Layer
		wantErr    string
	}{
		"the bundled tex example": {
			file: "tex.yaml",
			data: "name: tex\nresource: tex2pdf\nlevels:\n  global: 6\n  tenant: 3\n  project: 1\n  user: 1\nttlSeconds: 120\nwaitMs: 10000\n",
			want: Layer{Kind: KindBuiltin, Source: "src", Name: "tex", Resource: ptr("tex2pdf"),
				Levels:     Levels{Global: ptr[int32](6), Tenant: ptr[int32](3), Project: ptr[int32](1), User: ptr[int32](1)},
				TTLSeconds: ptr[int32](120), WaitMs: ptr[int32](10000)},
		},
		"only a name":          {file: "x.yaml", data: "name: x\n", want: Layer{Kind: KindBuiltin, Source: "src", Name: "x"}},
		"fairness":             {file: "x.yaml", data: "name: x\nfairness: global\n", want: Layer{Kind: KindBuiltin, Source: "src", Name: "x", Fairness: ptr(FairGlobal)}},
		"unknown fairness":     {file: "x.yaml", data: "name: x\nfairness: fifo\n", wantErr: `fairness: must be process or global, got "fifo"`},
		"name must match file": {file: "tex.yaml", data: "name: texx\n", wantErr: `name: "texx" must match the file name "tex.yaml"`},
		"name is required":     {file: "tex.yaml", data: "levels: {global: 1}\n", wantErr: "name: is required"},
		"empty file":           {file: "tex.yaml", data: "", wantErr: "name: is required"},
		"non-numeric cap":      {file: "tex.yaml", data: "name: tex\nlevels:\n  global: six\n", wantErr: "parsing tex.yaml"},
		"quoted number":        {file: "tex.yaml", data: "name: tex\nlevels:\n  global: \"6\"\n", wantErr: "parsing tex.yaml"},
		"fractional cap":       {file: "tex.yaml", data: "name: tex\nlevels:\n  global: 1.5\n", wantErr: "parsing tex.yaml"},
		"unknown field":        {file: "tex.yaml", data: "name: tex\nlevel:\n  global: 6\n", wantErr: `unknown field "level"`},
		"unknown level":        {file: "tex.yaml", data: "name: tex\nlevels:\n  globl: 6\n", wantErr: `unknown field "globl"`},
		"duplicate field":      {file: "tex.yaml", data: "name: tex\nwaitMs: 1\nwaitMs: 2\n", wantErr: "parsing tex.yaml"},
		"broken YAML":          {file: "tex.yaml", data: "name: tex\nlevels: [\n", wantErr: "parsing tex.yaml"},
		"cap 0":                {file: "tex.yaml", data: "name: tex\nlevels:\n  tenant: 0\n", wantErr: "levels.tenant: cap must be at least 1, got 0"},
		"int32 overflow":       {file: "tex.yaml", data: "name: tex\nlevels:\n  tenant: 4294967296\n", wantErr: "parsing tex.yaml"},
		"not a .yaml file":     {file: "tex.yml", data: "name: tex\n", wantErr: `file "tex.yml": want <name>.yaml`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := ParseDocument(tc.file, []byte(tc.data), "src")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("ParseDocument() error = %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseDocument() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ParseDocument() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLoadBuiltins(t *testing.T) {
	compiledTex := &Layer{Kind: KindBuiltin, Source: "built-in tex.yaml", Name: "tex",
		Levels:     Levels{Global: ptr[int32](6), Tenant: ptr[int32](3), Project: ptr[int32](1)},
		TTLSeconds: ptr[int32](120), WaitMs: ptr[int32](10000)}

	type lookup struct {
		layer   *Layer
		wantErr string // the lookup fails with lease.ErrUnavailable containing this
	}
	cases := map[string]struct {
		dir          fs.FS
		want         map[string]lookup
		wantNames    []string
		wantProblems int
	}{
		"compiled-in only: tex is global 6, tenant 3, project 1": {
			want:      map[string]lookup{"tex": {layer: compiledTex}, "browser": {}},
			wantNames: []string{"tex"},
		},
		"defaults directory extends and replaces": {
			dir: fstest.MapFS{
				"browser.yaml":          {Data: []byte("name: browser\nlevels: {global: 20, user: 1}\n")},
				"tex.yaml":              {Data: []byte("name: tex\nlevels: {global: 2}\n")},
				"README.md":             {Data: []byte("not a definition")},
				"..data/tex.yaml":       {Data: []byte("garbage: [")},
				".hidden.yaml":          {Data: []byte("garbage: [")},
				"nested.yaml/file.yaml": {Data: []byte("garbage: [")},
			},
			want: map[string]lookup{
				"browser": {layer: &Layer{Kind: KindBuiltin, Source: "defaults-dir browser.yaml", Name: "browser",
					Levels: Levels{Global: ptr[int32](20), User: ptr[int32](1)}}},
				"tex": {layer: &Layer{Kind: KindBuiltin, Source: "defaults-dir tex.yaml", Name: "tex",
					Levels: Levels{Global: ptr[int32](2)}}},
			},
			wantNames: []string{"browser", "tex"},
		},
		"a broken file fails its name closed, without falling back to the compiled-in document": {
			dir: fstest.MapFS{
				"tex.yaml":      {Data: []byte("name: tex\nlevels: {global: six}\n")},
				"ok.yaml":       {Data: []byte("name: ok\nlevels: {user: 1}\n")},
				"zero.yaml":     {Data: []byte("name: zero\nlevels: {user: 0}\n")},
				"other.yaml":    {Data: []byte("name: another\n")},
				"legacy.yml":    {Data: []byte("name: legacy\n")},
				"bad name.yaml": {Data: []byte("name: bad name\n")},
			},
			want: map[string]lookup{
				"tex":     {wantErr: "defaults-dir tex.yaml: parsing tex.yaml"},
				"ok":      {layer: &Layer{Kind: KindBuiltin, Source: "defaults-dir ok.yaml", Name: "ok", Levels: Levels{User: ptr[int32](1)}}},
				"zero":    {wantErr: "levels.user: cap must be at least 1"},
				"other":   {wantErr: `"another" must match the file name "other.yaml"`},
				"legacy":  {wantErr: `want legacy.yaml`},
				"another": {},
			},
			wantNames:    []string{"legacy", "ok", "other", "tex", "zero"},
			wantProblems: 5,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			b, err := LoadBuiltins(tc.dir)
			if err != nil {
				t.Fatalf("LoadBuiltins() error = %v", err)
			}
			for leaseName, want := range tc.want {
				got, err := b.Layer(leaseName)
				if want.wantErr != "" {
					if !errors.Is(err, lease.ErrUnavailable) || !strings.Contains(err.Error(), want.wantErr) {
						t.Errorf("Layer(%q) error = %v, want ErrUnavailable containing %q", leaseName, err, want.wantErr)
					}
					continue
				}
				if err != nil {
					t.Fatalf("Layer(%q) error = %v", name, err)
				}
				if diff := cmp.Diff(want.layer, got); diff != "" {
					t.Errorf("Layer(%q) mismatch (-want +got):\n%s", leaseName, diff)
				}
			}
			if diff := cmp.Diff(tc.wantNames, b.Names()); diff != "" {
				t.Errorf("Names() mismatch (-want +got):\n%s", diff)
			}
			if got := len(b.Problems()); got != tc.wantProblems {
				t.Errorf("Problems() = %v, want %d problems", b.Problems(), tc.wantProblems)
			}
		})
	}
}

func TestLoadBuiltinsUnreadableDirectory(t *testing.T) {
	if _, err := LoadBuiltins(os.DirFS(filepath.Join(t.TempDir(), "missing"))); err == nil {
		t.Fatal("LoadBuiltins() of a missing directory succeeded, want an error")
	}
}

func TestUnavailableBuiltins(t *testing.T) {
	cause := errors.New("configmap not found")
	b := UnavailableBuiltins("ConfigMap lease-system/builtin", cause)
	for _, name := range []string{"tex", "anything"} {
		l, err := b.Layer(name)
		var ue *UnavailableError
		if l != nil || !errors.As(err, &ue) || !errors.Is(err, cause) || ue.Name != name {
			t.Errorf("Layer(%q) = %v, %v; want an UnavailableError for %q wrapping the cause", name, l, err, name)
		}
	}
	r := NewResolver(b, nil)
	if _, err := r.Resolve(context.Background(), "acme", "web", "tex"); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("Resolve() error = %v, want unavailable", err)
	}
	if d, err := r.Resolve(context.Background(), "acme", "web", NoneReference); err != nil || !d.NoOp() {
		t.Errorf("Resolve(none) = %v, %v; want NOOP", d, err)
	}
}
