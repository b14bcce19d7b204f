package k8ssource

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
)

type recorder struct{ keys []definition.LayerKey }

func (r *recorder) Invalidate(k definition.LayerKey) { r.keys = append(r.keys, k) }

func TestInvalidationHandler(t *testing.T) {
	obj := func(gen int64, tenant string) *leasev1alpha1.LeaseDefinition {
		return &leasev1alpha1.LeaseDefinition{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "x", Generation: gen},
			Spec:       leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: tenant, Project: "_tenant"},
		}
	}
	acme := definition.LayerKey{Name: "tex", Tenant: "acme", Project: "_tenant"}
	other := definition.LayerKey{Name: "tex", Tenant: "other", Project: "_tenant"}
	cases := map[string]struct {
		event func(h toolscache.ResourceEventHandler)
		want  []definition.LayerKey
	}{
		"add":    {func(h toolscache.ResourceEventHandler) { h.OnAdd(obj(1, "acme"), true) }, []definition.LayerKey{acme}},
		"delete": {func(h toolscache.ResourceEventHandler) { h.OnDelete(obj(1, "acme")) }, []definition.LayerKey{acme}},
		"delete with a tombstone": {func(h toolscache.ResourceEventHandler) {
			h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "ns/x", Obj: obj(1, "acme")})
		}, []definition.LayerKey{acme}},
		"spec update":        {func(h toolscache.ResourceEventHandler) { h.OnUpdate(obj(1, "acme"), obj(2, "acme")) }, []definition.LayerKey{acme, acme}},
		"status-only update": {func(h toolscache.ResourceEventHandler) { h.OnUpdate(obj(2, "acme"), obj(2, "acme")) }, nil},
		"key change":         {func(h toolscache.ResourceEventHandler) { h.OnUpdate(obj(2, "acme"), obj(2, "other")) }, []definition.LayerKey{acme, other}},
		"another type":       {func(h toolscache.ResourceEventHandler) { h.OnAdd(&metav1.PartialObjectMetadata{}, false) }, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var rec recorder
			tc.event(InvalidationHandler(&rec))
			if diff := cmp.Diff(tc.want, rec.keys); diff != "" {
				t.Errorf("invalidated keys mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestLayerFrom(t *testing.T) {
	ld := &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tex-system"},
		Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "tex", Tenant: "_vance", Project: "_tenant",
			Levels: &leasev1alpha1.LeaseLevels{Global: new(int32(6))}, WaitMs: new(int32(0)),
			Fairness: new(leasev1alpha1.FairnessGlobal)},
	}
	want := definition.Layer{Kind: definition.KindSystem, Source: "LeaseDefinition ns/tex-system", Name: "tex",
		Tenant: "_vance", Project: "_tenant", Levels: definition.Levels{Global: new(int32(6))}, WaitMs: new(int32(0)),
		Fairness: new(definition.FairGlobal)}
	if diff := cmp.Diff(want, LayerFrom(ld)); diff != "" {
		t.Errorf("LayerFrom() mismatch (-want +got):\n%s", diff)
	}
	if got, want := ScopeIndexValue(KeyOf(ld)), "tex/_vance/_tenant"; got != want {
		t.Errorf("ScopeIndexValue() = %q, want %q", got, want)
	}
}
