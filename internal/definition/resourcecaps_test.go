package definition

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
)

// TestResolveCapsBelongToTheResource is issue 26's first reproduction: a tenant's document
// pointing a lease at another resource booked that resource's global counter against the
// lease's own (higher) cap.
func TestResolveCapsBelongToTheResource(t *testing.T) {
	builtins := mustBuiltins(t, nil) // tex: global 6, tenant 3, project 1
	source := newMemSource(
		sysDoc("browser", func(l *Layer) {
			l.Resource = ptr("browser-sessions")
			l.Levels = Levels{Global: ptr[int32](20), Tenant: ptr[int32](5), User: ptr[int32](1)}
		}),
		// The reproduction: acme points browser at tex with a tenant cap of 20.
		tenantDoc("browser", "acme", func(l *Layer) { l.Resource = ptr("tex"); l.Levels.Tenant = ptr[int32](20) }),
		// A lease of acme's own on tex: the resource's caps apply.
		tenantDoc("mytex", "acme", func(l *Layer) { l.Resource = ptr("tex"); l.Levels.User = ptr[int32](1) }),
		tenantDoc("bigtex", "acme", func(l *Layer) { l.Resource = ptr("tex"); l.Levels.Tenant = ptr[int32](20) }),
		// A private resource no system definition books: nothing shared is capped.
		tenantDoc("mine", "acme", func(l *Layer) { l.Resource = ptr("acme-stuff"); l.Levels.Tenant = ptr[int32](4) }),
		// Raising the tenant cap of the resource itself is refused; lowering it is fine.
		tenantDoc("tex", "acme", func(l *Layer) { l.Levels.Tenant = ptr[int32](5) }),
		tenantDoc("tex", "globex", func(l *Layer) { l.Levels.Tenant = ptr[int32](2) }),
		// A system definition booking tex under another name with a higher global cap: the
		// lowest cap of the resource wins.
		sysDoc("texfast", func(l *Layer) { l.Resource = ptr("tex"); l.Levels.Global = ptr[int32](10) }),
	)
	r := NewResolver(builtins, source)

	cases := []struct {
		name                   string
		tenant, project, lease string
		want                   Definition
		wantMsg                string // a refusal: the error must be ErrCapNotPermitted and lease.ErrUnavailable
	}{
		{name: "a tenant may not move a capped lease to another resource", tenant: "acme", project: "web", lease: "browser",
			wantMsg: `ten/acme/browser: not permitted by the system layer: resource "tex": lease "browser" has operator settings on resource "browser-sessions" (global 20, tenant 5)`},
		{name: "other tenants keep the system's browser", tenant: "globex", project: "web", lease: "browser",
			want: Definition{Name: "browser", Resource: "browser-sessions", Caps: Caps{Global: 20, Tenant: 5, User: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "a tenant's own lease on a system resource gets the resource's caps", tenant: "acme", project: "web", lease: "mytex",
			want: Definition{Name: "mytex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3, User: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "a tenant cap above the resource's is refused", tenant: "acme", project: "web", lease: "bigtex",
			wantMsg: `levels.tenant 20 is above the tenant cap 3 the system layer sets for resource "tex"`},
		{name: "a private resource has no global cap", tenant: "acme", project: "web", lease: "mine",
			want: Definition{Name: "mine", Resource: "acme-stuff", Caps: Caps{Tenant: 4}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
		{name: "a tenant may not raise its tenant cap of the resource", tenant: "acme", project: "web", lease: "tex",
			wantMsg: `levels.tenant 5 is above the tenant cap 3`},
		{name: "a tenant may lower it", tenant: "globex", project: "web", lease: "tex",
			want: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 2, Project: 1}, TTL: 2 * time.Minute, Wait: 10 * time.Second, Fairness: FairProcess}},
		{name: "the lowest global cap of the resource wins", tenant: SystemTenant, project: TenantProject, lease: "texfast",
			want: Definition{Name: "texfast", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(t.Context(), tc.tenant, tc.project, tc.lease)
			if tc.wantMsg != "" {
				if !errors.Is(err, ErrCapNotPermitted) || !errors.Is(err, lease.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), tc.wantMsg) {
					t.Fatalf("Resolve() = %+v, %v; want ErrCapNotPermitted containing %q", got, err, tc.wantMsg)
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

// TestResolveSystemChangeReachesOtherNames: a system document of one name can lower the caps
// of a resource another name books, so its invalidation drops that name's cached definition.
func TestResolveSystemChangeReachesOtherNames(t *testing.T) {
	source := newMemSource(tenantDoc("mytex", "acme", func(l *Layer) { l.Resource = ptr("tex") }))
	r := NewResolver(mustBuiltins(t, nil), source)
	got, err := r.Resolve(t.Context(), "acme", "web", "mytex")
	if err != nil || got.Caps.Global != 6 {
		t.Fatalf("Resolve() = %+v, %v; want global 6", got, err)
	}
	low := sysDoc("texlow", func(l *Layer) { l.Resource = ptr("tex"); l.Levels.Global = ptr[int32](2) })
	source.put(low)
	r.Invalidate(LayerKey{Name: low.Name, Tenant: low.Tenant, Project: low.Project})
	got, err = r.Resolve(t.Context(), "acme", "web", "mytex")
	if err != nil || got.Caps.Global != 2 {
		t.Fatalf("after the system change Resolve() = %+v, %v; want global 2", got, err)
	}
}

func TestIndexResources(t *testing.T) {
	builtin := &Layer{Kind: KindBuiltin, Source: "built-in tex.yaml", Name: "tex",
		Levels: Levels{Global: ptr[int32](6), Tenant: ptr[int32](3)}}
	sys := func(name, resource string, global, tenant int32) *Layer {
		l := sysDoc(name, func(l *Layer) {
			l.Resource = ptr(resource)
			if global > 0 {
				l.Levels.Global = ptr(global)
			}
			if tenant > 0 {
				l.Levels.Tenant = ptr(tenant)
			}
		})
		return &l
	}
	scope := func(name string) LayerKey { return LayerKey{Name: name, Tenant: SystemTenant, Project: TenantProject} }
	got := IndexResources([]Stack{
		{Scope: scope("tex"), Builtin: builtin},
		{Scope: scope("texlow"), System: sys("texlow", "tex", 0, 2)},
		{Scope: scope("a"), System: sys("a", "shared", 8, 0)},
		{Scope: scope("b"), System: sys("b", "shared", 4, 0)},
		{Scope: scope("broken"), System: func() *Layer { l := sys("broken", "shared", 1, 0); l.Levels.User = ptr[int32](0); return l }()},
	})
	want := ResourceIndex{
		"tex": {Global: 6, Tenant: 2, GlobalSource: "built-in tex.yaml", TenantSource: "sys/texlow"},
		// A broken document still marks the resources it may book: tenant leases on them are
		// refused (Bound).
		"shared": {Global: 4, GlobalSource: "sys/b", Broken: "sys/broken"},
		"broken": {Broken: "sys/broken"},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("IndexResources() mismatch (-want +got):\n%s", diff)
	}
}

// TestResolveARedirectCarriesNoOperatorSetting is the security review's first finding (issue
// 42): the move check looked at caps only, so a tenant could point an operator lease whose
// caps come from its resource (or that has none) at another resource and take the lease's
// priority and borrowing along.
func TestResolveARedirectCarriesNoOperatorSetting(t *testing.T) {
	source := newMemSource(
		sysDoc("gpu", func(l *Layer) { l.Levels = Levels{Global: ptr[int32](4), Tenant: ptr[int32](1)} }),
		// The operator's batch lease books gpu, takes gpu's caps, borrows and allows priority.
		sysDoc("batch", func(l *Layer) {
			l.Resource = ptr("gpu")
			l.MaxPriority = ptr[int32](100)
			l.Borrowing = BorrowingLayer{Enabled: ptr(true)}
		}),
		sysDoc("urgent", func(l *Layer) { l.MaxPriority = ptr[int32](50) }),
		sysDoc("aged", func(l *Layer) { l.PriorityAgeBoundSeconds = ptr[int32](30) }),
		sysDoc("lender", func(l *Layer) { l.Borrowing = BorrowingLayer{Enabled: ptr(true)} }),
		// The reproduction: acme re-points batch at tex.
		tenantDoc("batch", "acme", func(l *Layer) { l.Resource = ptr("tex") }),
		tenantDoc("urgent", "acme", func(l *Layer) { l.Resource = ptr("tex") }),
		tenantDoc("aged", "acme", func(l *Layer) { l.Resource = ptr("tex") }),
		tenantDoc("lender", "acme", func(l *Layer) { l.Resource = ptr("tex") }),
		// Naming the lease's own resource is no move; lowering its tenant cap is the tenant's.
		tenantDoc("batch", "globex", func(l *Layer) { l.Resource = ptr("gpu"); l.Levels.User = ptr[int32](1) }),
		// A tenant's own lease on gpu gets gpu's caps and none of batch's settings.
		tenantDoc("mybatch", "acme", func(l *Layer) { l.Resource = ptr("gpu") }),
	)
	r := NewResolver(mustBuiltins(t, nil), source)
	for _, name := range []string{"batch", "urgent", "aged", "lender"} {
		t.Run("a tenant may not move "+name, func(t *testing.T) {
			got, err := r.Resolve(t.Context(), "acme", "web", name)
			want := `resource "tex": lease "` + name + `" has operator settings`
			if !errors.Is(err, ErrCapNotPermitted) || !errors.Is(err, lease.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), want) {
				t.Fatalf("Resolve() = %+v, %v; want ErrCapNotPermitted containing %q", got, err, want)
			}
		})
	}
	cases := []struct {
		name, tenant, lease string
		want                Definition
	}{
		{name: "naming the lease's own resource keeps its settings", tenant: "globex", lease: "batch",
			want: Definition{Name: "batch", Resource: "gpu", Caps: Caps{Global: 4, Tenant: 1, User: 1}, TTL: DefaultTTL, Wait: DefaultWait,
				Fairness: FairProcess, MaxPriority: 100, Borrowing: Borrowing{Enabled: true, Grace: DefaultBorrowGrace}}},
		{name: "a tenant's own lease gets the resource's caps and no other lease's settings", tenant: "acme", lease: "mybatch",
			want: Definition{Name: "mybatch", Resource: "gpu", Caps: Caps{Global: 4, Tenant: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := r.Resolve(t.Context(), tc.tenant, "web", tc.lease)
			if err != nil {
				t.Fatalf("Resolve() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Resolve() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

// TestResolveABrokenOperatorDocumentWidensNothing is the review's second finding: a built-in
// document that did not load took the valid system document of its name out of the resource
// index, so a tenant's own lease on that resource had no global and no tenant cap.
func TestResolveABrokenOperatorDocumentWidensNothing(t *testing.T) {
	builtins := mustBuiltins(t, fstest.MapFS{
		"gpu.yaml":  {Data: []byte("name: gpu\nlevels: {global: 4, tenant: nope}\n")},
		"disk.yaml": {Data: []byte("name: disk\nlevels: {global: 3}\n")},
	})
	source := newMemSource(
		// A valid system document for the broken built-in name: its caps still count.
		sysDoc("gpu", func(l *Layer) { l.Resource = ptr("gpus"); l.Levels.Global = ptr[int32](2) }),
		// A valid operator lease of another name on the same resource.
		sysDoc("render", func(l *Layer) { l.Resource = ptr("gpus"); l.Levels.Tenant = ptr[int32](1) }),
		// An invalid system document over a valid built-in one: the built-in caps still count.
		sysDoc("disk", func(l *Layer) { l.Levels.User = ptr[int32](0) }),
		tenantDoc("mygpu", "acme", func(l *Layer) { l.Resource = ptr("gpus") }),
		tenantDoc("mydisk", "acme", func(l *Layer) { l.Resource = ptr("disk") }),
		tenantDoc("render", "acme", func(l *Layer) { l.Levels.User = ptr[int32](1) }),
	)
	r := NewResolver(builtins, source)
	for _, name := range []string{"mygpu", "mydisk"} {
		t.Run("a tenant's own lease on a resource with a broken operator document is refused: "+name, func(t *testing.T) {
			got, err := r.Resolve(t.Context(), "acme", "web", name)
			want := "does not load"
			if !errors.Is(err, ErrOperatorDocumentBroken) || !errors.Is(err, lease.ErrUnavailable) || !strings.Contains(fmt.Sprint(err), want) {
				t.Fatalf("Resolve() = %+v, %v; want ErrOperatorDocumentBroken containing %q", got, err, want)
			}
		})
	}
	t.Run("the operator's valid lease on it keeps the valid caps", func(t *testing.T) {
		got, err := r.Resolve(t.Context(), "acme", "web", "render")
		if err != nil {
			t.Fatalf("Resolve() error = %v", err)
		}
		want := Definition{Name: "render", Resource: "gpus", Caps: Caps{Global: 2, Tenant: 1, User: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("Resolve() mismatch (-want +got):\n%s", diff)
		}
	})
	t.Run("the broken name itself stays unavailable", func(t *testing.T) {
		if _, err := r.Resolve(t.Context(), "acme", "web", "gpu"); !errors.Is(err, lease.ErrUnavailable) {
			t.Fatalf("Resolve(gpu) error = %v; want unavailable", err)
		}
	})
}
