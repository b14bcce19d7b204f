package k8stenancy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/tenancy"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

func namespace(name, tenant string) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if tenant != "" {
		ns.Labels = map[string]string{tenancy.TenantLabel: tenant}
	}
	return ns
}

// TestChangeHandler drives the handler with the events a Namespace informer delivers: only
// events that change a namespace's tenant are reported.
func TestChangeHandler(t *testing.T) {
	cases := map[string]struct {
		event func(h toolscache.ResourceEventHandler)
		want  []string
	}{
		"add labelled":     {func(h toolscache.ResourceEventHandler) { h.OnAdd(namespace("a", "acme"), true) }, []string{"a"}},
		"add unlabelled":   {func(h toolscache.ResourceEventHandler) { h.OnAdd(namespace("a", ""), true) }, nil},
		"unrelated update": {func(h toolscache.ResourceEventHandler) { h.OnUpdate(namespace("a", "acme"), namespace("a", "acme")) }, nil},
		"relabel":          {func(h toolscache.ResourceEventHandler) { h.OnUpdate(namespace("a", "acme"), namespace("a", "globex")) }, []string{"a"}},
		"unlabel":          {func(h toolscache.ResourceEventHandler) { h.OnUpdate(namespace("a", "acme"), namespace("a", "")) }, []string{"a"}},
		"label":            {func(h toolscache.ResourceEventHandler) { h.OnUpdate(namespace("a", ""), namespace("a", "acme")) }, []string{"a"}},
		"delete labelled":  {func(h toolscache.ResourceEventHandler) { h.OnDelete(namespace("a", "acme")) }, []string{"a"}},
		"delete with a tombstone": {func(h toolscache.ResourceEventHandler) {
			h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "a", Obj: namespace("a", "acme")})
		}, []string{"a"}},
		"delete unlabelled": {func(h toolscache.ResourceEventHandler) { h.OnDelete(namespace("a", "")) }, nil},
		"another type":      {func(h toolscache.ResourceEventHandler) { h.OnAdd(&corev1.Pod{}, false) }, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var got []string
			tc.event(changeHandler(func(ns string) { got = append(got, ns) }))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("notified namespaces mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
