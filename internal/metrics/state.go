package metrics

import (
	"context"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

// The state gauges show what is held now, for a screen and for alerts (docs/observability.md).
// They are read from the store, at most once per refresh interval however often Prometheus
// scrapes, and labelled by resource only: never by tenant, project or user.
const (
	nameHolders      = "vance_lease_holders"
	nameGlobalInUse  = "vance_lease_global_in_use"
	nameGlobalCap    = "vance_lease_global_cap"
	nameOldestIdle   = "vance_lease_oldest_idle_seconds"
	nameDrifting     = "vance_lease_counters_drifting"
	nameStoreUp      = "vance_lease_store_up"
	nameStateAge     = "vance_lease_state_age_seconds"
	labelResource    = "resource"
	inlineLabel      = "mcp-inline"
	otherLabel       = "other"
	maxStateLabels   = 200
	defaultStateRead = 10 * time.Second
)

// DefaultStateRefresh is how old the state may be before a scrape reads it again.
const DefaultStateRefresh = 30 * time.Second

// State is what the state gauges show, by resource label.
type State struct {
	// Holders counts the holders per resource.
	Holders map[string]int
	// GlobalInUse is the count of the global-level counter per resource.
	GlobalInUse map[string]int
	// GlobalCap is the global cap per resource, where a held lease's definition tells it.
	GlobalCap map[string]int
	// OldestIdle is, per resource, the longest time since a holder's last check.
	OldestIdle map[string]time.Duration
	// Drifting counts the counters whose count differs from the holders booking them.
	Drifting int
}

// ResourceLabel is the label value of a resource: inline (project-private) resources, whose
// names carry tenant IDs, are all labelled "mcp-inline".
func ResourceLabel(resource string) string {
	if strings.HasPrefix(resource, definition.InlineResourcePrefix) {
		return inlineLabel
	}
	return resource
}

// BuildState computes the state from one read of holders and counters at server time now.
// globalCaps maps resources to their global cap (resources without one are left out).
// Beyond maxStateLabels resources, the rest are summed under "other".
func BuildState(now time.Time, holders []lease.Holder, counters []lease.Counter, globalCaps map[string]int) State {
	s := State{Holders: map[string]int{}, GlobalInUse: map[string]int{}, GlobalCap: map[string]int{},
		OldestIdle: map[string]time.Duration{}}
	labels := boundedLabels(holders, counters)
	for _, h := range holders {
		l := labels[ResourceLabel(h.Resource)]
		s.Holders[l]++
		if idle := now.Sub(h.LastSeenAt); !h.LastSeenAt.IsZero() && idle > s.OldestIdle[l] {
			s.OldestIdle[l] = idle
		}
	}
	for _, c := range counters {
		if c.Drift() {
			s.Drifting++
		}
		if c.Level == lease.LevelGlobal {
			s.GlobalInUse[labels[ResourceLabel(c.Resource)]] += c.Count
		}
	}
	for r, c := range globalCaps {
		if l := labels[ResourceLabel(r)]; l != otherLabel {
			s.GlobalCap[l] = c
		}
	}
	return s
}

// boundedLabels maps every resource label to itself, or to "other" beyond the bound (by
// name, so the choice is stable between reads).
func boundedLabels(holders []lease.Holder, counters []lease.Counter) map[string]string {
	set := map[string]bool{}
	for _, h := range holders {
		set[ResourceLabel(h.Resource)] = true
	}
	for _, c := range counters {
		set[ResourceLabel(c.Resource)] = true
	}
	names := make([]string, 0, len(set))
	for n := range set {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make(map[string]string, len(names))
	for i, n := range names {
		if i < maxStateLabels {
			out[n] = n
		} else {
			out[n] = otherLabel
		}
	}
	return out
}

// StateReader reads the current state (StoreState).
type StateReader func(ctx context.Context) (State, error)

// StateCollector is a prometheus.Collector of the state gauges. A scrape reads the state
// only when the last read is older than the refresh interval; otherwise it serves the last
// one. A failed read sets vance_lease_store_up to 0 and keeps the last good state.
type StateCollector struct {
	read    StateReader
	refresh time.Duration
	timeout time.Duration
	clock   clock.PassiveClock

	mu     sync.Mutex
	state  State
	readAt time.Time
	up     bool
	tried  time.Time

	holders, globalInUse, globalCap, oldestIdle, drifting, storeUp, age *prometheus.Desc
}

var _ prometheus.Collector = (*StateCollector)(nil)

// StateOption configures a StateCollector.
type StateOption func(*StateCollector)

// WithStateRefresh sets how old the state may be before a scrape reads it again.
func WithStateRefresh(d time.Duration) StateOption { return func(c *StateCollector) { c.refresh = d } }

// WithStateClock sets the clock (default: real clock).
func WithStateClock(clk clock.PassiveClock) StateOption {
	return func(c *StateCollector) { c.clock = clk }
}

// NewStateCollector returns the collector of the state gauges over read.
func NewStateCollector(read StateReader, opts ...StateOption) *StateCollector {
	res := []string{labelResource}
	c := &StateCollector{
		read: read, refresh: DefaultStateRefresh, timeout: defaultStateRead, clock: clock.RealClock{},
		holders:     prometheus.NewDesc(nameHolders, "Leases held now, by resource.", res, nil),
		globalInUse: prometheus.NewDesc(nameGlobalInUse, "Count of the global-level counter, by resource (compare with vance_lease_global_cap).", res, nil),
		globalCap:   prometheus.NewDesc(nameGlobalCap, "Global cap of the resource, from the definition of a held lease.", res, nil),
		oldestIdle:  prometheus.NewDesc(nameOldestIdle, "Longest time since a holder of the resource last checked its lease.", res, nil),
		drifting:    prometheus.NewDesc(nameDrifting, "Counters whose count differs from the number of holders booking them (repaired by reconcile).", nil, nil),
		storeUp:     prometheus.NewDesc(nameStoreUp, "1 when the last read of the lease store for these gauges succeeded, else 0.", nil, nil),
		age:         prometheus.NewDesc(nameStateAge, "Age of the state the lease gauges show.", nil, nil),
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Describe sends the descriptors.
func (c *StateCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{c.holders, c.globalInUse, c.globalCap, c.oldestIdle, c.drifting, c.storeUp, c.age} {
		ch <- d
	}
}

// Collect reads the state if it is stale and sends the gauges.
func (c *StateCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.clock.Now()
	if c.tried.IsZero() || now.Sub(c.tried) >= c.refresh {
		c.tried = now
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		s, err := c.read(ctx)
		cancel()
		c.up = err == nil
		if err == nil {
			c.state, c.readAt = s, now
		}
	}
	up := 0.0
	if c.up {
		up = 1
	}
	ch <- prometheus.MustNewConstMetric(c.storeUp, prometheus.GaugeValue, up)
	if c.readAt.IsZero() {
		return // nothing read yet
	}
	ch <- prometheus.MustNewConstMetric(c.age, prometheus.GaugeValue, now.Sub(c.readAt).Seconds())
	ch <- prometheus.MustNewConstMetric(c.drifting, prometheus.GaugeValue, float64(c.state.Drifting))
	for r, n := range c.state.Holders {
		ch <- prometheus.MustNewConstMetric(c.holders, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range c.state.GlobalInUse {
		ch <- prometheus.MustNewConstMetric(c.globalInUse, prometheus.GaugeValue, float64(n), r)
	}
	for r, n := range c.state.GlobalCap {
		ch <- prometheus.MustNewConstMetric(c.globalCap, prometheus.GaugeValue, float64(n), r)
	}
	for r, d := range c.state.OldestIdle {
		ch <- prometheus.MustNewConstMetric(c.oldestIdle, prometheus.GaugeValue, d.Seconds(), r)
	}
}
