package leasestore

import "time"

// counterAction is what reconcile does with one counter.
type counterAction int

// The reconcile decisions, in the order decideCounter tests them.
const (
	// actionNone: the count equals what is booked.
	actionNone counterAction = iota
	// actionSkip: the counter changed within the safety margin (an acquire or release may
	// be in flight); left alone.
	actionSkip
	// actionConfirm: the count is above what is booked, and no earlier pass has seen this
	// exact state for the confirmation delay; noted, lowered by a later pass.
	actionConfirm
	// actionDelete: nobody books it (a dormant counter, or a confirmed excess down to 0).
	actionDelete
	// actionLower: a confirmed excess; set the count to what is booked.
	actionLower
	// actionRaise: the count is below what is booked (a lost decrement cannot cause that,
	// a lost counter write can); raising is safe at once.
	actionRaise
)

// counterState is what one reconcile pass read of a counter.
type counterState struct {
	Count     int
	UpdatedAt time.Time
	// Booked is the number of holders whose levels contain the counter.
	Booked int
}

// reconcilePolicy is the timing a decision depends on.
type reconcilePolicy struct {
	// Now is the server's time at the start of the pass.
	Now time.Time
	// Margin: a counter changed within it is left alone.
	Margin time.Duration
	// Confirm: an excess is lowered only when seen unchanged this long.
	Confirm time.Duration
}

// decideCounter is the reconcile decision for one counter (docs/operations.md, "Reconcile"):
// skip a recent counter; raise at once; lower or delete only an excess that an earlier pass
// saw in exactly this state (count, updatedAt, booked) at least Confirm before, because a
// release deletes its holder before it decrements and a single look in between would return
// its slot twice. previous is the earlier observation of this counter, if any. The returned
// observation is to be remembered for the next pass when the action is actionConfirm.
func decideCounter(c counterState, p reconcilePolicy, previous *lowering) (counterAction, lowering) {
	if c.Count == c.Booked && c.Booked > 0 {
		return actionNone, lowering{}
	}
	if !c.UpdatedAt.Before(p.Now.Add(-p.Margin)) {
		return actionSkip, lowering{}
	}
	if c.Booked < c.Count {
		obs := lowering{count: c.Count, updatedAt: c.UpdatedAt, want: c.Booked, seen: p.Now}
		if previous != nil && previous.same(obs) {
			obs.seen = previous.seen
		} else {
			return actionConfirm, obs
		}
		if p.Now.Sub(obs.seen) < p.Confirm {
			return actionConfirm, obs
		}
	}
	switch {
	case c.Booked == 0:
		return actionDelete, lowering{}
	case c.Booked < c.Count:
		return actionLower, lowering{}
	default:
		return actionRaise, lowering{}
	}
}
