package liveapi_test

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// acquireUnder acquires lease name for tenant/p1/user through the admission path (the
// suite's definitions decide the caps) and releases it on cleanup.
func acquireUnder(t testing.TB, name, tenant, user string) leasing.Lease {
	t.Helper()
	l, err := svc.Acquire(ctxT(t), leasing.Request{Type: "tex", Lease: name, Tenant: tenant, Project: "p1", User: user,
		HolderRef: "job", Pod: self, PodBound: true})
	if err != nil {
		t.Fatalf("acquire %s for %s/%s: %v", name, tenant, user, err)
	}
	t.Cleanup(func() { _, _ = svc.Release(ctxT(t), l.Token) })
	return l
}

// publishedCap is what a counter says about its cap.
type publishedCap struct {
	Cap    int64
	Reason string
	Note   string
}

// counterCaps lists the counters of resource res in ns as cfg sees them, by name.
func counterCaps(t testing.TB, cfg *rest.Config, ns, res string) map[string]publishedCap {
	t.Helper()
	list, err := client(t, cfg).Resource(counters).Namespace(ns).List(ctxT(t),
		metav1.ListOptions{LabelSelector: livev1alpha1.LabelResource + "=" + res})
	if err != nil {
		t.Fatalf("listing %s counters in %s: %v", res, ns, err)
	}
	out := map[string]publishedCap{}
	for _, it := range list.Items {
		n, _, _ := unstructured.NestedInt64(it.Object, "cap")
		reason, _, _ := unstructured.NestedString(it.Object, "capReason")
		note, _, _ := unstructured.NestedString(it.Object, "capNote")
		out[it.GetName()] = publishedCap{Cap: n, Reason: reason, Note: note}
	}
	return out
}

// TestCountersPublishTheirCap: every level publishes the cap of the definition its holders
// were admitted under, in the tenant's namespace and in the operator's; a level on which
// two definitions of one resource disagree publishes no cap but says it is ambiguous, one
// on which they agree publishes the common cap.
func TestCountersPublishTheirCap(t *testing.T) {
	acquireUnder(t, "capped", "acme", "u1")
	acquireUnder(t, "capped", "acme", "u1")
	acquireUnder(t, "capped", "globex", "u1")

	want := map[string]publishedCap{
		"capped.tenant.acme":     {Cap: 5},
		"capped.project.acme:p1": {Cap: 3},
		"capped.user.acme:u1":    {Cap: 2},
	}
	if d := cmp.Diff(want, counterCaps(t, alice, nsAcme, "capped")); d != "" {
		t.Errorf("capped counters alice sees (-want +got):\n%s", d)
	}
	if d := cmp.Diff(map[string]publishedCap{"capped.global": {Cap: 9}}, counterCaps(t, operator, systemNS, "capped")); d != "" {
		t.Errorf("capped counters of the system namespace (-want +got):\n%s", d)
	}

	acquireUnder(t, "share-a", "acme", "u1")
	acquireUnder(t, "share-b", "acme", "u2")
	want = map[string]publishedCap{
		"shared.tenant.acme": {Cap: 3},
		"shared.project.acme:p1": {Reason: livev1alpha1.CapReasonAmbiguous,
			Note: "ambiguous: lease share-a in acme/p1 (cap 2); lease share-b in acme/p1 (cap 3) share this counter"},
	}
	if d := cmp.Diff(want, counterCaps(t, alice, nsAcme, "shared")); d != "" {
		t.Errorf("shared counters alice sees (-want +got):\n%s", d)
	}
}

// TestCounterCapUnknown: counters whose cap no current definition states publish none and
// say why, and the list still answers: a lease name without a definition (a NOOP now), a
// lease name the resolver refuses, a definition that now books another resource, and a
// counter nobody books any more.
func TestCounterCapUnknown(t *testing.T) {
	acquire(t, "acme", "undefined", "u1")
	acquireAs(t, "not a lease name", "acme", "refused", "u1")
	acquireAs(t, "capped", "acme", "moved", "u1")
	for _, tc := range []struct {
		res, reason string
		note        func(level string) string
	}{
		{"undefined", livev1alpha1.CapReasonUncapped, func(level string) string {
			return "the current definition of lease undefined in acme/p1 does not cap the " + level + " level"
		}},
		{"refused", livev1alpha1.CapReasonUnresolved, nil},
		{"moved", livev1alpha1.CapReasonUnresolved, func(string) string {
			return `the definition of lease capped in acme/p1 could not be resolved: it now books resource "capped"`
		}},
	} {
		got := counterCaps(t, alice, nsAcme, tc.res)
		if len(got) != 3 {
			t.Fatalf("%s counters = %v, want the tenant, project and user levels", tc.res, got)
		}
		for name, c := range got {
			want := publishedCap{Reason: tc.reason, Note: c.Note}
			if tc.note != nil {
				want.Note = tc.note(strings.Split(name, ".")[1])
			}
			if c.Note == "" {
				t.Errorf("%s publishes no note", name)
			}
			if d := cmp.Diff(want, c); d != "" {
				t.Errorf("%s (-want +got):\n%s", name, d)
			}
		}
	}

	l := acquireUnder(t, "capped", "globex", "u9")
	if _, err := svc.Release(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}
	c, ok := counterCaps(t, bob, nsGlobex, "capped")["capped.user.globex:u9"]
	if !ok {
		t.Fatal("globex's released user counter is gone; the test needs the store to keep it until reconcile")
	}
	if d := cmp.Diff(publishedCap{Reason: livev1alpha1.CapReasonNotBooked, Note: "no holder books this counter"}, c); d != "" {
		t.Errorf("released counter (-want +got):\n%s", d)
	}
}

// TestKubectlShowsCaps: kubectl get leasecounters prints the CAP column, a number or why
// there is none, and -o wide the note.
func TestKubectlShowsCaps(t *testing.T) {
	acquireUnder(t, "share-a", "acme", "u1")
	acquireUnder(t, "share-b", "acme", "u2")

	out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lc", "-l", livev1alpha1.LabelResource+"=shared")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if got := strings.Join(fields(lines[0]), " "); got != "NAME RESOURCE LEVEL SCOPE COUNT CAP BOOKED DRIFT BORROWED WAITING UPDATED" {
		t.Fatalf("header = %q", got)
	}
	caps := map[string]string{}
	for _, l := range lines[1:] {
		f := fields(l)
		caps[f[0]] = f[5]
	}
	if d := cmp.Diff(map[string]string{"shared.tenant.acme": "3", "shared.project.acme:p1": "<ambiguous>"}, caps); d != "" {
		t.Errorf("CAP column (-want +got):\n%s", d)
	}
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lc", "shared.project.acme:p1", "-o", "wide")
	if !strings.Contains(out, "ambiguous: lease share-a in acme/p1 (cap 2); lease share-b in acme/p1 (cap 3) share this counter") {
		t.Errorf("kubectl get lc -o wide lacks the note:\n%s", out)
	}
}
