package metrics_test

import (
	"context"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// TestStoreStateCountsEachPart: a holder of several resources (issue 45) holds a lease of
// each: it counts among the holders of each resource, as their global counters count it, and
// each part's definition gives its resource's global cap.
func TestStoreStateCountsEachPart(t *testing.T) {
	store := storetest.New(t)
	req := leasestore.AcquireRequest{Tenant: "acme", Project: "p1", Type: "tex", TTL: time.Minute}
	for _, p := range []struct {
		lease, resource string
		global          int
	}{{"gpu", "gpu", 2}, {"licence", "lic-pool", 3}} {
		req.Parts = append(req.Parts, leasestore.Part{LeaseName: p.lease, Resource: p.resource,
			Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: p.global}}})
	}
	if _, err := store.Acquire(context.Background(), req); err != nil {
		t.Fatal(err)
	}
	builtins, err := definition.LoadBuiltins(fstest.MapFS{
		"gpu.yaml":     {Data: []byte("name: gpu\nlevels: {global: 2}\nwaitMs: 0\n")},
		"licence.yaml": {Data: []byte("name: licence\nresource: lic-pool\nlevels: {global: 3}\nwaitMs: 0\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	c := metrics.NewStateCollector(metrics.StoreState(store, definition.NewResolver(builtins, nil)))
	want := `
# HELP vance_lease_global_cap Global cap of the resource, from the definition of a held lease.
# TYPE vance_lease_global_cap gauge
vance_lease_global_cap{resource="gpu"} 2
vance_lease_global_cap{resource="lic-pool"} 3
# HELP vance_lease_global_in_use Count of the global-level counter, by resource (compare with vance_lease_global_cap).
# TYPE vance_lease_global_in_use gauge
vance_lease_global_in_use{resource="gpu"} 1
vance_lease_global_in_use{resource="lic-pool"} 1
# HELP vance_lease_holders Leases held now, by resource.
# TYPE vance_lease_holders gauge
vance_lease_holders{resource="gpu"} 1
vance_lease_holders{resource="lic-pool"} 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "vance_lease_global_cap", "vance_lease_global_in_use",
		"vance_lease_holders"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "vance_lease_oldest_idle_seconds"); n != 2 {
		t.Errorf("oldest idle series = %d, want one per resource", n)
	}
}
