package metrics_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

func TestBuildState(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	holder := func(resource string, idle time.Duration) lease.Holder {
		return lease.Holder{Resource: resource, LastSeenAt: now.Add(-idle)}
	}
	counter := func(resource string, level lease.Level, count, booked int) lease.Counter {
		return lease.Counter{Resource: resource, Level: level, Count: count, Booked: booked}
	}
	manyHolders := func(n int) []lease.Holder {
		var hs []lease.Holder
		for i := range n {
			hs = append(hs, holder(fmt.Sprintf("r%03d", i), time.Second))
		}
		return hs
	}
	cases := map[string]struct {
		holders  []lease.Holder
		counters []lease.Counter
		caps     map[string]int
		want     metrics.State
	}{
		"nothing held": {
			want: metrics.State{Holders: map[string]int{}, GlobalInUse: map[string]int{}, GlobalCap: map[string]int{}, OldestIdle: map[string]time.Duration{}},
		},
		"holders, occupancy, idle age and drift": {
			holders: []lease.Holder{holder("tex2pdf", 5*time.Second), holder("tex2pdf", 90*time.Second), holder("browser", time.Second),
				holder("mcp-inline:acme/p1/b", 3*time.Second), holder("mcp-inline:globex/p2/b", 7*time.Second)},
			counters: []lease.Counter{
				counter("tex2pdf", lease.LevelGlobal, 2, 2), counter("tex2pdf", lease.LevelProject, 1, 1),
				counter("tex2pdf", lease.LevelTenant, 2, 1),                                                         // drift
				counter("browser", lease.LevelGlobal, 1, 1), counter("mcp-inline:acme/p1/b", lease.LevelUser, 0, 1), // drift
			},
			caps: map[string]int{"tex2pdf": 6, "browser": 4},
			want: metrics.State{
				Holders:     map[string]int{"tex2pdf": 2, "browser": 1, "mcp-inline": 2},
				GlobalInUse: map[string]int{"tex2pdf": 2, "browser": 1},
				GlobalCap:   map[string]int{"tex2pdf": 6, "browser": 4},
				OldestIdle:  map[string]time.Duration{"tex2pdf": 90 * time.Second, "browser": time.Second, "mcp-inline": 7 * time.Second},
				Drifting:    2,
			},
		},
		"resources beyond the bound are other": {
			holders: manyHolders(202),
			want: metrics.State{
				Holders: func() map[string]int {
					m := map[string]int{"other": 2}
					for i := range 200 {
						m[fmt.Sprintf("r%03d", i)] = 1
					}
					return m
				}(),
				GlobalInUse: map[string]int{}, GlobalCap: map[string]int{},
				OldestIdle: func() map[string]time.Duration {
					m := map[string]time.Duration{"other": time.Second}
					for i := range 200 {
						m[fmt.Sprintf("r%03d", i)] = time.Second
					}
					return m
				}(),
			},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := metrics.BuildState(now, tc.holders, tc.counters, tc.caps)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("state (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStateCollectorReadsOncePerRefresh(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Now())
	reads := 0
	fail := false
	read := func(context.Context) (metrics.State, error) {
		reads++
		if fail {
			return metrics.State{}, errors.New("store down")
		}
		return metrics.State{Holders: map[string]int{"tex2pdf": reads}, Drifting: 1}, nil
	}
	c := metrics.NewStateCollector(read, metrics.WithStateRefresh(30*time.Second), metrics.WithStateClock(clk))
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c)
	gather := func() string {
		t.Helper()
		var b strings.Builder
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, mf := range mfs {
			for _, m := range mf.GetMetric() {
				fmt.Fprintf(&b, "%s%v=%v ", mf.GetName(), labelValues(m.GetLabel()), m.GetGauge().GetValue())
			}
		}
		return b.String()
	}
	for i, step := range []struct {
		advance time.Duration
		fail    bool
		want    string
	}{
		{0, false, "vance_lease_counters_drifting[]=1 vance_lease_holders[tex2pdf]=1 vance_lease_state_age_seconds[]=0 vance_lease_store_up[]=1 "},
		{10 * time.Second, false, "vance_lease_counters_drifting[]=1 vance_lease_holders[tex2pdf]=1 vance_lease_state_age_seconds[]=10 vance_lease_store_up[]=1 "},
		{20 * time.Second, false, "vance_lease_counters_drifting[]=1 vance_lease_holders[tex2pdf]=2 vance_lease_state_age_seconds[]=0 vance_lease_store_up[]=1 "},
		// A failed read keeps the last state and says the store is down.
		{30 * time.Second, true, "vance_lease_counters_drifting[]=1 vance_lease_holders[tex2pdf]=2 vance_lease_state_age_seconds[]=30 vance_lease_store_up[]=0 "},
	} {
		clk.SetTime(clk.Now().Add(step.advance))
		fail = step.fail
		if got := gather(); got != step.want {
			t.Errorf("scrape %d:\n got %s\nwant %s", i, got, step.want)
		}
	}
	if reads != 3 {
		t.Errorf("%d store reads for 4 scrapes over 60s, want 3", reads)
	}
}

func labelValues(ls []*dto.LabelPair) []string {
	var out []string
	for _, l := range ls {
		out = append(out, l.GetValue())
	}
	return out
}

// definitions are the built-in layer of the store test.
var definitions = fstest.MapFS{
	"tex.yaml": {Data: []byte("name: tex\nresource: tex2pdf\nlevels:\n  global: 6\n  project: 2\nttlSeconds: 120\nwaitMs: 0\n")},
}

func TestStoreState(t *testing.T) {
	var commands atomic.Int64
	store := storetest.New(t, leasestore.WithCommandObserver(func(string) { commands.Add(1) }))
	ctx := context.Background()
	for _, p := range []string{"p1", "p2", "p2"} {
		req := leasestore.AcquireRequest{LeaseName: "tex", Resource: "tex2pdf", Tenant: "acme", Project: p, Type: "tex",
			Caps: []lease.LevelCap{{Level: lease.LevelProject, Cap: 2}, {Level: lease.LevelGlobal, Cap: 6}}, TTL: time.Minute}
		if _, err := store.Acquire(ctx, req); err != nil {
			t.Fatal(err)
		}
	}
	builtins, err := definition.LoadBuiltins(definitions)
	if err != nil {
		t.Fatal(err)
	}
	c := metrics.NewStateCollector(metrics.StoreState(store, definition.NewResolver(builtins, nil)))
	commands.Store(0)
	want := `
# HELP vance_lease_global_cap Global cap of the resource, from the definition of a held lease.
# TYPE vance_lease_global_cap gauge
vance_lease_global_cap{resource="tex2pdf"} 6
# HELP vance_lease_global_in_use Count of the global-level counter, by resource (compare with vance_lease_global_cap).
# TYPE vance_lease_global_in_use gauge
vance_lease_global_in_use{resource="tex2pdf"} 3
# HELP vance_lease_holders Leases held now, by resource.
# TYPE vance_lease_holders gauge
vance_lease_holders{resource="tex2pdf"} 3
# HELP vance_lease_counters_drifting Counters whose count differs from the number of holders booking them (repaired by reconcile).
# TYPE vance_lease_counters_drifting gauge
vance_lease_counters_drifting 0
# HELP vance_lease_store_up 1 when the last read of the lease store for these gauges succeeded, else 0.
# TYPE vance_lease_store_up gauge
vance_lease_store_up 1
`
	if err := testutil.CollectAndCompare(c, strings.NewReader(want), "vance_lease_global_cap", "vance_lease_global_in_use",
		"vance_lease_holders", "vance_lease_counters_drifting", "vance_lease_store_up"); err != nil {
		t.Error(err)
	}
	if n := testutil.CollectAndCount(c, "vance_lease_oldest_idle_seconds"); n != 1 {
		t.Errorf("oldest idle series = %d, want 1", n)
	}
	// One read of the state costs a fixed number of store commands, whatever the number of
	// holders; further scrapes within the refresh interval cost none.
	perRead := commands.Load()
	for range 5 {
		testutil.CollectAndCount(c)
	}
	if perRead == 0 || perRead > 5 || commands.Load() != perRead {
		t.Errorf("store commands: %d for the first scrape, %d after five more; want at most 5, then none", perRead, commands.Load())
	}
	t.Logf("store commands per state read: %d", perRead)

	// With the store gone the gauges say so.
	down, err := leasestore.Connect("mongodb://127.0.0.1:1/?connectTimeoutMS=300", "down", leasestore.WithOpTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = down.Close(context.Background()) })
	dc := metrics.NewStateCollector(metrics.StoreState(down, nil))
	if err := testutil.CollectAndCompare(dc, strings.NewReader(`
# HELP vance_lease_store_up 1 when the last read of the lease store for these gauges succeeded, else 0.
# TYPE vance_lease_store_up gauge
vance_lease_store_up 0
`)); err != nil {
		t.Error(err)
	}
}
