package tenancy

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStatic(t *testing.T) {
	m := Static{System: "s", Tenants: map[string]string{"b": "acme", "a": "acme", "c": "globex", "d": ""}}
	if diff := cmp.Diff([]string{"a", "b"}, m.NamespacesOf("acme")); diff != "" {
		t.Errorf("NamespacesOf(acme) mismatch (-want +got):\n%s", diff)
	}
	if got := m.NamespacesOf("nobody"); len(got) != 0 {
		t.Errorf("NamespacesOf(nobody) = %v, want none", got)
	}
	if got := m.NamespacesOf(""); len(got) != 0 {
		t.Errorf("NamespacesOf(\"\") = %v, want none", got)
	}
	if _, ok := m.TenantOf("d"); ok {
		t.Error("TenantOf(d) is ok for an empty label")
	}
}
