package k8stenancy

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

func TestPermits(t *testing.T) {
	m := tenancy.Static{System: "lease-system", Tenants: map[string]string{
		"acme-dev": "acme", "acme-prod": "acme", "globex": "globex", "empty": "",
	}}
	type want struct {
		reason, message string
		ok              bool
	}
	denied := func(msg string) want {
		return want{leasev1alpha1.ReasonNamespaceNotPermitted, msg, false}
	}
	cases := map[string]struct {
		namespace, tenant, project string
		want                       want
	}{
		"system layer in the system namespace": {"lease-system", "_vance", "_tenant", want{ok: true}},
		"system layer elsewhere": {"team-a", "_vance", "_tenant", denied(
			`Namespace "team-a" may not hold the system layer (tenant _vance, project _tenant); only the system namespace "lease-system" may`)},
		"system layer in a tenant namespace": {"acme-dev", "_vance", "_tenant", denied(
			`Namespace "acme-dev" may not hold the system layer (tenant _vance, project _tenant); only the system namespace "lease-system" may`)},
		"tenant layer in its namespace":  {"acme-dev", "acme", "_tenant", want{ok: true}},
		"project layer in its namespace": {"acme-prod", "acme", "thesis", want{ok: true}},
		"tenant layer in another tenant's namespace": {"globex", "acme", "_tenant", denied(
			`Namespace "globex" is labelled lease.vancetope.io/tenant=globex, so it may not hold a tenant layer of tenant "acme"; it belongs in a namespace labelled lease.vancetope.io/tenant=acme ("acme-dev", "acme-prod")`)},
		"project layer in an unlabelled namespace": {"team-a", "acme", "thesis", denied(
			`Namespace "team-a" is not labelled lease.vancetope.io/tenant, so it may not hold a project layer of tenant "acme"; it belongs in a namespace labelled lease.vancetope.io/tenant=acme ("acme-dev", "acme-prod")`)},
		"empty label is no tenant": {"empty", "initech", "_tenant", denied(
			`Namespace "empty" is not labelled lease.vancetope.io/tenant, so it may not hold a tenant layer of tenant "initech"; it belongs in a namespace labelled lease.vancetope.io/tenant=initech`)},
		"tenant layer in the system namespace": {"lease-system", "acme", "_tenant", denied(
			`Namespace "lease-system" is not labelled lease.vancetope.io/tenant, so it may not hold a tenant layer of tenant "acme"; it belongs in a namespace labelled lease.vancetope.io/tenant=acme ("acme-dev", "acme-prod")`)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got want
			got.reason, got.message, got.ok = Permits(tc.namespace, tc.tenant, tc.project, m)
			if diff := cmp.Diff(tc.want, got, cmp.AllowUnexported(want{})); diff != "" {
				t.Errorf("Permits() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestPermitsWithoutSystemNamespace(t *testing.T) {
	// An empty system namespace (not configured) permits no system layer, not the documents of
	// namespace "".
	if _, _, ok := Permits("", "_vance", "_tenant", tenancy.Static{}); ok {
		t.Error("Permits() allowed a system layer with no system namespace configured")
	}
}
