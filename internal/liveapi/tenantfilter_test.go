package liveapi_test

import (
	"fmt"
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
)

// listRead lists gvr in ns with the field selector as cfg and returns the objects as
// ns/name and how many documents the store's replies carried meanwhile.
func listRead(t *testing.T, cfg *rest.Config, gvr schema.GroupVersionResource, ns, fieldSel string) ([]string, int64) {
	t.Helper()
	docs0 := storeDocs.Load()
	list, err := client(t, cfg).Resource(gvr).Namespace(ns).List(ctxT(t), metav1.ListOptions{FieldSelector: fieldSel, Limit: 500})
	read := storeDocs.Load() - docs0
	if err != nil {
		t.Fatalf("listing %s in %q with %s: %v", gvr.Resource, ns, fieldSel, err)
	}
	var out []string
	for _, it := range list.Items {
		out = append(out, it.GetNamespace()+"/"+it.GetName())
	}
	slices.Sort(out)
	return out, read
}

// TestTenantFilterReadsWhatItReturns: listing one tenant's holders or counters across every
// namespace (what `kubectl lease list|counters --tenant` asks) reads that tenant's documents
// from the store, not every tenant's (docs/operations.md, "Behaviour at scale"); a tenant
// selector in another tenant's namespace reads nothing.
func TestTenantFilterReadsWhatItReturns(t *testing.T) {
	const res = "tenantviews"
	for i := range 20 {
		acquire(t, fmt.Sprintf("crowd%02d", i), res, "u")
	}
	// Tenant lonely has no namespace: its objects appear in the system namespace.
	mine := []string{lease.HolderID(acquire(t, "lonely", res, "u1").Token), lease.HolderID(acquire(t, "lonely", res, "u2").Token)}

	got, read := listRead(t, operator, holders, "", "spec.tenant=lonely")
	want := []string{systemNS + "/" + mine[0], systemNS + "/" + mine[1]}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("holders of tenant lonely (-want +got):\n%s", diff)
	}
	if read != int64(len(mine)) {
		t.Errorf("listing %d holders of one tenant read %d holder documents, want %d", len(mine), read, len(mine))
	}

	got, read = listRead(t, operator, counters, "", livev1alpha1.FieldCounterTenant+"=lonely")
	want = []string{systemNS + "/" + res + ".tenant.lonely", systemNS + "/" + res + ".project.lonely:p1",
		systemNS + "/" + res + ".user.lonely:u1", systemNS + "/" + res + ".user.lonely:u2"}
	slices.Sort(want)
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters of tenant lonely (-want +got):\n%s", diff)
	}
	// The tenant's four counters, and its two holders for BOOKED and the caps.
	if wantRead := int64(len(want) + len(mine)); read != wantRead {
		t.Errorf("listing %d counters of one tenant read %d documents, want %d", len(want), read, wantRead)
	}

	// Another tenant's selector in acme's namespace: nothing, and nothing read.
	for _, gvr := range []schema.GroupVersionResource{holders, counters} {
		sel := "spec.tenant=lonely"
		if gvr == counters {
			sel = livev1alpha1.FieldCounterTenant + "=lonely"
		}
		got, read := listRead(t, alice, gvr, nsAcme, sel)
		if len(got) != 0 || read != 0 {
			t.Errorf("%s of tenant lonely in namespace %s: %v, read %d documents; want none", gvr.Resource, nsAcme, got, read)
		}
	}
}

// TestCounterFieldSelectors: an unknown field is refused, as Kubernetes answers.
func TestCounterFieldSelectors(t *testing.T) {
	_, err := client(t, operator).Resource(counters).Namespace("").List(ctxT(t), metav1.ListOptions{FieldSelector: "spec.tenant=acme"})
	if !apierrors.IsBadRequest(err) {
		t.Errorf("spec.tenant on leasecounters: %v, want a 400", err)
	}
}
