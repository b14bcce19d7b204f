package tenancy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

func namespace(name, tenant string) *corev1.Namespace {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if tenant != "" {
		ns.Labels = map[string]string{TenantLabel: tenant}
	}
	return ns
}

// TestInformedHandler drives the informer handler with the events a Namespace informer
// delivers and checks the map and the OnChange notifications after each.
func TestInformedHandler(t *testing.T) {
	m := &Informed{system: "lease-system", tenantOf: map[string]string{}, byTenant: map[string]map[string]struct{}{}}
	var changed []string
	m.OnChange(func(ns string) { changed = append(changed, ns) })
	h := m.handler()

	type state struct {
		Changed []string
		Acme    []string
		Globex  []string
		OfA     string
	}
	snapshot := func() state {
		t, _ := m.TenantOf("a")
		s := state{Changed: changed, Acme: m.NamespacesOf("acme"), Globex: m.NamespacesOf("globex"), OfA: t}
		changed = nil
		return s
	}
	steps := []struct {
		name  string
		event func()
		want  state
	}{
		{"add labelled", func() { h.OnAdd(namespace("a", "acme"), true); h.OnAdd(namespace("b", "acme"), true) },
			state{Changed: []string{"a", "b"}, Acme: []string{"a", "b"}, Globex: []string{}, OfA: "acme"}},
		{"add unlabelled", func() { h.OnAdd(namespace("team-a", ""), true) },
			state{Acme: []string{"a", "b"}, Globex: []string{}, OfA: "acme"}},
		{"unrelated update", func() { h.OnUpdate(namespace("a", "acme"), namespace("a", "acme")) },
			state{Acme: []string{"a", "b"}, Globex: []string{}, OfA: "acme"}},
		{"relabel", func() { h.OnUpdate(namespace("a", "acme"), namespace("a", "globex")) },
			state{Changed: []string{"a"}, Acme: []string{"b"}, Globex: []string{"a"}, OfA: "globex"}},
		{"unlabel", func() { h.OnUpdate(namespace("a", "globex"), namespace("a", "")) },
			state{Changed: []string{"a"}, Acme: []string{"b"}, Globex: []string{}}},
		{"label", func() { h.OnUpdate(namespace("team-a", ""), namespace("team-a", "globex")) },
			state{Changed: []string{"team-a"}, Acme: []string{"b"}, Globex: []string{"team-a"}}},
		{"delete with a tombstone", func() {
			h.OnDelete(toolscache.DeletedFinalStateUnknown{Key: "b", Obj: namespace("b", "acme")})
		}, state{Changed: []string{"b"}, Acme: []string{}, Globex: []string{"team-a"}}},
		{"delete unlabelled", func() { h.OnDelete(namespace("a", "")) },
			state{Acme: []string{}, Globex: []string{"team-a"}}},
	}
	for _, s := range steps {
		s.event()
		if diff := cmp.Diff(s.want, snapshot()); diff != "" {
			t.Errorf("after %s: mismatch (-want +got):\n%s", s.name, diff)
		}
	}
	if got := m.SystemNamespace(); got != "lease-system" {
		t.Errorf("SystemNamespace() = %q", got)
	}
}
