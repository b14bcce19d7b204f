package tenantview

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

// Holder is one live holder as the view shows it (a LeaseHolder of the live API).
type Holder struct {
	// Name is the object's name: the holder's public ID (the live API never shows a token).
	Name string
	// Lease and Resource are the definition's name and the resource; a holder of several
	// resources has its parts' joined by "+" (gpu+licence), as the API's spec has them.
	Lease    string
	Resource string
	Type     string
	Tenant   string
	Project  string
	User     string
	// Pod is namespace/name of the holding pod, empty for a holder without a pod.
	Pod string
	// PodAlive is "True", "False" or "Unknown" (empty without a pod).
	PodAlive  string
	PodReason string
	TTL       time.Duration
	// AcquiredAt and LastSeenAt are the store's times.
	AcquiredAt time.Time
	LastSeenAt time.Time
	// Borrowed: its tenant slot was granted above the tenant cap, from capacity other tenants
	// left idle; it is reclaimed first (docs/borrowing.md).
	Borrowed bool
}

// Counter is one counter as the view shows it (a LeaseCounter of the live API).
type Counter struct {
	Resource string
	Level    string
	Scope    string
	Count    int64
	// Booked is the number of holders that book the counter: what reconcile corrects Count to.
	Booked int64
	// Waiting is the number of acquisitions waiting in the counter's line.
	Waiting int64
	// Borrowed is the number of booking holders whose slot was granted above the cap
	// (docs/borrowing.md).
	Borrowed int64
	// Cap is the level's cap the API publishes; 0 when it publishes none.
	Cap int64
	// CapReason is the API's reason for publishing no cap (Ambiguous, Uncapped,
	// Unresolved, NotBooked); CapNote explains it.
	CapReason string
	CapNote   string
	UpdatedAt time.Time
}

// Waiter is one acquisition waiting for a slot, as the view shows it (a LeaseWaiter of the
// live API).
type Waiter struct {
	// Name is the waiting holder's public ID.
	Name string
	// Lease and Resource are what it asked for; an acquisition of several resources has its
	// parts' joined by "+".
	Lease    string
	Resource string
	// WaitsOn is, for an acquisition of several resources, the resource of the part it waits
	// on (the parts before it are booked); empty for one of a single resource.
	WaitsOn string
	Project string
	User    string
	Pod     string
	// Level and Scope are the full level it waits at; Position the live waiters ahead of it
	// (of every tenant, unnamed).
	Level    string
	Scope    string
	Position int64
	// EstimatedWait is the API's estimate; 0 without one.
	EstimatedWait time.Duration
	Since         time.Time
	Lapsed        bool
	// Priority is the acquisition's priority: a line serves higher ones first (docs/waiting.md,
	// "Priority").
	Priority int64
}

// WaiterRow is a waiter with what the page derives from it.
type WaiterRow struct {
	Waiter
	// Waiting is the time since it lined up; Estimate the estimated wait, "unknown" without
	// one.
	Waiting  string
	Estimate string
}

// CapState is how the view shows a counter's cap.
type CapState string

// The cap states: a bar against the cap, a mark for definitions that disagree, a note for a
// level no definition caps, and "unknown" for everything else (docs/tenant-view.md).
const (
	CapKnown     CapState = "known"
	CapAmbiguous CapState = "ambiguous"
	CapNone      CapState = "uncapped"
	CapUnknown   CapState = "unknown"
)

// capState classifies a counter's cap as the API published it.
func capState(c Counter) CapState {
	switch {
	case c.Cap > 0:
		return CapKnown
	case c.CapReason == livev1alpha1.CapReasonAmbiguous:
		return CapAmbiguous
	case c.CapReason == livev1alpha1.CapReasonUncapped:
		return CapNone
	default:
		return CapUnknown
	}
}

// Levels a tenant may see, in the order the view lists them: widest first. The global level
// belongs to no tenant and is never shown (docs/tenant-view.md).
var tenantLevels = []string{"tenant", "project", "user"}

// idleNearFraction is the share of the TTL after which an idle holder is marked as close to
// being reaped.
const idleNearFraction = 0.75

// IdleState classifies a holder's idle time against its TTL.
type IdleState string

// The idle states.
const (
	IdleOK   IdleState = "ok"
	IdleNear IdleState = "near"
	IdleOver IdleState = "over"
)

// idleState says whether idle is well within ttl, close to it, or past it (the holder is due
// for the next idle reap). A holder without a TTL is never marked.
func idleState(idle, ttl time.Duration) IdleState {
	switch {
	case ttl <= 0:
		return IdleOK
	case idle >= ttl:
		return IdleOver
	case float64(idle) >= idleNearFraction*float64(ttl):
		return IdleNear
	default:
		return IdleOK
	}
}

// HolderRow is a holder with what the page derives from it.
type HolderRow struct {
	Holder
	Age       string
	Idle      string
	TTLText   string
	IdleState IdleState
	// IdlePercent is idle/TTL in percent, capped at 100.
	IdlePercent int
}

// CounterRow is a counter with its drift and occupancy.
type CounterRow struct {
	Counter
	// Drift is Count - Booked: positive blocks slots nobody holds, negative lets the cap be
	// exceeded.
	Drift     int64
	DriftText string
	// CapState says whether a bar is drawn (CapKnown) or why not.
	CapState CapState
	// Occupancy is the bar's text equivalent: "3 of 6" with a cap, "3 in use" without.
	Occupancy string
	// Percent is Count/Cap in percent, capped at 100 (0 without a cap).
	Percent int
	Full    bool
	// Low and High are the meter's bounds: green below half the cap, amber up to the last
	// free slot, red when full.
	Low, High float64
	Updated   string
}

// ResourceGroup is one resource's counters, widest level first.
type ResourceGroup struct {
	Resource string
	Counters []CounterRow
	// InUse are the counters with a count or a booking: the occupancy card leaves out the
	// empty counters the store keeps until reconcile removes them (the table lists them).
	InUse []CounterRow
	Drift bool
}

// Page is everything the main page shows.
type Page struct {
	Namespace string
	Holders   []HolderRow
	Resources []ResourceGroup
	// DriftCount is the number of counters with drift.
	DriftCount int
	// CanRevoke is the SelfSubjectAccessReview's answer for deleting leaseholders.
	CanRevoke bool
	// Waiters are the acquisitions waiting for a slot, highest priority first, oldest first
	// within a priority.
	Waiters []WaiterRow
}

// buildPage derives the page from what the API returned at now. Counters of levels a tenant
// does not see (global, or anything unknown) are dropped even if the API returned them: the
// view never shows the global level.
func buildPage(namespace string, now time.Time, holders []Holder, counters []Counter, waiters []Waiter, canRevoke bool) Page {
	p := Page{Namespace: namespace, CanRevoke: canRevoke}
	for _, h := range holders {
		idle := nonNegative(now.Sub(h.LastSeenAt))
		r := HolderRow{
			Holder:    h,
			Age:       humanDuration(nonNegative(now.Sub(h.AcquiredAt))),
			Idle:      humanDuration(idle),
			TTLText:   humanDuration(h.TTL),
			IdleState: idleState(idle, h.TTL),
		}
		if h.TTL > 0 {
			r.IdlePercent = min(100, int(idle*100/h.TTL))
		}
		p.Holders = append(p.Holders, r)
	}
	slices.SortFunc(p.Holders, func(a, b HolderRow) int {
		return cmp.Or(cmp.Compare(a.Resource, b.Resource), cmp.Compare(a.Project, b.Project),
			cmp.Compare(a.User, b.User), a.AcquiredAt.Compare(b.AcquiredAt), cmp.Compare(a.Name, b.Name))
	})

	byResource := map[string]*ResourceGroup{}
	var names []string
	for _, c := range counters {
		if !slices.Contains(tenantLevels, c.Level) {
			continue
		}
		g := byResource[c.Resource]
		if g == nil {
			g = &ResourceGroup{Resource: c.Resource}
			byResource[c.Resource] = g
			names = append(names, c.Resource)
		}
		row := CounterRow{Counter: c, Drift: c.Count - c.Booked, DriftText: driftText(c.Count - c.Booked),
			Updated: humanDuration(nonNegative(now.Sub(c.UpdatedAt)))}
		row.CapState = capState(c)
		row.Occupancy = fmt.Sprintf("%d in use", c.Count)
		if row.CapState == CapKnown {
			row.Occupancy = fmt.Sprintf("%d of %d", c.Count, c.Cap)
			row.Percent = int(min(100, max(0, c.Count)*100/c.Cap))
			row.Full = c.Count >= c.Cap
			row.Low, row.High = float64(c.Cap)/2, float64(c.Cap)-0.5
		}
		if row.Drift != 0 {
			g.Drift = true
			p.DriftCount++
		}
		g.Counters = append(g.Counters, row)
	}
	for _, w := range waiters {
		r := WaiterRow{Waiter: w, Waiting: humanDuration(nonNegative(now.Sub(w.Since))), Estimate: "unknown"}
		if w.EstimatedWait > 0 {
			r.Estimate = "about " + shortWait(w.EstimatedWait)
		}
		p.Waiters = append(p.Waiters, r)
	}
	// The lines serve the highest priority first, then the oldest (docs/waiting.md,
	// "Priority"); the API's times may be rounded to the second, so ties keep the API's order.
	slices.SortStableFunc(p.Waiters, func(a, b WaiterRow) int {
		return cmp.Or(cmp.Compare(b.Priority, a.Priority), a.Since.Compare(b.Since))
	})

	slices.Sort(names)
	for _, n := range names {
		g := byResource[n]
		slices.SortFunc(g.Counters, func(a, b CounterRow) int {
			return cmp.Or(cmp.Compare(slices.Index(tenantLevels, a.Level), slices.Index(tenantLevels, b.Level)),
				cmp.Compare(a.Scope, b.Scope))
		})
		for _, c := range g.Counters {
			if c.Count != 0 || c.Booked != 0 {
				g.InUse = append(g.InUse, c)
			}
		}
		p.Resources = append(p.Resources, *g)
	}
	return p
}

// driftText is "" without drift, else Count - Booked with its sign.
func driftText(d int64) string {
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("%+d", d)
}

func nonNegative(d time.Duration) time.Duration { return max(0, d) }

// shortWait is an estimate's text: milliseconds under a second, else humanDuration.
func shortWait(d time.Duration) string {
	if d < time.Second {
		return fmt.Sprintf("%dms", d.Milliseconds())
	}
	return humanDuration(d)
}

// humanDuration is a short, kubectl-like duration: 45s, 3m10s, 2h5m, 3d4h.
func humanDuration(d time.Duration) string {
	d = d.Truncate(time.Second)
	switch {
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d.Seconds()))
	case d < time.Hour:
		return trimZero(fmt.Sprintf("%dm%ds", int(d.Minutes()), int(d.Seconds())%60))
	case d < 24*time.Hour:
		return trimZero(fmt.Sprintf("%dh%dm", int(d.Hours()), int(d.Minutes())%60))
	default:
		return trimZero(fmt.Sprintf("%dd%dh", int(d.Hours())/24, int(d.Hours())%24))
	}
}

// trimZero drops a zero second unit ("3m0s" -> "3m").
func trimZero(s string) string {
	for _, suffix := range []string{"0s", "0m", "0h"} {
		if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix && (s[len(s)-len(suffix)-1] < '0' || s[len(s)-len(suffix)-1] > '9') {
			return s[:len(s)-len(suffix)]
		}
	}
	return s
}
