package liveapi

import (
	"encoding/base64"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

var testTenants = tenancy.Static{System: "lease-system", Tenants: map[string]string{
	"acme": "acme", "acme-ci": "acme", "globex": "globex", "lease-system-tenant": "sys",
}}

// TestWhereObjectsAppear: the namespace rules of docs/live-api.md, for every kind of
// request namespace and object.
func TestWhereObjectsAppear(t *testing.T) {
	v := &views{tenants: testTenants}
	counter := func(level lease.Level, scope string) lease.Counter {
		return lease.Counter{Resource: "tex", Level: level, Scope: scope}
	}
	cases := map[string]struct {
		namespace string
		holderOf  string        // a holder of this tenant
		counter   lease.Counter // or this counter
		want      []string
	}{
		"tenant namespace shows its tenant":          {namespace: "acme", holderOf: "acme", want: []string{"acme"}},
		"every namespace of a tenant shows it":       {namespace: "acme-ci", holderOf: "acme", want: []string{"acme-ci"}},
		"tenant namespace hides another tenant":      {namespace: "acme", holderOf: "globex", want: nil},
		"system namespace hides tenants with one":    {namespace: "lease-system", holderOf: "acme", want: nil},
		"system namespace shows tenants without one": {namespace: "lease-system", holderOf: "orphan", want: []string{"lease-system"}},
		"an unrelated namespace shows nothing":       {namespace: "default", holderOf: "orphan", want: nil},
		"all namespaces: each of the tenant's":       {namespace: "", holderOf: "acme", want: []string{"acme", "acme-ci"}},
		"all namespaces: orphan in system":           {namespace: "", holderOf: "orphan", want: []string{"lease-system"}},
		"global level only in system":                {namespace: "", counter: counter(lease.LevelGlobal, "*"), want: []string{"lease-system"}},
		"global level never in a tenant's":           {namespace: "acme", counter: counter(lease.LevelGlobal, "*"), want: nil},
		"user level in the tenant's namespaces":      {namespace: "", counter: counter(lease.LevelUser, "acme/u1"), want: []string{"acme", "acme-ci"}},
		"project level of an orphan in system":       {namespace: "lease-system", counter: counter(lease.LevelProject, "orphan/p"), want: []string{"lease-system"}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			candidates := v.counterNamespaces(tc.counter)
			if tc.holderOf != "" {
				candidates = v.namespacesOfTenant(tc.holderOf)
			}
			got := v.scopeOf(tc.namespace).in(candidates)
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Errorf("namespaces (-want +got):\n%s", d)
			}
		})
	}
}

func TestCounterNames(t *testing.T) {
	cases := map[string]struct {
		c    lease.Counter
		want string
	}{
		"global":  {lease.Counter{Resource: "tex", Level: lease.LevelGlobal, Scope: "*"}, "tex.global"},
		"tenant":  {lease.Counter{Resource: "tex", Level: lease.LevelTenant, Scope: "acme"}, "tex.tenant.acme"},
		"user":    {lease.Counter{Resource: "tex-2", Level: lease.LevelUser, Scope: "acme.eu/bob.x"}, "tex-2.user.acme.eu:bob.x"},
		"project": {lease.Counter{Resource: "pdf_a", Level: lease.LevelProject, Scope: "a/p"}, "pdf_a.project.a:p"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := counterName(tc.c)
			if got != tc.want {
				t.Errorf("counterName = %q, want %q", got, tc.want)
			}
			r, l, ok := splitCounterName(got)
			if !ok || r != tc.c.Resource || l != tc.c.Level {
				t.Errorf("splitCounterName(%q) = %q, %q, %v", got, r, l, ok)
			}
		})
	}
}

func TestContinueTokens(t *testing.T) {
	id := lease.HolderID("0123456789abcdef0123456789abcdef")
	got, err := decodeContinue(encodeContinue(id, "acme"), "acme")
	if err != nil || got != id {
		t.Errorf("round trip = %q, %v", got, err)
	}
	for name, bad := range map[string]string{
		"not base64":         "!!",
		"no prefix":          "aGVsbG8",
		"cut":                encodeContinue(id, "acme")[:2],
		"another namespace":  encodeContinue(id, "globex"),
		"a token (h1)":       base64.RawURLEncoding.EncodeToString([]byte("h1:0123456789abcdef0123456789abcdef")),
		"a token after h2":   encodeContinue("0123456789abcdef0123456789abcdef", "acme"),
		"all namespaces one": encodeContinue(id, ""),
	} {
		if _, err := decodeContinue(bad, "acme"); err == nil {
			t.Errorf("%s: decodeContinue(%q) accepted", name, bad)
		}
	}
}
