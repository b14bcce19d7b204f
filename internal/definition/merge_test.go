package definition

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
)

func ptr[T any](v T) *T { return &v }

func TestMerge(t *testing.T) {
	scope := LayerKey{Name: "tex", Tenant: "acme", Project: "web"}
	builtin := &Layer{Kind: KindBuiltin, Source: "built-in tex.yaml", Name: "tex",
		Levels: Levels{Global: ptr[int32](6), Tenant: ptr[int32](3), Project: ptr[int32](1)}}
	system := &Layer{Kind: KindSystem, Source: "sys", Name: "tex", Tenant: SystemTenant, Project: TenantProject,
		Resource: ptr("tex2pdf"), Levels: Levels{Global: ptr[int32](10)}, TTLSeconds: ptr[int32](60)}
	tenant := &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: TenantProject,
		Resource: ptr("acme-tex"), Levels: Levels{Global: ptr[int32](100), Tenant: ptr[int32](5)}, WaitMs: ptr[int32](2000)}
	project := &Layer{Kind: KindProject, Source: "prj", Name: "tex", Tenant: "acme", Project: "web",
		Resource: ptr("mine"), Levels: Levels{Global: ptr[int32](99), Tenant: ptr[int32](99), Project: ptr[int32](2), User: ptr[int32](1)},
		TTLSeconds: ptr[int32](30), WaitMs: ptr[int32](0)}

	cases := map[string]struct {
		stack   Stack
		want    Result
		wantErr string // substring; the error must also be lease.ErrUnavailable
	}{
		"no layer at all is a NOOP with defaults": {
			stack: Stack{Scope: scope},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess},
				Origin:     map[Field]string{},
			},
		},
		"built-in only": {
			stack: Stack{Scope: scope, Builtin: builtin},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3, Project: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess},
				Origin: map[Field]string{FieldLevelsGlobal: "built-in tex.yaml", FieldLevelsTenant: "built-in tex.yaml",
					FieldLevelsProject: "built-in tex.yaml"},
			},
		},
		"system overrides the built-in field by field": {
			stack: Stack{Scope: scope, Builtin: builtin, System: system},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex2pdf", Caps: Caps{Global: 10, Tenant: 3, Project: 1}, TTL: time.Minute, Wait: DefaultWait, Fairness: FairProcess},
				Origin: map[Field]string{FieldResource: "sys", FieldLevelsGlobal: "sys", FieldLevelsTenant: "built-in tex.yaml",
					FieldLevelsProject: "built-in tex.yaml", FieldTTLSeconds: "sys"},
			},
		},
		"tenant cannot raise the global ceiling": {
			stack: Stack{Scope: scope, Builtin: builtin, System: system, Tenant: tenant},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "acme-tex", Caps: Caps{Global: 10, Tenant: 5, Project: 1}, TTL: time.Minute, Wait: 2 * time.Second, Fairness: FairProcess},
				Origin: map[Field]string{FieldResource: "ten", FieldLevelsGlobal: "sys", FieldLevelsTenant: "ten",
					FieldLevelsProject: "built-in tex.yaml", FieldTTLSeconds: "sys", FieldWaitMs: "ten"},
				Ignored: []Ignored{{Source: "ten", Kind: KindTenant, Fields: []Field{FieldLevelsGlobal}}},
			},
		},
		"only the system layer sets the priorities": {
			stack: Stack{Scope: scope, Builtin: builtin,
				System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex", Tenant: SystemTenant, Project: TenantProject,
					MaxPriority: ptr[int32](5), PriorityAgeBoundSeconds: ptr[int32](30)},
				Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: TenantProject,
					MaxPriority: ptr[int32](1000), PriorityAgeBoundSeconds: ptr[int32](0)},
				Project: &Layer{Kind: KindProject, Source: "prj", Name: "tex", Tenant: "acme", Project: "web",
					MaxPriority: ptr[int32](900)}},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3, Project: 1}, TTL: DefaultTTL, Wait: DefaultWait,
					Fairness: FairProcess, MaxPriority: 5, PriorityAgeBound: 30 * time.Second},
				Origin: map[Field]string{FieldLevelsGlobal: "built-in tex.yaml", FieldLevelsTenant: "built-in tex.yaml",
					FieldLevelsProject: "built-in tex.yaml", FieldMaxPriority: "sys", FieldPriorityAge: "sys"},
				Ignored: []Ignored{
					{Source: "ten", Kind: KindTenant, Fields: []Field{FieldMaxPriority, FieldPriorityAge}},
					{Source: "prj", Kind: KindProject, Fields: []Field{FieldMaxPriority}},
				},
			},
		},
		"only the system layer sets borrowing": {
			stack: Stack{Scope: scope, Builtin: builtin,
				System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex", Tenant: SystemTenant, Project: TenantProject,
					Borrowing: BorrowingLayer{Enabled: ptr(true), GraceSeconds: ptr[int32](2)}},
				Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: TenantProject,
					Borrowing: BorrowingLayer{MaxBorrowed: ptr[int32](100), GraceSeconds: ptr[int32](3600)}},
				Project: &Layer{Kind: KindProject, Source: "prj", Name: "tex", Tenant: "acme", Project: "web",
					Borrowing: BorrowingLayer{Enabled: ptr(false)}}},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3, Project: 1}, TTL: DefaultTTL, Wait: DefaultWait,
					Fairness: FairProcess, Borrowing: Borrowing{Enabled: true, Grace: 2 * time.Second}},
				Origin: map[Field]string{FieldLevelsGlobal: "built-in tex.yaml", FieldLevelsTenant: "built-in tex.yaml",
					FieldLevelsProject: "built-in tex.yaml", FieldBorrowEnabled: "sys", FieldBorrowGrace: "sys"},
				Ignored: []Ignored{
					{Source: "ten", Kind: KindTenant, Fields: []Field{FieldBorrowMax, FieldBorrowGrace}},
					{Source: "prj", Kind: KindProject, Fields: []Field{FieldBorrowEnabled}},
				},
			},
		},
		"a tenant cannot switch borrowing on": {
			stack: Stack{Scope: scope, Builtin: builtin,
				Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: TenantProject,
					Borrowing: BorrowingLayer{Enabled: ptr(true)}}},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3, Project: 1}, TTL: DefaultTTL, Wait: DefaultWait,
					Fairness: FairProcess},
				Origin: map[Field]string{FieldLevelsGlobal: "built-in tex.yaml", FieldLevelsTenant: "built-in tex.yaml",
					FieldLevelsProject: "built-in tex.yaml"},
				Ignored: []Ignored{{Source: "ten", Kind: KindTenant, Fields: []Field{FieldBorrowEnabled}}},
			},
		},
		"project owns only project, user, ttl and wait": {
			stack: Stack{Scope: scope, Builtin: builtin, System: system, Tenant: tenant, Project: project},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "acme-tex", Caps: Caps{Global: 10, Tenant: 5, Project: 2, User: 1}, TTL: 30 * time.Second, Wait: 0, Fairness: FairProcess},
				Origin: map[Field]string{FieldResource: "ten", FieldLevelsGlobal: "sys", FieldLevelsTenant: "ten",
					FieldLevelsProject: "prj", FieldLevelsUser: "prj", FieldTTLSeconds: "prj", FieldWaitMs: "prj"},
				Ignored: []Ignored{
					{Source: "ten", Kind: KindTenant, Fields: []Field{FieldLevelsGlobal}},
					{Source: "prj", Kind: KindProject, Fields: []Field{FieldResource, FieldLevelsGlobal, FieldLevelsTenant}},
				},
			},
		},
		"project layer without wider layers": {
			stack: Stack{Scope: scope, Project: &Layer{Kind: KindProject, Source: "prj", Name: "tex", Tenant: "acme", Project: "web",
				Levels: Levels{User: ptr[int32](1)}}},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{User: 1}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairProcess},
				Origin:     map[Field]string{FieldLevelsUser: "prj"},
			},
		},
		"fairness is the system layer's; tenant and project settings are ignored": {
			stack: Stack{Scope: scope, Builtin: builtin,
				System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex", Tenant: SystemTenant, Project: TenantProject,
					Fairness: ptr(FairGlobal)},
				Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: TenantProject,
					Fairness: ptr(FairProcess)},
				Project: &Layer{Kind: KindProject, Source: "prj", Name: "tex", Tenant: "acme", Project: "web",
					Fairness: ptr(FairProcess), WaitMs: ptr[int32](500)}},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6, Tenant: 3, Project: 1}, TTL: DefaultTTL,
					Wait: 500 * time.Millisecond, Fairness: FairGlobal},
				Origin: map[Field]string{FieldLevelsGlobal: "built-in tex.yaml", FieldLevelsTenant: "built-in tex.yaml",
					FieldLevelsProject: "built-in tex.yaml", FieldWaitMs: "prj", FieldFairness: "sys"},
				Ignored: []Ignored{
					{Source: "ten", Kind: KindTenant, Fields: []Field{FieldFairness}},
					{Source: "prj", Kind: KindProject, Fields: []Field{FieldFairness}},
				},
			},
		},
		"a built-in fairness holds unless the system layer overrides it": {
			stack: Stack{Scope: scope,
				Builtin: &Layer{Kind: KindBuiltin, Source: "built-in tex.yaml", Name: "tex", Levels: Levels{Global: ptr[int32](6)},
					Fairness: ptr(FairGlobal)},
				Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: TenantProject,
					Fairness: ptr(FairProcess)}},
			want: Result{
				Definition: Definition{Name: "tex", Resource: "tex", Caps: Caps{Global: 6}, TTL: DefaultTTL, Wait: DefaultWait, Fairness: FairGlobal},
				Origin:     map[Field]string{FieldLevelsGlobal: "built-in tex.yaml", FieldFairness: "built-in tex.yaml"},
				Ignored:    []Ignored{{Source: "ten", Kind: KindTenant, Fields: []Field{FieldFairness}}},
			},
		},
		"an unknown fairness fails closed, even on a layer that does not own it": {
			stack: Stack{Scope: scope, Builtin: builtin, Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme",
				Project: TenantProject, Fairness: ptr(Fairness("strict"))}},
			wantErr: `ten: fairness: must be process or global, got "strict"`,
		},
		"a cap below 1 fails closed": {
			stack: Stack{Scope: scope, Builtin: builtin, System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex",
				Tenant: SystemTenant, Project: TenantProject, Levels: Levels{Project: ptr[int32](0)}}},
			wantErr: "sys: levels.project: cap must be at least 1, got 0",
		},
		"a broken value in an ignored field still fails closed": {
			stack: Stack{Scope: scope, Project: &Layer{Kind: KindProject, Source: "prj", Name: "tex", Tenant: "acme", Project: "web",
				Levels: Levels{Global: ptr[int32](-1)}}},
			wantErr: "levels.global: cap must be at least 1",
		},
		"ttl and wait out of range": {
			stack: Stack{Scope: scope, System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex",
				Tenant: SystemTenant, Project: TenantProject, TTLSeconds: ptr[int32](0), WaitMs: ptr[int32](-5)}},
			wantErr: "ttlSeconds: must be between 1 and 86400, got 0\nwaitMs: must be between 0 and 600000, got -5",
		},
		"priorities out of range": {
			stack: Stack{Scope: scope, System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex",
				Tenant: SystemTenant, Project: TenantProject, MaxPriority: ptr[int32](1001), PriorityAgeBoundSeconds: ptr[int32](-1)}},
			wantErr: "maxPriority: must be between 0 and 1000, got 1001\npriorityAgeBoundSeconds: must be between 0 and 86400, got -1",
		},
		"borrowing out of range": {
			stack: Stack{Scope: scope, System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex",
				Tenant: SystemTenant, Project: TenantProject, Borrowing: BorrowingLayer{MaxBorrowed: ptr[int32](-1), GraceSeconds: ptr[int32](3601)}}},
			wantErr: "borrowing.maxBorrowed: must be between 0 (up to the global cap) and 100000, got -1\nborrowing.graceSeconds: must be between 0 and 3600, got 3601",
		},
		"invalid resource": {
			stack: Stack{Scope: scope, System: &Layer{Kind: KindSystem, Source: "sys", Name: "tex",
				Tenant: SystemTenant, Project: TenantProject, Resource: ptr("a|b")}},
			wantErr: `resource: "a|b" is not a valid resource`,
		},
		"a document in the wrong slot": {
			stack:   Stack{Scope: scope, System: tenant},
			wantErr: "a tenant document in the system slot",
		},
		"a document of another lease": {
			stack:   Stack{Scope: LayerKey{Name: "browser", Tenant: "acme", Project: "web"}, Builtin: builtin},
			wantErr: `document for lease "tex" in the stack of "browser"`,
		},
		"a document whose scope does not match its kind": {
			stack:   Stack{Scope: scope, Tenant: &Layer{Kind: KindTenant, Source: "ten", Name: "tex", Tenant: "acme", Project: "web"}},
			wantErr: "scope: acme/web is a project scope, not tenant",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := Merge(tc.stack)
			if tc.wantErr != "" {
				if !errors.Is(err, lease.ErrUnavailable) {
					t.Fatalf("Merge() error = %v, want lease.ErrUnavailable", err)
				}
				var ue *UnavailableError
				if !errors.As(err, &ue) || ue.Name != tc.stack.Scope.Name || ue.Tenant != tc.stack.Scope.Tenant {
					t.Errorf("Merge() error = %#v, want an *UnavailableError for the scope", err)
				}
				if !strings.Contains(err.Error(), tc.wantErr) {
					t.Errorf("Merge() error = %q, want it to contain %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("Merge() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Merge() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestOwns(t *testing.T) {
	// The field-ownership table of docs/design.md, spelled out.
	want := map[Field][]Kind{
		FieldLevelsGlobal:  {KindBuiltin, KindSystem},
		FieldFairness:      {KindBuiltin, KindSystem},
		FieldMaxPriority:   {KindBuiltin, KindSystem},
		FieldPriorityAge:   {KindBuiltin, KindSystem},
		FieldBorrowEnabled: {KindBuiltin, KindSystem},
		FieldBorrowMax:     {KindBuiltin, KindSystem},
		FieldBorrowGrace:   {KindBuiltin, KindSystem},
		FieldResource:      {KindBuiltin, KindSystem, KindTenant},
		FieldLevelsTenant:  {KindBuiltin, KindSystem, KindTenant},
		FieldLevelsProject: {KindBuiltin, KindSystem, KindTenant, KindProject},
		FieldLevelsUser:    {KindBuiltin, KindSystem, KindTenant, KindProject},
		FieldTTLSeconds:    {KindBuiltin, KindSystem, KindTenant, KindProject},
		FieldWaitMs:        {KindBuiltin, KindSystem, KindTenant, KindProject},
	}
	got := map[Field][]Kind{}
	for _, f := range AllFields() {
		for _, k := range []Kind{KindBuiltin, KindSystem, KindTenant, KindProject} {
			if Owns(k, f) {
				got[f] = append(got[f], k)
			}
		}
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ownership table mismatch (-want +got):\n%s", diff)
	}
}

func TestScopeKeysAndAffects(t *testing.T) {
	cases := map[string]struct {
		tenant, project string
		want            []LayerKey
	}{
		"project scope": {"acme", "web", []LayerKey{
			{"tex", SystemTenant, TenantProject}, {"tex", "acme", TenantProject}, {"tex", "acme", "web"}}},
		"tenant scope": {"acme", TenantProject, []LayerKey{
			{"tex", SystemTenant, TenantProject}, {"tex", "acme", TenantProject}}},
		"system scope": {SystemTenant, TenantProject, []LayerKey{{"tex", SystemTenant, TenantProject}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := ScopeKeys(tc.tenant, tc.project, "tex")
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ScopeKeys() mismatch (-want +got):\n%s", diff)
			}
			// Every document that applies to a scope is one whose change affects it.
			scope := LayerKey{Name: "tex", Tenant: tc.tenant, Project: tc.project}
			for _, k := range got {
				if !k.Affects(scope) {
					t.Errorf("%v.Affects(%v) = false, want true", k, scope)
				}
			}
		})
	}

	affects := map[string]struct {
		changed, scope LayerKey
		want           bool
	}{
		"system affects another tenant":       {LayerKey{"tex", SystemTenant, TenantProject}, LayerKey{"tex", "b", "p"}, true},
		"system does not affect another name": {LayerKey{"tex", SystemTenant, TenantProject}, LayerKey{"browser", "b", "p"}, false},
		"tenant affects its projects":         {LayerKey{"tex", "a", TenantProject}, LayerKey{"tex", "a", "p"}, true},
		"tenant does not affect another":      {LayerKey{"tex", "a", TenantProject}, LayerKey{"tex", "b", "p"}, false},
		"tenant does not affect the system":   {LayerKey{"tex", "a", TenantProject}, LayerKey{"tex", SystemTenant, TenantProject}, false},
		"project affects its scope":           {LayerKey{"tex", "a", "p"}, LayerKey{"tex", "a", "p"}, true},
		"project does not affect its sibling": {LayerKey{"tex", "a", "p"}, LayerKey{"tex", "a", "q"}, false},
		"project does not affect its tenant":  {LayerKey{"tex", "a", "p"}, LayerKey{"tex", "a", TenantProject}, false},
	}
	for name, tc := range affects {
		t.Run(name, func(t *testing.T) {
			if got := tc.changed.Affects(tc.scope); got != tc.want {
				t.Errorf("%v.Affects(%v) = %v, want %v", tc.changed, tc.scope, got, tc.want)
			}
		})
	}
}

func TestCheckLayer(t *testing.T) {
	own := Layer{Kind: KindTenant, Source: "ns/a", Name: "tex", Tenant: "acme", Project: TenantProject,
		Levels: Levels{Global: ptr[int32](9), Tenant: ptr[int32](2)}}
	other := own
	other.Source = "ns/b"
	cases := map[string]struct {
		layer       Layer
		sameKey     []Layer
		wantIgnored []Field
		wantErr     error
		wantMsg     string
	}{
		"alone, with an ignored field": {layer: own, sameKey: []Layer{own}, wantIgnored: []Field{FieldLevelsGlobal}},
		"a project's fairness is ignored": {
			layer: Layer{Kind: KindProject, Source: "ns/p", Name: "tex", Tenant: "acme", Project: "web",
				Levels: Levels{User: ptr[int32](1)}, Fairness: ptr(FairGlobal)},
			wantIgnored: []Field{FieldFairness}},
		"in conflict": {layer: own, sameKey: []Layer{other, own}, wantIgnored: []Field{FieldLevelsGlobal},
			wantErr: ErrConflict, wantMsg: "conflicting lease definitions: ns/a, ns/b"},
		"invalid": {layer: Layer{Kind: KindProject, Source: "x", Name: "-bad", Tenant: "acme", Project: "p"},
			wantMsg: `name: "-bad" is not a valid lease name`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			ignored, err := CheckLayer(tc.layer, tc.sameKey)
			if diff := cmp.Diff(tc.wantIgnored, ignored); diff != "" {
				t.Errorf("ignored mismatch (-want +got):\n%s", diff)
			}
			if tc.wantMsg == "" {
				if err != nil {
					t.Fatalf("CheckLayer() error = %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Fatalf("CheckLayer() error = %v, want %q", err, tc.wantMsg)
			}
			if tc.wantErr != nil && !errors.Is(err, tc.wantErr) {
				t.Errorf("CheckLayer() error = %v, want errors.Is %v", err, tc.wantErr)
			}
		})
	}
}
