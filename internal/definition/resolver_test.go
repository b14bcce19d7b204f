package definition

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
)

// memSource is an in-memory LayerSource.
type memSource struct {
	mu     sync.Mutex
	docs   map[LayerKey][]Layer
	err    error
	reads  int
	onRead func(LayerKey) // called outside the lock during a read
}

var _ LayerSource = (*memSource)(nil)

func newMemSource(docs ...Layer) *memSource {
	s := &memSource{docs: map[LayerKey][]Layer{}}
	for _, d := range docs {
		s.put(d)
	}
	return s
}

func (s *memSource) put(l Layer) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := LayerKey{Name: l.Name, Tenant: l.Tenant, Project: l.Project}
	s.docs[k] = slices.DeleteFunc(s.docs[k], func(o Layer) bool { return o.Source == l.Source })
	s.docs[k] = append(s.docs[k], l)
}

func (s *memSource) remove(source string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for k, docs := range s.docs {
		s.docs[k] = slices.DeleteFunc(docs, func(o Layer) bool { return o.Source == source })
	}
}

func (s *memSource) Layers(_ context.Context, key LayerKey) ([]Layer, error) {
	s.mu.Lock()
	s.reads++
	docs, err, hook := slices.Clone(s.docs[key]), s.err, s.onRead
	s.mu.Unlock()
	if hook != nil {
		hook(key)
	}
	return docs, err
}

func (s *memSource) SystemLayers(context.Context) ([]Layer, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.err != nil {
		return nil, s.err
	}
	var out []Layer
	for k, docs := range s.docs {
		if k.Kind() == KindSystem {
			out = append(out, docs...)
		}
	}
	return out, nil
}

func (s *memSource) readCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.reads
}

// cached returns the cached scopes of name as sorted tenant/project strings.
func (r *Resolver) cached(name string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for sk := range r.cache.scopes(name) {
		out = append(out, sk.tenant+"/"+sk.project)
	}
	slices.Sort(out)
	return out
}

func sysDoc(name string, mod func(*Layer)) Layer {
	l := Layer{Kind: KindSystem, Source: "sys/" + name, Name: name, Tenant: SystemTenant, Project: TenantProject}
	mod(&l)
	return l
}

func tenantDoc(name, tenant string, mod func(*Layer)) Layer {
	l := Layer{Kind: KindTenant, Source: "ten/" + tenant + "/" + name, Name: name, Tenant: tenant, Project: TenantProject}
	mod(&l)
	return l
}

func projectDoc(name, tenant, project string, mod func(*Layer)) Layer {
	l := Layer{Kind: KindProject, Source: "prj/" + tenant + "/" + project + "/" + name, Name: name, Tenant: tenant, Project: project}
	mod(&l)
	return l
}

func mustBuiltins(t *testing.T, dir fstest.MapFS) *Builtins {
	t.Helper()
	var b *Builtins
	var err error
	if dir == nil {
		b, err = LoadBuiltins(nil) // a nil MapFS in an fs.FS would not be nil
	} else {
		b, err = LoadBuiltins(dir)
	}
	if err != nil {
		t.Fatalf("LoadBuiltins() error = %v", err)
	}
	return b
}

func TestResolve(t *testing.T) {
	builtins := mustBuiltins(t, fstest.MapFS{"broken.yaml": {Data: []byte("name: broken\nlevels: {user: 0}\n")}})
	source := newMemSource(
		sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](4) }),
		tenantDoc("tex", "acme", func(l *Layer) { l.Levels.Tenant = ptr[int32](2); l.Levels.Global = ptr[int32](50) }),
		projectDoc("tex", "acme", "web", func(l *Layer) { l.Levels.Project = ptr[int32](2); l.WaitMs = ptr[int32](0) }),
		sysDoc("browser", func(l *Layer) { l.Levels.Global = ptr[int32](20); l.Levels.User = ptr[int32](1) }),
		projectDoc("plain", "acme", "web", func(l *Layer) { l.TTLSeconds = ptr[int32](5) }),
		tenantDoc("dup", "acme", func(*Layer) {}),
		tenantDoc("dup", "acme", func(l *Layer) { l.Source = "ten/acme/dup-2" }),
		sysDoc("sysdup", func(*Layer) {}),
		sysDoc("sysdup", func(l *Layer) { l.Source = "sys/sysdup-2" }),
		sysDoc("badcap", func(l *Layer) { l.Levels.Tenant = ptr[int32](0) }),
	)
	r := NewResolver(builtins, source)

	cases := []struct {
		name                   string
		tenant, project, lease string
		want                   Definition
		wantErr                error
		wantMsg                string
	}{
		{name: "none is a NOOP", tenant: "acme", project: "web", lease: "none", want: Definition{}},
		{name: "empty is a NOOP", tenant: "acme", project: "web", lease: "", want: Definition{}},
		{name: "all four layers", tenant: "acme", project: "web", lease: "tex",
			want: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 4, Tenant: 2, Project: 2}, TTL: 2 * time.Minute, Wait: 0, Fairness: FairProcess}},
		{name: "another project of the tenant", tenant: "acme", project: "api", lease: "tex",
			want: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 4, Tenant: 2, Project: 1}, TTL: 2 * time.Minute, Wait: 10 * time.Second, Fairness: FairProcess}},
		{name: "another tenant", tenant: "other", project: "web", lease: "tex",
			want: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 4, Tenant: 3, Project: 1}, TTL: 2 * time.Minute, Wait: 10 * time.Second, Fairness: FairProcess}},
		{name: "tenant-wide scope", tenant: "acme", project: TenantProject, lease: "tex",
			want: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 4, Tenant: 2, Project: 1}, TTL: 2 * time.Minute, Wait: 10 * time.Second, Fairness: FairProcess}},
		{name: "system scope", tenant: SystemTenant, project: TenantProject, lease: "tex",
			want: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 4, Tenant: 3, Project: 1}, TTL: 2 * time.Minute, Wait: 10 * time.Second, Fairness: FairProcess}},
		{name: "system layer only", tenant: "acme", project: "web", lease: "browser",
			want: Definition{Name: "browser", Resource: "browser", Caps: Caps{Global: 20, User: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "no caps after merging is a NOOP", tenant: "acme", project: "web", lease: "plain",
			want: Definition{Name: "plain", Resource: "plain", TTL: 5 * time.Second, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "unknown name is a NOOP", tenant: "acme", project: "web", lease: "unknown",
			want: Definition{Name: "unknown", Resource: "unknown", TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "conflict at the tenant layer", tenant: "acme", project: "web", lease: "dup",
			wantErr: ErrConflict, wantMsg: "ten/acme/dup, ten/acme/dup-2"},
		{name: "conflict at the tenant layer does not affect other tenants", tenant: "other", project: "web", lease: "dup",
			want: Definition{Name: "dup", Resource: "dup", TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "conflict at the system layer affects every scope", tenant: "other", project: "web", lease: "sysdup",
			wantErr: ErrConflict, wantMsg: "sys/sysdup, sys/sysdup-2"},
		{name: "cap 0 fails closed", tenant: "acme", project: "web", lease: "badcap",
			wantErr: lease.ErrUnavailable, wantMsg: "levels.tenant: cap must be at least 1"},
		{name: "broken built-in fails closed", tenant: "acme", project: "web", lease: "broken",
			wantErr: lease.ErrUnavailable, wantMsg: "defaults-dir broken.yaml"},
		{name: "invalid lease name", tenant: "acme", project: "web", lease: "../etc",
			wantErr: lease.ErrInvalid, wantMsg: "lease:"},
		{name: "invalid tenant", tenant: "", project: "web", lease: "tex",
			wantErr: lease.ErrInvalid, wantMsg: "tenant:"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(t.Context(), tc.tenant, tc.project, tc.lease)
			if tc.wantErr != nil {
				if !errors.Is(err, tc.wantErr) || !strings.Contains(fmt.Sprint(err), tc.wantMsg) {
					t.Fatalf("Resolve() error = %v, want %v containing %q", err, tc.wantErr, tc.wantMsg)
				}
				if errors.Is(tc.wantErr, ErrConflict) && !errors.Is(err, lease.ErrUnavailable) {
					t.Errorf("Resolve() error = %v, a conflict must be lease.ErrUnavailable", err)
				}
				if slices.Contains(r.cached(tc.lease), tc.tenant+"/"+tc.project) {
					t.Errorf("a failed resolution was cached")
				}
				return
			}
			if err != nil {
				t.Fatalf("Resolve() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Resolve() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveCachesAndInvalidates(t *testing.T) {
	scopes := [][2]string{{"a", "p"}, {"a", "q"}, {"a", TenantProject}, {"b", "p"}, {SystemTenant, TenantProject}}
	all := []string{"_vance/_tenant", "a/_tenant", "a/p", "a/q", "b/p"}
	cases := map[string]struct {
		invalidate func(*Resolver)
		want       []string // scopes of tex still cached
	}{
		"system document drops the name everywhere": {
			invalidate: func(r *Resolver) { r.Invalidate(LayerKey{"tex", SystemTenant, TenantProject}) },
		},
		"tenant document drops the tenant's scopes": {
			invalidate: func(r *Resolver) { r.Invalidate(LayerKey{"tex", "a", TenantProject}) },
			want:       []string{"_vance/_tenant", "b/p"},
		},
		"project document drops its scope": {
			invalidate: func(r *Resolver) { r.Invalidate(LayerKey{"tex", "a", "p"}) },
			want:       []string{"_vance/_tenant", "a/_tenant", "a/q", "b/p"},
		},
		"a system document of another name drops everything too": {
			// it may book the same resource and change its caps (Bound)
			invalidate: func(r *Resolver) { r.Invalidate(LayerKey{"browser", SystemTenant, TenantProject}) },
		},
		"a tenant document of another name drops nothing": {
			invalidate: func(r *Resolver) { r.Invalidate(LayerKey{"browser", "a", TenantProject}) },
			want:       all,
		},
		"everything": {
			invalidate: func(r *Resolver) { r.InvalidateAll() },
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			source := newMemSource()
			r := NewResolver(mustBuiltins(t, nil), source)
			for _, s := range scopes {
				if _, err := r.Resolve(t.Context(), s[0], s[1], "tex"); err != nil {
					t.Fatalf("Resolve(%v) error = %v", s, err)
				}
			}
			reads := source.readCount()
			for _, s := range scopes {
				if _, err := r.Resolve(t.Context(), s[0], s[1], "tex"); err != nil {
					t.Fatalf("Resolve(%v) error = %v", s, err)
				}
			}
			if got := source.readCount(); got != reads {
				t.Fatalf("cached resolutions read the source %d times", got-reads)
			}
			if diff := cmp.Diff(all, r.cached("tex")); diff != "" {
				t.Fatalf("cached scopes mismatch (-want +got):\n%s", diff)
			}
			tc.invalidate(r)
			if diff := cmp.Diff(tc.want, r.cached("tex")); diff != "" {
				t.Errorf("cached scopes after invalidation mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestResolveSeesChangesAfterInvalidation(t *testing.T) {
	source := newMemSource(sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](4) }))
	r := NewResolver(mustBuiltins(t, nil), source)
	get := func(tenant, project string) Definition {
		t.Helper()
		d, err := r.Resolve(t.Context(), tenant, project, "tex")
		if err != nil {
			t.Fatalf("Resolve() error = %v", err)
		}
		return d
	}
	if got := get("a", "p").Caps.Global; got != 4 {
		t.Fatalf("global = %d, want 4", got)
	}

	// A conflicting second system document: unavailable everywhere, nothing cached.
	dup := sysDoc("tex", func(l *Layer) { l.Source = "sys/tex-2" })
	source.put(dup)
	r.Invalidate(LayerKey{"tex", SystemTenant, TenantProject})
	for range 2 {
		if _, err := r.Resolve(t.Context(), "a", "p", "tex"); !errors.Is(err, ErrConflict) {
			t.Fatalf("Resolve() error = %v, want a conflict", err)
		}
	}
	// The fix restores every scope.
	source.remove(dup.Source)
	source.put(sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](8) }))
	r.Invalidate(LayerKey{"tex", SystemTenant, TenantProject})
	if got := get("a", "p").Caps.Global; got != 8 {
		t.Errorf("global = %d, want 8", got)
	}
	// A deleted document drops out of the merge.
	source.remove("sys/tex")
	r.Invalidate(LayerKey{"tex", SystemTenant, TenantProject})
	if got := get("a", "p").Caps.Global; got != 6 {
		t.Errorf("global = %d after deleting the system document, want the built-in 6", got)
	}
}

// TestOnChangeRunsAfterEveryInvalidation: the hooks run after each invalidation, once the
// cache no longer holds what it dropped, so that a waiter they wake resolves the new
// definition.
func TestOnChangeRunsAfterEveryInvalidation(t *testing.T) {
	source := newMemSource(sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](4) }))
	r := NewResolver(mustBuiltins(t, nil), source)
	var seen []int
	r.OnChange(func() {
		d, err := r.Resolve(t.Context(), "a", "p", "tex")
		if err != nil {
			t.Errorf("Resolve() in the hook: %v", err)
			return
		}
		seen = append(seen, d.Caps.Global)
	})
	if _, err := r.Resolve(t.Context(), "a", "p", "tex"); err != nil {
		t.Fatal(err)
	}
	source.put(sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](8) }))
	r.Invalidate(LayerKey{"tex", SystemTenant, TenantProject})
	source.put(sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](9) }))
	r.InvalidateAll()
	if diff := cmp.Diff([]int{8, 9}, seen); diff != "" {
		t.Errorf("caps seen by the hook (-want +got):\n%s", diff)
	}
}

func TestResolveDoesNotCacheAcrossAConcurrentInvalidation(t *testing.T) {
	source := newMemSource()
	r := NewResolver(mustBuiltins(t, nil), source)
	var once sync.Once
	source.onRead = func(LayerKey) {
		// The document changes while the resolution reads: the change's invalidation lands
		// before the stale result would be stored.
		once.Do(func() { r.Invalidate(LayerKey{"tex", "a", "p"}) })
	}
	if _, err := r.Resolve(t.Context(), "a", "p", "tex"); err != nil {
		t.Fatalf("Resolve() error = %v", err)
	}
	if got := r.cached("tex"); len(got) != 0 {
		t.Errorf("cached %v, want nothing: the result may predate the change", got)
	}
}

func TestResolveReadErrorFailsClosed(t *testing.T) {
	source := newMemSource()
	source.err = errors.New("cache not started")
	r := NewResolver(mustBuiltins(t, nil), source)
	_, err := r.Resolve(t.Context(), "a", "p", "tex")
	if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, ErrLayerRead) {
		t.Fatalf("Resolve() error = %v, want lease.ErrUnavailable and ErrLayerRead", err)
	}
	if got := r.cached("tex"); len(got) != 0 {
		t.Errorf("cached %v after a read error", got)
	}
}

// TestResolverConcurrency resolves, changes and invalidates concurrently (run with -race) and
// checks the invariant that matters: once changes stop and their invalidations have run, every
// scope resolves the current documents.
func TestResolverConcurrency(t *testing.T) {
	source := newMemSource(sysDoc("tex", func(l *Layer) { l.Levels.Tenant = ptr[int32](5) }))
	r := NewResolver(mustBuiltins(t, nil), source)
	tenants := []string{"a", "b", "c"}
	projects := []string{"p", "q", TenantProject}

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := range 200 {
				tn := tenants[(w+i)%len(tenants)]
				pj := projects[i%len(projects)]
				if _, err := r.Resolve(t.Context(), tn, pj, "tex"); err != nil {
					t.Errorf("Resolve() error = %v", err)
					return
				}
			}
		})
	}
	wg.Go(func() {
		for i := range 100 {
			tn := tenants[i%len(tenants)]
			doc := tenantDoc("tex", tn, func(l *Layer) { l.Levels.Tenant = ptr(int32(i%5 + 1)) })
			source.put(doc)
			r.Invalidate(LayerKey{"tex", tn, TenantProject})
			// The system's tenant cap stays at least the tenant documents' (Bound).
			sys := sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr(int32(i%7 + 1)); l.Levels.Tenant = ptr[int32](5) })
			source.put(sys)
			r.Invalidate(LayerKey{"tex", SystemTenant, TenantProject})
		}
	})
	wg.Wait()

	for _, tn := range tenants {
		for _, pj := range projects {
			got, err := r.Resolve(t.Context(), tn, pj, "tex")
			if err != nil {
				t.Fatalf("Resolve() error = %v", err)
			}
			want, err := r.Explain(t.Context(), tn, pj, "tex")
			if err != nil {
				t.Fatalf("Explain() error = %v", err)
			}
			if diff := cmp.Diff(want.Definition, got); diff != "" {
				t.Errorf("%s/%s: cached definition is stale (-current +cached):\n%s", tn, pj, diff)
			}
		}
	}
}

// TestResolverCacheIsBounded: a caller inventing lease names (each a NOOP, cached so that it
// costs no store read) cannot grow the cache beyond its bound; the entries in use stay.
func TestResolverCacheIsBounded(t *testing.T) {
	source := newMemSource(sysDoc("tex", func(l *Layer) { l.Levels.Global = ptr[int32](3) }))
	r := NewResolver(mustBuiltins(t, nil), source, WithCacheSize(100))
	ctx := context.Background()
	if _, err := r.Resolve(ctx, "acme", "p", "tex"); err != nil {
		t.Fatal(err)
	}
	for i := range 1000 {
		if _, err := r.Resolve(ctx, "acme", "p", fmt.Sprintf("invented-%d", i)); err != nil {
			t.Fatal(err)
		}
		if i%50 == 0 { // the real lease is in use all along
			if _, err := r.Resolve(ctx, "acme", "p", "tex"); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.mu.Lock()
	n := r.cache.len()
	r.mu.Unlock()
	if n > 100 {
		t.Errorf("cache holds %d definitions, want at most 100", n)
	}
	if diff := cmp.Diff([]string{"acme/p"}, r.cached("tex")); diff != "" {
		t.Errorf("the lease in use was evicted (-want +got):\n%s", diff)
	}
}
