package liveapi_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// acquire books a lease of tenant on resource res for the manager's own pod (so that its
// revocation runs the handler in this process) and releases it on cleanup.
func acquire(t testing.TB, tenant, res, user string) lease.Holder {
	t.Helper()
	return acquireAs(t, res, tenant, res, user)
}

// acquireAs is acquire with the holder's lease name set apart from its resource.
func acquireAs(t testing.TB, leaseName, tenant, res, user string) lease.Holder {
	t.Helper()
	h, err := store.Acquire(context.Background(), leasestore.AcquireRequest{
		LeaseName: leaseName, Resource: res, Tenant: tenant, Project: "p1", User: user, Type: "tex",
		Caps: []lease.LevelCap{{Level: lease.LevelUser, Cap: 1 << 20}, {Level: lease.LevelProject, Cap: 1 << 20},
			{Level: lease.LevelTenant, Cap: 1 << 20}, {Level: lease.LevelGlobal, Cap: 1 << 20}},
		Pod: self, PodBound: true, TTL: time.Hour,
	})
	if err != nil {
		t.Fatalf("acquire: %v", err)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), h.Token) })
	return h
}

func client(t testing.TB, cfg *rest.Config) dynamic.Interface {
	t.Helper()
	c, err := dynamic.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// names lists the names of gvr in ns ("" for all namespaces) as ns/name, selecting by
// label selector sel.
func names(t testing.TB, cfg *rest.Config, gvr schema.GroupVersionResource, ns, sel string) ([]string, error) {
	t.Helper()
	list, err := client(t, cfg).Resource(gvr).Namespace(ns).List(ctxT(t), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		return nil, err
	}
	var out []string
	for _, it := range list.Items {
		out = append(out, it.GetNamespace()+"/"+it.GetName())
	}
	slices.Sort(out)
	return out, nil
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// TestTenantsSeeOnlyTheirNamespace: each tenant user lists exactly its tenant's holders in
// its namespace, is forbidden elsewhere, never sees the global level; the operator sees
// everything, the holders of a tenant without a namespace in the system namespace.
func TestTenantsSeeOnlyTheirNamespace(t *testing.T) {
	res := "iso"
	sel := "live.lease.vancetope.io/resource=" + res
	a1, a2 := acquire(t, "acme", res, "u1"), acquire(t, "acme", res, "u2")
	g1 := acquire(t, "globex", res, "u1")
	o1 := acquire(t, "orphan", res, "u1")

	got, err := names(t, alice, holders, nsAcme, sel)
	if err != nil {
		t.Fatalf("alice lists acme: %v", err)
	}
	if d := cmp.Diff(sorted(nsAcme+"/"+a1.ID, nsAcme+"/"+a2.ID), got); d != "" {
		t.Errorf("alice's holders in acme (-want +got):\n%s", d)
	}
	for _, ns := range []string{nsGlobex, systemNS} {
		if _, err := names(t, alice, holders, ns, sel); !apierrors.IsForbidden(err) {
			t.Errorf("alice lists %s: err = %v, want Forbidden", ns, err)
		}
		if _, err := names(t, alice, counters, ns, ""); !apierrors.IsForbidden(err) {
			t.Errorf("alice lists counters in %s: err = %v, want Forbidden", ns, err)
		}
	}
	if _, err := names(t, alice, holders, "", sel); !apierrors.IsForbidden(err) {
		t.Errorf("alice lists all namespaces: err = %v, want Forbidden", err)
	}
	// A holder of another tenant does not exist in acme, whatever its token.
	if _, err := client(t, alice).Resource(holders).Namespace(nsAcme).Get(ctxT(t), g1.ID, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("alice gets globex's holder through acme: err = %v, want NotFound", err)
	}
	cs, err := client(t, alice).Resource(counters).Namespace(nsAcme).List(ctxT(t), metav1.ListOptions{LabelSelector: sel})
	if err != nil {
		t.Fatalf("alice lists counters: %v", err)
	}
	var levels []string
	for _, c := range cs.Items {
		scope, _, _ := unstructured.NestedString(c.Object, "scope")
		level, _, _ := unstructured.NestedString(c.Object, "level")
		if level == string(lease.LevelGlobal) || !strings.HasPrefix(scope, "acme") {
			t.Errorf("alice sees counter %s (level %s, scope %s)", c.GetName(), level, scope)
		}
		levels = append(levels, level)
	}
	if d := cmp.Diff(sorted("project", "tenant", "user", "user"), sorted(levels...)); d != "" {
		t.Errorf("acme's counter levels (-want +got):\n%s", d)
	}

	got, err = names(t, operator, holders, "", sel)
	if err != nil {
		t.Fatalf("operator lists all: %v", err)
	}
	want := sorted(nsAcme+"/"+a1.ID, nsAcme+"/"+a2.ID, nsGlobex+"/"+g1.ID, systemNS+"/"+o1.ID)
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("operator's holders (-want +got):\n%s", d)
	}
	got, err = names(t, operator, counters, systemNS, sel)
	if err != nil {
		t.Fatalf("operator lists system counters: %v", err)
	}
	if !slices.Contains(got, systemNS+"/"+res+".global") || !slices.Contains(got, systemNS+"/"+res+".tenant.orphan") {
		t.Errorf("system namespace counters %v lack the global level or orphan's tenant level", got)
	}
	if slices.ContainsFunc(got, func(n string) bool { return strings.Contains(n, "acme") }) {
		t.Errorf("system namespace shows acme's counters: %v", got)
	}
}

// TestDeleteRevokes: deleting a holder in its tenant's namespace revokes it (the next check
// is LEASE_LOST, the handler ran, reap{revoke} moved, the slots came back); a holder of
// another tenant deleted through the namespace is NotFound and stays.
func TestDeleteRevokes(t *testing.T) {
	res := "del"
	a1 := acquire(t, "acme", res, "u1")
	g1 := acquire(t, "globex", res, "u1")
	before := promtestutil.ToFloat64(reaps.Reap.WithLabelValues("revoke"))

	err := client(t, alice).Resource(holders).Namespace(nsAcme).Delete(ctxT(t), g1.ID, metav1.DeleteOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("alice deletes globex's holder through acme: err = %v, want NotFound", err)
	}
	if err := store.Touch(ctxT(t), g1.Token); err != nil {
		t.Errorf("globex's holder after alice's delete: %v, want held", err)
	}
	err = client(t, alice).Resource(holders).Namespace(nsGlobex).Delete(ctxT(t), g1.ID, metav1.DeleteOptions{})
	if !apierrors.IsForbidden(err) {
		t.Errorf("alice deletes in globex: err = %v, want Forbidden", err)
	}

	// The token is no name: deleting or reading by it finds nothing and revokes nothing, and
	// the answer does not echo it: a token is a bearer secret (docs/security.md, "Tokens").
	err = client(t, alice).Resource(holders).Namespace(nsAcme).Delete(ctxT(t), a1.Token, metav1.DeleteOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("alice deletes by token: err = %v, want NotFound", err)
	}
	if hits := tokenscan.Text(fmt.Sprint(err), a1.Token); len(hits) > 0 {
		t.Errorf("alice deletes by token: the answer echoes the token: %v", hits)
	}
	_, err = client(t, alice).Resource(holders).Namespace(nsAcme).Get(ctxT(t), a1.Token, metav1.GetOptions{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("alice reads by token: err = %v, want NotFound", err)
	}
	if hits := tokenscan.Text(fmt.Sprint(err), a1.Token); len(hits) > 0 {
		t.Errorf("alice reads by token: the answer echoes the token: %v", hits)
	}
	if err := store.Touch(ctxT(t), a1.Token); err != nil {
		t.Fatalf("holder after a delete by token: %v, want held", err)
	}
	if err := client(t, alice).Resource(holders).Namespace(nsAcme).Delete(ctxT(t), a1.ID, metav1.DeleteOptions{}); err != nil {
		t.Fatalf("alice revokes her holder by its ID: %v", err)
	}
	if err := store.Touch(ctxT(t), a1.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("check after revoke: %v, want ErrLost", err)
	}
	if got := promtestutil.ToFloat64(reaps.Reap.WithLabelValues("revoke")) - before; got != 1 {
		t.Errorf("reap{revoke} moved by %v, want 1", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for !handled.has(a1.Token) && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond) // real time: polling the handler's record, as Eventually does (bounded by deadline)
	}
	if !handled.has(a1.Token) {
		t.Errorf("the tex handler did not run for %s", a1.Token)
	}
	cs, err := store.ListCounters(ctxT(t), leasestore.CounterFilter{Resource: res, Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cs {
		if c.Count != 0 {
			t.Errorf("counter %s = %d after the revoke, want 0", c.Key, c.Count)
		}
	}
	if err := client(t, alice).Resource(holders).Namespace(nsAcme).Delete(ctxT(t), a1.ID, metav1.DeleteOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("second delete: err = %v, want NotFound", err)
	}
}

// TestListPages: limit and continue walk a tenant's holders in ID order without
// repeating or skipping one.
func TestListPages(t *testing.T) {
	res := "pages"
	var want []string
	for i := range 5 {
		want = append(want, nsAcme+"/"+acquire(t, "acme", res, "u"+string(rune('a'+i))).ID)
	}
	slices.Sort(want)
	var got []string
	opts := metav1.ListOptions{LabelSelector: "live.lease.vancetope.io/resource=" + res, Limit: 2}
	for pages := 0; ; pages++ {
		list, err := client(t, alice).Resource(holders).Namespace(nsAcme).List(ctxT(t), opts)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		for _, it := range list.Items {
			got = append(got, it.GetNamespace()+"/"+it.GetName())
		}
		if list.GetContinue() == "" {
			if pages != 2 {
				t.Errorf("pages = %d, want 3", pages+1)
			}
			break
		}
		opts.Continue = list.GetContinue()
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("paged holders (-want +got):\n%s", d)
	}
}
