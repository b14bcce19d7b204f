// Package metrics defines the lease metrics (docs/design.md) and registers them with the
// process's registry: controller-runtime's in the manager (UseRegistry), so that its metrics
// endpoint serves them, a registry of its own in the agent, which links no controller-runtime. Labels are
// low-cardinality: resource names, outcomes and reasons; never tenant or user IDs.
package metrics

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Path is where a process of the lease system serves its metrics: the manager on its metrics
// address, the agent on its internal port (docs/operations.md, "Agent metrics").
const Path = "/metrics"

// Registry is a registry that can also be served.
type Registry interface {
	prometheus.Registerer
	prometheus.Gatherer
}

// registry is the process's registry: Default registers with it and Handler serves it.
var registry Registry = prometheus.NewRegistry()

// UseRegistry makes r the process's registry (the manager: controller-runtime's, which its
// metrics endpoint serves). Call it first, before anything registers.
func UseRegistry(r Registry) { registry = r }

// Handler serves the process's registry, which Default registers with, in the Prometheus
// text format: the same metric names and labels in the manager and the agent.
func Handler() http.Handler {
	return promhttp.HandlerFor(registry, promhttp.HandlerOpts{})
}

// Outcomes and reasons used as label values.
const (
	AcquireSuccess     = "success"
	AcquireBusy        = "busy"
	AcquireNoop        = "noop"
	AcquireUnavailable = "unavailable"

	CheckOK   = "ok"
	CheckLost = "lost"

	ReleaseOK              = "ok"
	ReleaseAlreadyReleased = "already-released"
	ReleaseError           = "error"

	ReapIdle   = "idle"
	ReapPod    = "pod"
	ReapRevoke = "revoke"
	// ReapReclaim: a borrowed slot revoked for a waiter of a tenant within its cap
	// (docs/borrowing.md).
	ReapReclaim = "reclaim"

	ReconcileCorrected = "corrected"
)

// Metrics holds the lease collectors.
type Metrics struct {
	Acquire   *prometheus.CounterVec
	Check     *prometheus.CounterVec
	Release   *prometheus.CounterVec
	Reap      *prometheus.CounterVec
	Reconcile *prometheus.CounterVec
	// AcquireWait observes, per resource and outcome, how long an acquire waited before its
	// outcome.
	AcquireWait *prometheus.HistogramVec
	// AcquireWaitShare observes, per resource, the share of its allowed wait an acquisition
	// that could wait used before its outcome: near 1, it was answered at or near its
	// deadline.
	AcquireWaitShare *prometheus.HistogramVec
	// Waiting counts, per resource, the acquisitions in progress in this process: booking a
	// slot or waiting for one.
	Waiting *prometheus.GaugeVec
}

// New creates the collectors and registers them with reg (nil: not registered).
func New(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Acquire: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vance_lease_acquire_total", Help: "Lease acquisitions by resource and outcome.",
		}, []string{"resource", "outcome"}),
		Check: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vance_lease_check_total", Help: "Lease checks (check-at-use) by resource and outcome.",
		}, []string{"resource", "outcome"}),
		Release: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vance_lease_release_total", Help: "Lease releases by resource and outcome.",
		}, []string{"resource", "outcome"}),
		Reap: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vance_lease_reap_total", Help: "Holders reaped, by reason (idle, pod, revoke, reclaim).",
		}, []string{"reason"}),
		Reconcile: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vance_lease_reconcile_total", Help: "Counters corrected by reconcile.",
		}, []string{"outcome"}),
		AcquireWait: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vance_lease_acquire_wait_seconds",
			Help:    "Time an acquire waited for a slot before its outcome (success, busy, unavailable), by resource.",
			Buckets: []float64{0.001, 0.005, 0.025, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30},
		}, []string{"resource", "outcome"}),
		AcquireWaitShare: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "vance_lease_acquire_wait_share",
			Help:    "Share of its allowed wait an acquisition that could wait used before its outcome, by resource (1: answered at its deadline).",
			Buckets: []float64{0.1, 0.25, 0.5, 0.8, 0.95, 1},
		}, []string{"resource"}),
		Waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vance_lease_acquire_waiting",
			Help: "Acquisitions in progress in this process (booking a slot or waiting for one), by resource.",
		}, []string{"resource"}),
	}
	if reg != nil {
		reg.MustRegister(m.Acquire, m.Check, m.Release, m.Reap, m.Reconcile, m.AcquireWait, m.AcquireWaitShare, m.Waiting)
	}
	return m
}

var global *Metrics

// Default returns the process-wide metrics, registered with the process's registry on first
// use.
func Default() *Metrics {
	if global == nil {
		global = New(registry)
	}
	return global
}
