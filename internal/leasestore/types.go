// Package leasestore keeps lease counters and holders in MongoDB (specification §4) and
// implements the acquire funnel, touch, payload update, release, idle and pod reap,
// revocation, reconcile and the operational reads. No driver type leaves this package.
package leasestore

import (
	"errors"
	"fmt"
	"time"
)

// Level is one quota level of the funnel.
type Level string

// The four quota levels, narrow to wide.
const (
	LevelUser    Level = "user"
	LevelProject Level = "project"
	LevelTenant  Level = "tenant"
	LevelGlobal  Level = "global"
)

// Levels lists the quota levels in check order, narrow to wide.
var Levels = []Level{LevelUser, LevelProject, LevelTenant, LevelGlobal}

// GlobalScope is the scope of the global level.
const GlobalScope = "*"

// LevelCap is one capped level of a funnel.
type LevelCap struct {
	Level Level
	Cap   int
}

// HolderState is the life-cycle state of a holder document.
type HolderState string

// Holder states: a holder is PENDING while it books its levels and HELD afterwards.
const (
	StatePending HolderState = "PENDING"
	StateHeld    HolderState = "HELD"
)

// PodRef identifies the pod of a holder. A recreated pod of the same name has another UID
// and is therefore another holder pod.
type PodRef struct {
	Namespace string
	Name      string
	UID       string
}

// String renders the pod as namespace/name.
func (p PodRef) String() string {
	if p.Namespace == "" && p.Name == "" {
		return ""
	}
	return p.Namespace + "/" + p.Name
}

// AcquireRequest is one attempt to book a slot at every capped level of a resource.
type AcquireRequest struct {
	// LeaseName is the definition the lease was resolved from (informational).
	LeaseName string
	// Resource is the counter key.
	Resource string
	// Caps lists the capped levels; order does not matter, the funnel runs narrow to wide.
	Caps      []LevelCap
	Tenant    string
	Project   string
	User      string
	Type      string
	HolderRef string
	Pod       PodRef
	PodBound  bool
	Payload   map[string]string
	// TTL is the idle time after which the holder may be reaped.
	TTL time.Duration
}

// Holder is a held (or pending) lease as stored. The value Acquire returns leaves
// AcquiredAt and LastSeenAt zero: they are server times, read back only by the reads.
type Holder struct {
	Token     string
	State     HolderState
	LeaseName string
	Resource  string
	Type      string
	Tenant    string
	Project   string
	User      string
	HolderRef string
	Pod       PodRef
	PodBound  bool
	Payload   map[string]string
	TTL       time.Duration
	// Levels are the counter keys this holder has booked.
	Levels     []string
	AcquiredAt time.Time
	LastSeenAt time.Time
}

// Counter is one counter document with the number of holders that book it.
type Counter struct {
	Key       string
	Resource  string
	Level     Level
	Scope     string
	Count     int
	UpdatedAt time.Time
	// Booked is the number of holders whose levels contain this key: the value reconcile
	// corrects the count to.
	Booked int
}

// Drift reports whether count and booked holders disagree.
func (c Counter) Drift() bool { return c.Count != c.Booked }

// HolderFilter selects holders for the operational reads; empty fields match everything.
type HolderFilter struct {
	Tenant   string
	Resource string
	Type     string
	// Pod is namespace/name.
	Pod string
}

// CounterFilter selects counters; empty fields match everything.
type CounterFilter struct {
	Resource string
	Level    Level
	// Tenant restricts to the tenant, project and user counters of one tenant (the global
	// level belongs to no tenant and is left out).
	Tenant string
}

// ReconcileResult summarises one reconcile pass.
type ReconcileResult struct {
	// Corrected counts counters whose count was set to the booked number.
	Corrected int
	// Deleted counts counters removed because no holder books them.
	Deleted int
	// Created counts counters recreated for booked keys that had none.
	Created int
	// Skipped counts drifting counters left alone: too recent, or changed while read.
	Skipped int
}

// ErrUnavailable is the fail-closed outcome: the store could not be reached or answered
// with an error. Callers must not use the resource unprotected.
var ErrUnavailable = errors.New("LEASE_UNAVAILABLE")

// ErrBusy is the outcome of an acquire that found a level full; the error is a *BusyError.
var ErrBusy = errors.New("LEASE_BUSY")

// ErrLost reports that the holder is gone (released, reaped or revoked).
var ErrLost = errors.New("LEASE_LOST")

// BusyError names the first full level of an acquire attempt.
type BusyError struct {
	Resource string
	Level    Level
	Scope    string
	Count    int
	Cap      int
}

func (e *BusyError) Error() string {
	return fmt.Sprintf("resource %s is busy at level %s (scope %s): %d of %d in use",
		e.Resource, e.Level, e.Scope, e.Count, e.Cap)
}

// Is makes errors.Is(err, ErrBusy) hold for a *BusyError.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// unavailable wraps a store error as ErrUnavailable, keeping the cause.
func unavailable(op string, err error) error {
	return fmt.Errorf("%s: %w: %w", op, ErrUnavailable, err)
}

// CounterKey is the _id of a counter document: <resource>|<level>|<scope>.
func CounterKey(resource string, level Level, scope string) string {
	return resource + "|" + string(level) + "|" + scope
}

// ScopeOf returns the scope of a level for a holder. The user scope is tenant/user, across
// projects, so that "one session per user" does not multiply with the number of projects.
func ScopeOf(level Level, tenant, project, user string) string {
	switch level {
	case LevelUser:
		return tenant + "/" + user
	case LevelProject:
		return tenant + "/" + project
	case LevelTenant:
		return tenant
	default:
		return GlobalScope
	}
}
