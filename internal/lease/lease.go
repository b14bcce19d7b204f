// Package lease holds the domain types shared by every part of the operator: quota levels,
// holders, counters, pod references and the typed outcomes of an acquisition (busy,
// unavailable, lost, invalid). It imports no storage driver, so the store, the pod watcher,
// the dispatcher and the HTTP APIs can share it. The model is described in docs/design.md.
package lease

import (
	"strings"
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

// Holder states: a holder is PENDING while it books its levels and HELD afterwards. A holder
// that found a level full and waits for a slot there is WAITING: it keeps the narrower levels
// it booked, and is no lease until a freed slot is handed to it (docs/waiting.md).
const (
	StatePending HolderState = "PENDING"
	StateHeld    HolderState = "HELD"
	StateWaiting HolderState = "WAITING"
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

// Holder is a held (or pending) lease as stored. The value Acquire returns leaves
// AcquiredAt and LastSeenAt zero: they are server times, read back only by the reads.
type Holder struct {
	// Token is the holder's secret: whoever has it may check, update and release the
	// lease. It is never shown; ID is.
	Token string
	// ID is the public holder ID (HolderID of the token).
	ID        string
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
	// Fence is the grant's fencing token: it strictly increases with every grant of the
	// resource, so that the resource can refuse a holder that was reaped and replaced
	// (docs/fencing.md). 0 for a holder not granted yet.
	Fence int64
	// Borrowed: the holder's tenant slot was granted above its tenant cap, from capacity
	// other tenants left idle; it is the first to be reclaimed (docs/borrowing.md).
	Borrowed bool
	// ReclaimedFor names, on a holder revoked by a reclaim, the waiter the slot was taken for
	// ("<tenant> waiter <id>"); empty otherwise.
	ReclaimedFor string
	// Parts are the resources of a holder that books several at once, in the order of their
	// resources (docs/waiting.md, "Several resources at once"); nil for a holder of one.
	// LeaseName, Resource and Fence are then those of the first part.
	Parts []Part
}

// Part is one resource of a holder that books several.
type Part struct {
	LeaseName string
	Resource  string
	// Fence is the part's fence: it strictly increases with every grant of its resource. 0
	// until the holder is granted.
	Fence int64
}

// LeaseNames is the holder's lease name, or its parts' names joined by "+".
func (h Holder) LeaseNames() string {
	if len(h.Parts) == 0 {
		return h.LeaseName
	}
	return JoinParts(h.Parts, func(p Part) string { return p.LeaseName })
}

// Resources is the holder's resource, or its parts' resources joined by "+".
func (h Holder) Resources() string {
	if len(h.Parts) == 0 {
		return h.Resource
	}
	return JoinParts(h.Parts, func(p Part) string { return p.Resource })
}

// JoinParts names the parts of an acquisition of several resources for people: what name
// gives of each, joined by "+" ("gpu+licence").
func JoinParts[T any](parts []T, name func(T) string) string {
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = name(p)
	}
	return strings.Join(names, "+")
}

// PartOf is the lease name of the part of the holder that books resource: the holder's lease
// name for a holder of one resource, "" when no part books it.
func (h Holder) PartOf(resource string) string {
	if len(h.Parts) == 0 {
		return h.LeaseName
	}
	for _, p := range h.Parts {
		if p.Resource == resource {
			return p.LeaseName
		}
	}
	return ""
}

// Counter is one counter document with the number of holders that book it.
type Counter struct {
	Key       string
	Resource  string
	Level     Level
	Scope     string
	Count     int
	UpdatedAt time.Time
	// Booked is the number of the counter's entries whose holder exists: what the count
	// comes back to once the repair has removed the others.
	Booked int
	// Holders are the public IDs of the holders the counter's entries name, sorted: exactly
	// who books the level.
	Holders []string
	// Gone are those of Holders whose holder document no longer exists: entries nobody will
	// give back, which the repair removes.
	Gone []string
	// Waiting is the number of live waiters in the counter's line: acquisitions that found
	// the level full and wait for one of its slots (the count stays at the cap while anyone
	// waits, so that newcomers queue behind them).
	Waiting int
	// Borrowed is the number of the booking holders that took their slot of this counter
	// above its cap, from capacity other tenants left idle: only a tenant counter has them
	// (docs/borrowing.md).
	Borrowed int
	// BookedBy are the distinct definitions the booking holders were admitted under, sorted;
	// the live API derives the counter's cap from them (docs/live-api.md, "Caps").
	BookedBy []DefinitionRef
}

// DefinitionRef names the definition a holder was admitted under: its lease name as resolved in
// its tenant and project.
type DefinitionRef struct {
	Name, Tenant, Project string
}

// Drift reports whether count and booked holders disagree.
func (c Counter) Drift() bool { return c.Count != c.Booked }

// HolderFilter selects holders for the operational reads; empty fields match everything.
// CounterFilter selects counters; empty fields match everything.
// ReconcileResult summarises one reconcile pass.

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
