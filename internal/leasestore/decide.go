package leasestore

import "time"

// counterState is what reconcile read of one counter, and which of its entries name a holder
// that is gone (slots.go: checked by a read of the holders after the counter was read).
type counterState struct {
	Count     int
	Entries   int
	UpdatedAt time.Time
	Lined     bool
	// Gone are the entries whose holder document does not exist.
	Gone []string
}

// reconcilePolicy is the timing a decision depends on.
type reconcilePolicy struct {
	// Now is the server's time at the start of the pass.
	Now time.Time
	// Margin: a counter without entries is deleted once unchanged this long.
	Margin time.Duration
}

// counterDecision is what reconcile does with one counter: remove the entries of gone
// holders, set the count to the number of entries (it never differs unless a writer that
// does not keep them in step wrote it: an old version's agent), delete a counter nobody has
// booked for the margin (the next booking creates it again).
type counterDecision struct {
	Remove   []string
	FixCount bool
	Delete   bool
}

// decideCounter is the reconcile decision for one counter (docs/operations.md, "Reconcile").
// Every write it leads to is conditional on what was read (the entry; the count and
// updatedAt), so a concurrent booking or give-back wins.
func decideCounter(c counterState, p reconcilePolicy) counterDecision {
	d := counterDecision{Remove: c.Gone}
	live := c.Entries - len(c.Gone)
	d.FixCount = len(c.Gone) == 0 && c.Count != c.Entries
	d.Delete = live == 0 && len(c.Gone) == 0 && c.Count == 0 && !c.Lined && c.UpdatedAt.Before(p.Now.Add(-p.Margin))
	return d
}
