package leasestore_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

// newStore connects to the test server with a fresh database that is dropped on cleanup.
func newStore(t testing.TB, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatalf("test MongoDB: %v", err)
	}
	return newStoreAt(t, uri, mongotest.DatabaseName(t), opts...)
}

// newDatabase is the test server's URI and a fresh database name, for tests that open
// several stores (processes) on one database.
func newDatabase(t testing.TB) (uri, db string) {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatalf("test MongoDB: %v", err)
	}
	return uri, mongotest.DatabaseName(t)
}

func newStoreAt(t testing.TB, uri, db string, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	return storetest.Open(t, uri, db, opts...)
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// allCaps returns caps for all four levels.
func allCaps(user, project, tenant, global int) []lease.LevelCap {
	return []lease.LevelCap{
		{Level: lease.LevelGlobal, Cap: global},
		{Level: lease.LevelTenant, Cap: tenant},
		{Level: lease.LevelProject, Cap: project},
		{Level: lease.LevelUser, Cap: user},
	}
}

func request(resource, tenant, project, user string, caps []lease.LevelCap) leasestore.AcquireRequest {
	return leasestore.AcquireRequest{
		LeaseName: resource,
		Resource:  resource,
		Caps:      caps,
		Tenant:    tenant,
		Project:   project,
		User:      user,
		Type:      "tex",
		HolderRef: "job-1",
		Pod:       lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"},
		TTL:       time.Hour,
	}
}

// counts returns count and booked per counter key.
func counts(t testing.TB, s *leasestore.Store) map[string][2]int {
	t.Helper()
	cs, err := s.ListCounters(context.Background(), leasestore.CounterFilter{})
	if err != nil {
		t.Fatalf("list counters: %v", err)
	}
	out := map[string][2]int{}
	for _, c := range cs {
		out[c.Key] = [2]int{c.Count, c.Booked}
	}
	return out
}

// assertNoDrift fails when a counter differs from the holders that book it.
func assertNoDrift(t testing.TB, s *leasestore.Store) {
	t.Helper()
	for k, v := range counts(t, s) {
		if v[0] != v[1] {
			t.Errorf("counter %s: count %d, booked %d", k, v[0], v[1])
		}
	}
}

func key(resource string, l lease.Level, tenant, project, user string) string {
	return lease.CounterKey(resource, l, lease.ScopeOf(l, tenant, project, user))
}

func mustAcquire(t testing.TB, s *leasestore.Store, req leasestore.AcquireRequest) lease.Holder {
	t.Helper()
	h, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("acquire %s for %s/%s/%s: %v", req.Resource, req.Tenant, req.Project, req.User, err)
	}
	return h
}

func uniq(prefix string, i int) string { return fmt.Sprintf("%s%d", prefix, i) }
