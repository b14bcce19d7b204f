package leasestore

import (
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// AcquireRequest is one attempt to book a slot at every capped level of a resource.
type AcquireRequest struct {
	// LeaseName is the definition the lease was resolved from (informational).
	LeaseName string
	// Resource is the counter key.
	Resource string
	// Caps lists the capped levels; order does not matter, the funnel runs narrow to wide.
	Caps      []lease.LevelCap
	Tenant    string
	Project   string
	User      string
	Type      string
	HolderRef string
	Pod       lease.PodRef
	PodBound  bool
	Payload   map[string]string
	// TTL is the idle time after which the holder may be reaped.
	TTL time.Duration
	// Token is the holder's token; empty: Acquire picks one. A waiting acquisition picks it
	// beforehand (NewToken), so that it can be woken by its holder ID from the start.
	Token string
	// WaitTTL > 0: a full level makes the holder wait in that level's line (WAITING) rather
	// than roll back, and Acquire answers a *WaitingError. The entry lapses WaitTTL after it
	// was last renewed (Resume); a lapsed entry is passed over.
	WaitTTL time.Duration
	// Priority orders the holder in a line: highest first, oldest first within a priority
	// (docs/waiting.md, "Priority"). 0 is the default and is not written. A waiter's Resume
	// writes the priority it is given, so a waiter past its definition's age bound is raised.
	Priority int
	// Borrow, when set, lets the holder take its tenant slot above the tenant cap while the
	// global level has room and nobody lines up there (docs/borrowing.md). It needs a tenant
	// and a global level among Caps; nil is off, and the funnel is exactly as without it.
	Borrow *Borrow
	// Parts, when set, makes the acquisition one of several resources at once, all or none
	// (docs/waiting.md, "Several resources at once"): one holder books every part's funnel,
	// the parts in the order of their resources, and becomes HELD, with one fence per part,
	// only once every slot is booked. LeaseName, Resource, Caps and Borrow are then unused.
	Parts []Part
}

// Part is one resource of an acquisition of several (AcquireRequest.Parts).
type Part struct {
	// LeaseName is the definition the part was resolved from.
	LeaseName string
	// Resource is the part's counter namespace; no two parts share one.
	Resource string
	// Caps are the part's capped levels, as AcquireRequest.Caps.
	Caps []lease.LevelCap
}

// MaxParts bounds the parts of one acquisition.
const MaxParts = 8

// Borrow is the borrowing an acquisition may do at its tenant level.
type Borrow struct {
	// MaxBorrowed bounds the slots its tenant holds above the tenant cap; 0: the global cap.
	MaxBorrowed int
}

// ReclaimRequest asks for a borrowed slot on behalf of a waiter at the global level of
// Resource (docs/borrowing.md, "Reclaim").
type ReclaimRequest struct {
	Resource string
	// Tenant and TenantKey are the waiter's tenant and its tenant level's counter; TenantCap
	// is that level's cap. A waiter whose tenant holds more than its cap is owed nothing.
	Tenant    string
	TenantKey string
	TenantCap int
	// For is the waiter's public holder ID, named in the revoked holder's ReclaimedFor.
	For string
}

// HolderFilter selects holders for the operational reads; empty fields match everything.
type HolderFilter struct {
	// Token selects one holder by its token.
	Token string
	// ID selects one holder by its public ID.
	ID     string
	Tenant string
	// ExcludeTenants leaves out the holders of these tenants (the system namespace shows
	// only tenants without a namespace of their own).
	ExcludeTenants []string
	Resource       string
	Type           string
	Project        string
	User           string
	// Pod is namespace/name.
	Pod string
}

// CounterFilter selects counters; empty fields match everything.
type CounterFilter struct {
	Resource string
	Level    lease.Level
	// Tenant restricts to the tenant, project and user counters of one tenant (the global
	// level belongs to no tenant and is left out).
	Tenant string
}

// ReconcileResult summarises one reconcile pass.
type ReconcileResult struct {
	// Repaired counts the entries removed because their holder was gone.
	Repaired int
	// Corrected counts the counters changed by the pass: entries removed, or a count set to
	// the number of entries.
	Corrected int
	// Deleted counts counters removed because nobody had booked them for the safety margin.
	Deleted int
	// Skipped counts counters left alone because they changed while read.
	Skipped int
	// Unmarked counts the holders whose borrowed mark was dropped: their tenant counter was
	// back within the cap they had borrowed above (docs/borrowing.md, "The mark").
	Unmarked int
}

// unavailable wraps a store error as LEASE_UNAVAILABLE, keeping the cause.
func unavailable(op string, err error) error { return lease.Unavailable(op, err) }
