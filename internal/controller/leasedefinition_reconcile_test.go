package controller

import (
	"context"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	clocktesting "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// layersFunc is a definition.LayerSource.
type layersFunc func(key definition.LayerKey) []definition.Layer

func (f layersFunc) Layers(_ context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	return f(key), nil
}

func (f layersFunc) SystemLayers(context.Context) ([]definition.Layer, error) {
	return nil, nil
}

// explainFunc is an Explainer.
type explainFunc func(tenant, project, name string) (definition.Result, error)

func (f explainFunc) Explain(_ context.Context, tenant, project, name string) (definition.Result, error) {
	return f(tenant, project, name)
}

// staleReader answers Get with a fixed older copy of the object, as a lagging informer cache
// does right after the reconciler's own status write; every other call reaches the server.
type staleReader struct {
	client.Client
	stale *leasev1alpha1.LeaseDefinition
}

func (s staleReader) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	if ld, ok := obj.(*leasev1alpha1.LeaseDefinition); ok && s.stale != nil && key == client.ObjectKeyFromObject(s.stale) {
		s.stale.DeepCopyInto(ld)
		return nil
	}
	return s.Client.Get(ctx, key, obj, opts...)
}

// TestReconcileNeverPatchesFromAStaleCopy is the race behind a flaky envtest spec: the
// reconciler writes Ready=True with an effective definition, and reconciles again (a peer
// appeared, so now a conflict) before its cache shows that write. A patch computed against
// the stale copy (no status yet) left the effective definition in place under a Conflict
// condition, and nothing reconciled the object again.
func TestReconcileNeverPatchesFromAStaleCopy(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := leasev1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	obj := &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "first", Generation: 1},
		Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "a", Project: "p",
			Levels: &leasev1alpha1.LeaseLevels{Project: ptr.To[int32](1)}},
	}
	server := fake.NewClientBuilder().WithScheme(scheme).WithObjects(obj).
		WithStatusSubresource(&leasev1alpha1.LeaseDefinition{}).Build()
	ctx := context.Background()
	var before leasev1alpha1.LeaseDefinition
	if err := server.Get(ctx, client.ObjectKeyFromObject(obj), &before); err != nil {
		t.Fatal(err)
	}

	tenants := tenancy.Static{System: "lease-system", Tenants: map[string]string{"team-a": "a", "team-a2": "a"}}
	self := k8ssource.LayerFrom(obj)
	peer := self
	peer.Source = "LeaseDefinition team-a2/second"
	sameKey := []definition.Layer{self}
	layers := layersFunc(func(definition.LayerKey) []definition.Layer { return sameKey })
	explain := explainFunc(func(_, _, name string) (definition.Result, error) {
		return definition.Result{Definition: definition.Definition{Name: name, Resource: name,
			Caps: definition.Caps{Project: 1}, TTL: time.Minute}}, nil
	})
	clk := clocktesting.NewFakePassiveClock(time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC))
	req := ctrl.Request{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "first"}}
	current := func() leasev1alpha1.LeaseDefinitionStatus {
		t.Helper()
		var got leasev1alpha1.LeaseDefinition
		if err := server.Get(ctx, req.NamespacedName, &got); err != nil {
			t.Fatal(err)
		}
		return got.Status
	}

	// Alone at its key: Ready, with an effective definition.
	fresh := NewLeaseDefinitionReconciler(server, layers, explain, tenants, clk)
	if _, err := fresh.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	if current().Effective == nil {
		t.Fatal("no effective definition after the first reconcile")
	}

	// The peer appears; the cache still shows the object as it was before the first write.
	sameKey = []definition.Layer{self, peer}
	stale := NewLeaseDefinitionReconciler(staleReader{Client: server, stale: &before}, layers, explain, tenants, clk)
	_, err := stale.Reconcile(ctx, req)
	if err != nil && !apierrors.IsConflict(err) {
		t.Fatalf("reconcile from a stale copy: %v, want nil or a conflict", err)
	}
	if err == nil {
		assertConflictStatus(t, current())
		return
	}
	// Refused: the retry reads the cache again, which by then shows the write.
	if _, err := fresh.Reconcile(ctx, req); err != nil {
		t.Fatal(err)
	}
	assertConflictStatus(t, current())
}

func assertConflictStatus(t *testing.T, st leasev1alpha1.LeaseDefinitionStatus) {
	t.Helper()
	ready := meta.FindStatusCondition(st.Conditions, leasev1alpha1.ConditionReady)
	if ready == nil || ready.Reason != leasev1alpha1.ReasonConflict {
		t.Errorf("Ready = %+v, want reason %s", ready, leasev1alpha1.ReasonConflict)
	}
	if st.Effective != nil {
		t.Errorf("a conflicting object still shows an effective definition: %s", cmp.Diff(nil, st.Effective))
	}
}
