package liveapi_test

import (
	"encoding/base64"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vancetope/lease-operator/internal/lease"
)

// TestSystemListContinueNamesNoOtherTenant reproduces issue 26, item 3: in the system
// namespace a list with limit=1 answered no item and a continue holding the token of a
// holder of acme (a tenant with a namespace, whose holders that list must not show). Now
// the continue carries no token, names no holder of another tenant, and the pages walk
// exactly the holders of tenants without a namespace.
func TestSystemListContinueNamesNoOtherTenant(t *testing.T) {
	res := "sysleak"
	sel := "live.lease.vancetope.io/resource=" + res
	var tenantHolders []lease.Holder
	for i := range 3 {
		tenantHolders = append(tenantHolders, acquire(t, "acme", res, "u"+string(rune('a'+i))))
	}
	orphan := acquire(t, "orphan", res, "u1")

	var got []string
	opts := metav1.ListOptions{LabelSelector: sel, Limit: 1}
	for pages := 0; ; pages++ {
		if pages > 10 {
			t.Fatalf("more than 10 pages for one orphan holder")
		}
		list, err := client(t, operator).Resource(holders).Namespace(systemNS).List(ctxT(t), opts)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		for _, it := range list.Items {
			got = append(got, it.GetName())
		}
		next := list.GetContinue()
		raw, _ := base64.RawURLEncoding.DecodeString(next)
		for _, h := range append(tenantHolders, orphan) {
			if strings.Contains(next, h.Token) || strings.Contains(string(raw), h.Token) {
				t.Errorf("page %d: continue %q carries the token of %s", pages, next, h.ID)
			}
		}
		for _, h := range tenantHolders {
			if strings.Contains(string(raw), h.ID) {
				t.Errorf("page %d: continue %q names acme's holder %s", pages, next, h.ID)
			}
		}
		if next == "" {
			break
		}
		opts.Continue = next
	}
	if len(got) != 1 || got[0] != orphan.ID {
		t.Errorf("system namespace holders = %v, want only the orphan's %s", got, orphan.ID)
	}
}

// TestViewerSeesNoToken: a tenant viewer reads its holder by get, list, the server's table
// (as kubectl prints it, also -o wide) and -o yaml/json, and no answer contains the token;
// the token does not work as a name.
func TestViewerSeesNoToken(t *testing.T) {
	res := "secret"
	h := acquire(t, "acme", res, "u1")
	sel := "-l=live.lease.vancetope.io/resource=" + res
	for _, args := range [][]string{
		{"get", "leaseholders", sel},
		{"get", "leaseholders", sel, "-o", "wide"},
		{"get", "leaseholders", sel, "-o", "yaml"},
		{"get", "leaseholders", sel, "-o", "json"},
		{"get", "leaseholder", h.ID, "-o", "yaml"},
		{"get", "leaseholder", h.ID, "-o", "wide"},
		{"get", "lease-live", "-o", "yaml"},
	} {
		out := mustKubectl(t, aliceFile, append([]string{"-n", nsAcme}, args...)...)
		if strings.Contains(out, h.Token) {
			t.Errorf("kubectl %s shows the token:\n%s", strings.Join(args, " "), out)
		}
		if !strings.Contains(out, h.ID) {
			t.Errorf("kubectl %s does not show the ID %s:\n%s", strings.Join(args, " "), h.ID, out)
		}
	}
	if _, _, err := kubectl(t, aliceFile, "-n", nsAcme, "get", "leaseholder", h.Token); err == nil {
		t.Errorf("kubectl get leaseholder TOKEN found a holder; a token must be no name")
	}
}
