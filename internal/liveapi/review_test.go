package liveapi_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// review creates a LeaseAcquisitionReview of spec in ns as cfg and returns its answer.
func review(t *testing.T, cfg *rest.Config, ns string, spec livev1alpha1.LeaseAcquisitionReviewSpec) (livev1alpha1.LeaseAcquisitionReview, error) {
	t.Helper()
	in := &livev1alpha1.LeaseAcquisitionReview{
		TypeMeta:   metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "LeaseAcquisitionReview"},
		ObjectMeta: metav1.ObjectMeta{GenerateName: "test-"},
		Spec:       spec,
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(in)
	if err != nil {
		t.Fatal(err)
	}
	var out livev1alpha1.LeaseAcquisitionReview
	got, err := client(t, cfg).Resource(reviewGVR).Namespace(ns).Create(ctxT(t), &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if err != nil {
		return out, err
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(got.Object, &out); err != nil {
		t.Fatal(err)
	}
	return out, nil
}

// TestAcquisitionReview: a review in a tenant's namespace answers the admission API's dry
// run for that tenant, for whoever may view the namespace, and writes nothing.
func TestAcquisitionReview(t *testing.T) {
	capped := livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1", User: "rita"}

	before := storeCommands.Load()
	got, err := review(t, alice, nsAcme, capped)
	if err != nil {
		t.Fatalf("alice reviews in acme: %v", err)
	}
	if n := storeCommands.Load() - before; n != 1 {
		t.Errorf("a granted review sent %d store commands, want the one read of the counters", n)
	}
	want := livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewGranted, Tenant: "acme", Resource: "capped",
		Levels: []livev1alpha1.ReviewLevel{{Level: "user", Scope: "acme/rita", Cap: 2}, {Level: "project", Scope: "acme/p1", Cap: 3},
			{Level: "tenant", Scope: "acme", Cap: 5}, {Level: "global", Scope: "*", Cap: 9}}}
	got.Status.Message = ""
	if diff := cmp.Diff(want, got.Status); diff != "" {
		t.Errorf("granted review (-want +got):\n%s", diff)
	}
	if !strings.HasPrefix(got.Name, "test-") || got.Namespace != nsAcme {
		t.Errorf("review answered as %s/%s", got.Namespace, got.Name)
	}

	// Rita holds both of her slots: the review names her full user level.
	acquireUnder(t, "capped", "acme", "rita")
	l := acquireUnder(t, "capped", "acme", "rita")
	if err := svc.Drain(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	hs, err := store.ListHolders(ctxT(t), leasestore.HolderFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	before = storeCommands.Load()
	got, err = review(t, alice, nsAcme, capped)
	if err != nil {
		t.Fatal(err)
	}
	if n := storeCommands.Load() - before; n < 1 || n > 3 {
		t.Errorf("a busy review sent %d store commands, want the read of the counters and of the full level's line and hold times", n)
	}
	if got.Status.Outcome != livev1alpha1.ReviewBusy || got.Status.Resource != "capped" ||
		!cmp.Equal(got.Status.Busy, &livev1alpha1.ReviewBusyLevel{Level: "user", Scope: "acme/rita", Count: 2, Cap: 2, Position: ptr.To(int64(0))}) ||
		!strings.Contains(got.Status.Message, "LEASE_BUSY") {
		t.Errorf("review of a full user level = %+v, busy %+v", got.Status, got.Status.Busy)
	}
	after, err := store.ListHolders(ctxT(t), leasestore.HolderFilter{Tenant: "acme"})
	if err != nil || len(after) != len(hs) {
		t.Errorf("holders of acme: %d before the review, %d after (%v)", len(hs), len(after), err)
	}
	if _, err := svc.Release(ctxT(t), l.Token); err != nil {
		t.Fatal(err)
	}

	for name, tc := range map[string]struct {
		spec    livev1alpha1.LeaseAcquisitionReviewSpec
		outcome string
	}{
		"no lease":       {livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "none", Project: "p1"}, livev1alpha1.ReviewNoOp},
		"no reference":   {livev1alpha1.LeaseAcquisitionReviewSpec{Project: "p1"}, livev1alpha1.ReviewNoOp},
		"own tenant":     {livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Tenant: "acme", Project: "p1", User: "rita"}, livev1alpha1.ReviewGranted},
		"a handled type": {livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1", User: "rita", Type: "tex"}, livev1alpha1.ReviewGranted},
	} {
		got, err := review(t, alice, nsAcme, tc.spec)
		if err != nil || got.Status.Outcome != tc.outcome {
			t.Errorf("%s: review = %+v, %v; want outcome %s", name, got.Status, err, tc.outcome)
		}
	}
}

// TestAcquisitionReviewRefusals: a review is refused as the acquisition it describes is (422
// naming the spec field), for another tenant than the namespace's (403), and by RBAC.
func TestAcquisitionReviewRefusals(t *testing.T) {
	for name, tc := range map[string]struct {
		cfg   *rest.Config
		ns    string
		spec  livev1alpha1.LeaseAcquisitionReviewSpec
		check func(error) bool
		field string
	}{
		"user level without user": {alice, nsAcme, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1"}, apierrors.IsInvalid, "spec.user"},
		"bad project":             {alice, nsAcme, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p/1", User: "u"}, apierrors.IsInvalid, "spec.project"},
		"bad lease name":          {alice, nsAcme, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "ca pped", Project: "p1"}, apierrors.IsInvalid, "spec.lease"},
		"a type without handler":  {alice, nsAcme, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1", User: "u", Type: "pdf"}, apierrors.IsInvalid, "spec.type"},
		"another tenant":          {alice, nsAcme, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Tenant: "globex", Project: "p1", User: "u"}, apierrors.IsForbidden, ""},
		"RBAC: another namespace": {alice, nsGlobex, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1", User: "u"}, apierrors.IsForbidden, ""},
		"system namespace, no tenant": {operator, systemNS, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1", User: "u"},
			apierrors.IsInvalid, "spec.tenant"},
		"a namespace of no tenant": {operator, "default", livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Project: "p1", User: "u"}, apierrors.IsForbidden, ""},
	} {
		before := storeCommands.Load()
		_, err := review(t, tc.cfg, tc.ns, tc.spec)
		if !tc.check(err) {
			t.Errorf("%s: err = %v", name, err)
			continue
		}
		if tc.field != "" && !errorNames(err, tc.field) {
			t.Errorf("%s: %v does not name %s", name, err, tc.field)
		}
		if n := storeCommands.Load() - before; n != 0 {
			t.Errorf("%s: a refused review sent %d store commands", name, n)
		}
	}

	// The operator reviews for any tenant from the system namespace.
	got, err := review(t, operator, systemNS, livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Tenant: "orphan", Project: "p1", User: "u"})
	if err != nil || got.Status.Outcome != livev1alpha1.ReviewGranted || got.Status.Tenant != "orphan" {
		t.Errorf("operator reviews for tenant orphan in the system namespace = %+v, %v", got.Status, err)
	}
}

// errorNames reports whether an Invalid error names field among its causes.
func errorNames(err error, field string) bool {
	var status apierrors.APIStatus
	if !errors.As(err, &status) || status.Status().Details == nil {
		return false
	}
	for _, c := range status.Status().Details.Causes {
		if c.Field == field {
			return true
		}
	}
	return false
}

// TestAcquisitionReviewOfSeveralLeases: a review of several leases (spec.leases, issue 45)
// answers for the whole set as the admission API's dry run does: granted with each part's
// levels in the order of the resources, busy naming the first full part, and a bad list
// refused as 422 naming spec.leases; nothing is booked.
func TestAcquisitionReviewOfSeveralLeases(t *testing.T) {
	set := livev1alpha1.LeaseAcquisitionReviewSpec{Leases: []string{"share-a", "capped"}, Project: "p45", User: "ula"}

	before := storeCommands.Load()
	got, err := review(t, alice, nsAcme, set)
	if err != nil {
		t.Fatalf("alice reviews share-a and capped in acme: %v", err)
	}
	if n := storeCommands.Load() - before; n != 2 {
		t.Errorf("a granted review of two leases sent %d store commands, want one read of the counters per lease", n)
	}
	want := livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewGranted, Tenant: "acme", Resource: "capped+shared",
		Parts: []livev1alpha1.ReviewPart{
			{Lease: "capped", Resource: "capped", Levels: []livev1alpha1.ReviewLevel{{Level: "user", Scope: "acme/ula", Cap: 2},
				{Level: "project", Scope: "acme/p45", Cap: 3}, {Level: "tenant", Scope: "acme", Cap: 5}, {Level: "global", Scope: "*", Cap: 9}}},
			{Lease: "share-a", Resource: "shared", Levels: []livev1alpha1.ReviewLevel{{Level: "project", Scope: "acme/p45", Cap: 2},
				{Level: "tenant", Scope: "acme", Cap: 3}}},
		}}
	msg := got.Status.Message
	got.Status.Message = ""
	if diff := cmp.Diff(want, got.Status); diff != "" {
		t.Errorf("granted review of two leases (-want +got):\n%s", diff)
	}
	if !strings.Contains(msg, "leases capped, share-a would be granted, all of them together") {
		t.Errorf("granted review of two leases says %q", msg)
	}
	// kubectl alone reads the parts.
	file := filepath.Join(t.TempDir(), "review.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: live.lease.vancetope.io/v1alpha1
kind: LeaseAcquisitionReview
metadata: {generateName: ask-}
spec: {leases: [share-a, capped], project: p45, user: ula}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	out := mustKubectl(t, aliceFile, "-n", nsAcme, "create", "--validate=false", "-f", file, "-o",
		"jsonpath={.status.outcome} {.status.resource} {.status.parts[*].lease} {.status.parts[1].levels[0].scope}")
	if out != "granted capped+shared capped share-a acme/p45" {
		t.Errorf("kubectl create of a review of two leases answered %q", out)
	}

	// Project p45 holds both of its slots of shared: the review names share-a's full project
	// level, though capped has room.
	for range 2 {
		l, err := svc.Acquire(ctxT(t), leasing.Request{Type: "tex", Lease: "share-a", Tenant: "acme", Project: "p45", User: "u45",
			HolderRef: "job", Pod: self, PodBound: true})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = svc.Release(context.Background(), l.Token) })
	}
	hs, err := store.ListHolders(ctxT(t), leasestore.HolderFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	got, err = review(t, alice, nsAcme, set)
	if err != nil {
		t.Fatal(err)
	}
	// The estimate depends on the hold times other tests left on shared.
	if got.Status.Busy != nil {
		got.Status.Busy.EstimatedWaitMs = 0
	}
	if got.Status.Outcome != livev1alpha1.ReviewBusy || got.Status.Resource != "shared" || got.Status.Parts != nil ||
		!cmp.Equal(got.Status.Busy, &livev1alpha1.ReviewBusyLevel{Lease: "share-a", Level: "project", Scope: "acme/p45", Count: 2, Cap: 2, Position: ptr.To(int64(0))}) ||
		!strings.Contains(got.Status.Message, "(part share-a)") {
		t.Errorf("review of two leases, share-a full = %+v, busy %+v", got.Status, got.Status.Busy)
	}
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "create", "--validate=false", "-f", file, "-o", "jsonpath={.status.outcome} {.status.busy.lease} {.status.busy.level}")
	if out != "busy share-a project" {
		t.Errorf("kubectl create of a busy review of two leases answered %q", out)
	}
	after, err := store.ListHolders(ctxT(t), leasestore.HolderFilter{Tenant: "acme"})
	if err != nil || len(after) != len(hs) {
		t.Errorf("holders of acme: %d before the reviews, %d after (%v)", len(hs), len(after), err)
	}

	for name, tc := range map[string]struct {
		spec   livev1alpha1.LeaseAcquisitionReviewSpec
		detail string
	}{
		"a name twice":               {livev1alpha1.LeaseAcquisitionReviewSpec{Leases: []string{"capped", "capped"}, Project: "p45", User: "ula"}, "names capped twice"},
		"two leases of one resource": {livev1alpha1.LeaseAcquisitionReviewSpec{Leases: []string{"share-a", "share-b"}, Project: "p45"}, "book the same resource shared"},
		"beside lease":               {livev1alpha1.LeaseAcquisitionReviewSpec{Lease: "capped", Leases: []string{"share-a"}, Project: "p45", User: "ula"}, "exclusive"},
	} {
		before := storeCommands.Load()
		_, err := review(t, alice, nsAcme, tc.spec)
		if !apierrors.IsInvalid(err) || !errorNames(err, "spec.leases") || !strings.Contains(err.Error(), tc.detail) {
			t.Errorf("%s: err = %v, want 422 naming spec.leases: %s", name, err, tc.detail)
		}
		if n := storeCommands.Load() - before; n != 0 {
			t.Errorf("%s: a refused review sent %d store commands", name, n)
		}
	}
}
