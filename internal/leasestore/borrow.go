package leasestore

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Borrowing (docs/borrowing.md). A tenant level that refuses may still grant, above its cap,
// when the acquisition may borrow (AcquireRequest.Borrow) and the global level, the next and
// last of the funnel, has room and no line: the tenant counter is incremented up to its cap
// plus the borrowing limit, and the holder records the borrowed slot (borrowKey, borrowCap) in
// the write that books it. Every other level stays exact: the global counter is incremented
// as always, on the condition that it is below its cap.
//
// A borrower never waits at the global level: refused there (the global level filled between
// the look and the increment, or the borrowed slot was handed over while another tenant's
// waiter took the global one), it gives the borrowed slot back and waits at its tenant level
// instead (unborrow). So the global line holds only waiters within their tenant caps, and a
// borrowed slot that comes back to the tenant line is handed over with its mark.

// borrowable reports whether level i may grant above its cap: it is the tenant level, the
// acquisition may borrow, and the global level follows as the funnel's last.
func (b *funnelRun) borrowable(i int) bool {
	return b.borrow != nil && i >= 0 && i+2 == len(b.levels) &&
		b.levels[i].Level == lease.LevelTenant && b.levels[i+1].Level == lease.LevelGlobal
}

// borrowLimit is the count the tenant level i may reach by borrowing: its cap plus the
// borrowing limit, or plus the global cap when the limit is 0 (the global level bounds it).
func (b *funnelRun) borrowLimit(i int) int {
	extra := b.borrow.MaxBorrowed
	if extra <= 0 {
		extra = b.levels[i+1].Cap
	}
	return b.levels[i].Cap + extra
}

// globalHasRoom is the borrowing's guard: the global level after the tenant level i is below
// its cap and not lined. While a waiter lines up at the global level its count stays at the
// cap, so room there means no waiter of any tenant stands in its line. It is a hint: a
// borrower refused at the global level after all gives its slot back (unborrow), and a waiter
// that lines up after the look is served by reclaim.
func (b *funnelRun) globalHasRoom(ctx context.Context, i int) (bool, error) {
	g := b.levels[i+1]
	var c counterDoc
	err := b.store.counters.FindOne(ctx, bson.D{{Key: "_id", Value: g.key}},
		options.FindOne().SetProjection(bson.D{{Key: "count", Value: 1}, {Key: "lined", Value: 1}})).Decode(&c)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return true, nil
	case err != nil:
		return false, unavailable("reading counter "+g.key, err)
	}
	return c.Count < g.Cap && !c.Lined, nil
}

// borrowAt tries to book the tenant level i above its cap, its entry marked borrowed. ok:
// the slot is booked and is borrowed.
func (b *funnelRun) borrowAt(ctx context.Context, i int) (ok bool, err error) {
	room, err := b.globalHasRoom(ctx, i)
	if err != nil || !room {
		return false, err
	}
	l := b.levels[i]
	ok, _, err = b.store.book(ctx, l, b.doc.Resource, b.doc.Tenant, b.doc.PID, b.borrowLimit(i), slotDoc{Borrowed: true})
	return ok, err
}

// borrowing adds the borrowed slot of level i to the $set of the write that books it.
func (b *funnelRun) borrowing(update bson.D, i int) bson.D {
	l := b.levels[i]
	b.doc.BorrowKey, b.doc.BorrowCap = l.key, l.Cap
	return setting(update, bson.E{Key: "borrowKey", Value: l.key}, bson.E{Key: "borrowCap", Value: l.Cap})
}

// setting adds fields to the $set of update (creating it).
func setting(update bson.D, fields ...bson.E) bson.D {
	for i, e := range update {
		if e.Key == "$set" {
			update[i].Value = append(slices.Clip(e.Value.(bson.D)), fields...)
			return update
		}
	}
	return append(update, bson.E{Key: "$set", Value: bson.D(fields)})
}

// unborrow follows a refusal at the global level of a holder whose tenant level ti is above
// its cap: a borrower (its slot is marked), or any other holder of the tenant (unmarked: a
// waiter of the tenant's line handed a slot freed while the tenant was above its cap, or an
// acquisition that booked within the cap before a borrower went above it). It removes its
// tenant entry, on the condition that the tenant counter is above the cap, and waits in the
// tenant level's line, keeping its place, so that the global line holds only waiters within
// their tenant caps and a reclaimed slot goes to the waiter that reclaimed it. again is true
// when the holder booked the tenant level again after all (within its cap); kept is true when
// its tenant was within its cap after all, and the holder keeps its slot (unmarked) and waits
// at the global level.
func (b *funnelRun) unborrow(ctx context.Context, ti int) (again, kept bool, err error) {
	s, l := b.store, b.levels[ti]
	what := "returning the slot above the cap of " + l.key
	if err := s.fault(StepUnborrowed, l.key); err != nil {
		return false, false, s.abandon(ctx, b.doc, unavailable(what, err))
	}
	// Above the cap, the slot is nobody's in the tenant's line: it is removed, only while
	// the count is above the cap: two holders of the tenant that both saw it one above give
	// back one slot, not two (the count never dips below the cap while the tenant's line
	// waits, where a newcomer could take the slot ahead of it).
	res, err := s.counters.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: l.key}, {Key: slotField(b.doc.PID), Value: entryPresent}, {Key: "count", Value: bson.D{{Key: "$gt", Value: l.Cap}}}},
		removal(b.doc.PID))
	switch {
	case err != nil:
		return false, false, s.abandon(ctx, b.doc, unavailable(what, err))
	case res.MatchedCount == 0:
		return false, true, nil // within the cap after all
	}
	res, err = s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: b.doc.ID}, {Key: "state", Value: string(lease.StatePending)}},
		bson.D{
			{Key: "$pull", Value: bson.D{{Key: "levels", Value: l.key}}},
			{Key: "$unset", Value: bson.D{{Key: "borrowKey", Value: ""}, {Key: "borrowCap", Value: ""}}},
		})
	switch {
	case err != nil:
		return false, false, s.abandon(ctx, b.doc, unavailable(what, err))
	case res.MatchedCount == 0:
		return false, false, s.abandon(ctx, b.doc, &lease.BusyError{Resource: b.doc.Resource, Level: l.Level, Scope: l.scope, Count: l.Cap, Cap: l.Cap})
	}
	b.doc.Levels = slices.DeleteFunc(slices.Clone(b.doc.Levels), func(k string) bool { return k == l.key })
	b.doc.BorrowKey, b.doc.BorrowCap = "", 0
	busy := &lease.BusyError{Resource: b.doc.Resource, Level: l.Level, Scope: l.scope, Count: l.Cap, Cap: l.Cap}
	again, err = b.wait(ctx, l, busy)
	return again, false, err
}

// giveBackBorrowed gives back the slot a released holder pid borrowed at key: to the first
// live waiter of the tenant's line, which takes the mark with it (its tenant is still above
// its cap by that slot), or removed.
func (s *Store) giveBackBorrowed(ctx context.Context, key, pid string, borrowCap int) (given int, err error) {
	r, _, _ := strings.Cut(key, "|")
	rest, err := s.handOverOf(ctx, r, []string{key}, pid, holdSample{},
		bson.D{{Key: "borrowKey", Value: key}, {Key: "borrowCap", Value: borrowCap}})
	if err != nil {
		return 0, err
	}
	n, err := s.unbook(ctx, rest, pid, false)
	return 1 - len(rest) + n, err
}

// markedHolder is a held holder marked borrowed, as a read of the holders saw it.
type markedHolder struct {
	id        string
	borrowCap int
}

// borrowMarks are the held holders marked borrowed, per tenant counter (borrowKey).
type borrowMarks map[string][]markedHolder

// staleAt lists the marks at the counter key of holders whose cap its count no longer exceeds: their
// tenant is back within its cap, so none of its slots is borrowed. The holders were read
// before c: a holder granted above the cap after the read carries a mark the read did not
// see, and a held holder never gains a mark, so a mark listed here was stale when c was read
// and stays so. (Marks that merely outnumber the slots above the cap are left: which of
// them stand for those slots is for a reclaim to decide, newest first.)
//
// count is the counter's count, or the holders that book it when more (a counter that drifted
// below them is not taken at its word).
func (m borrowMarks) staleAt(key string, count int) []string {
	var out []string
	for _, h := range m[key] {
		if count <= h.borrowCap {
			out = append(out, h.id)
		}
	}
	return out
}

// unmarkBatch is how many holders one command of unmark names.
const unmarkBatch = 100

// unmark drops the borrowed marks of the held holders ids, unmarkBatch per command; n is how
// many it dropped.
func (s *Store) unmark(ctx context.Context, ids []string) (n int, err error) {
	for batch := range slices.Chunk(ids, unmarkBatch) {
		uctx, cancel := s.bound(ctx)
		res, err := s.holders.UpdateMany(uctx, bson.D{
			{Key: "_id", Value: bson.D{{Key: "$in", Value: batch}}},
			{Key: "state", Value: string(lease.StateHeld)},
			{Key: "borrowKey", Value: bson.D{{Key: "$exists", Value: true}}},
		}, bson.D{{Key: "$unset", Value: bson.D{{Key: "borrowKey", Value: ""}, {Key: "borrowCap", Value: ""}}}})
		cancel()
		if err != nil {
			return n, unavailable("dropping stale borrowed marks", err)
		}
		n += int(res.ModifiedCount)
	}
	return n, nil
}

// Reclaim takes a borrowed slot back for a waiter at the global level of req.Resource whose
// tenant holds no more than its cap: it revokes the most recently granted (highest fence)
// borrowed holder of another tenant whose tenant still holds more than the cap it borrowed
// above, so no holder within its tenant's cap is revoked. Its slots are given back as in any
// revocation: the global one to the first live waiter of the global line. ok is false when
// nothing was revoked (the waiter is owed nothing, or nobody borrows). Marks at tenant
// counters back within their caps are dropped on the way (staleAt), as by reconcile.
func (s *Store) Reclaim(ctx context.Context, req ReclaimRequest) (lease.Holder, bool, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	own, err := s.count(ctx, req.TenantKey)
	if err != nil || own > req.TenantCap {
		return lease.Holder{}, false, err
	}
	docs, err := s.borrowers(ctx, req.Resource, req.Tenant)
	if err != nil || len(docs) == 0 {
		return lease.Holder{}, false, err
	}
	counters, err := s.countersOf(ctx, docs)
	if err != nil {
		return lease.Holder{}, false, err
	}
	live, err := s.liveEntries(ctx, counters)
	if err != nil {
		return lease.Holder{}, false, err
	}
	counts := map[string]int{}
	for _, c := range counters {
		counts[c.ID] = c.Count
	}
	// docs are newest first: per borrowed counter, the first n-cap of them stand for the
	// slots above the cap; a further mark is stale, and is not taken. n is the counter's
	// entries whose holders are not being released: a holder another reclaim (or release) is
	// revoking keeps its entry until its give-back, and counting it revoked a second holder
	// for the one slot above the cap, leaving the tenant below it. Marks at a counter back
	// within its cap are dropped (staleAt), judged on the count alone (dropping a mark wrongly
	// is the risk there, so the larger number is the safe one).
	above := map[string]int{}
	var stale []string
	var victim *holderDoc
	for i := range docs {
		d := &docs[i]
		c := counts[d.BorrowKey]
		if c <= d.BorrowCap {
			stale = append(stale, d.ID)
		}
		if above[d.BorrowKey] >= min(c, live[d.BorrowKey])-d.BorrowCap {
			continue
		}
		above[d.BorrowKey]++
		if victim == nil {
			victim = d
		}
	}
	if _, err := s.unmark(ctx, stale); err != nil {
		return lease.Holder{}, false, err
	}
	if victim == nil {
		return lease.Holder{}, false, nil
	}
	h, ok, err := s.releaseHolder(ctx, bson.D{
		{Key: "_id", Value: victim.ID}, {Key: "state", Value: string(lease.StateHeld)}, {Key: "borrowKey", Value: victim.BorrowKey},
	}, nil)
	if ok {
		h.ReclaimedFor = req.Tenant + " waiter " + req.For
	}
	return h, ok, err
}

// borrowers reads the held, borrowed holders of resource of tenants other than tenant,
// newest grant first.
func (s *Store) borrowers(ctx context.Context, resource, tenant string) ([]holderDoc, error) {
	cur, err := s.holders.Find(ctx, bson.D{
		{Key: "resource", Value: resource},
		{Key: "state", Value: string(lease.StateHeld)},
		{Key: "borrowKey", Value: bson.D{{Key: "$exists", Value: true}}},
		{Key: "tenant", Value: bson.D{{Key: "$ne", Value: tenant}}},
	}, options.Find().SetSort(bson.D{{Key: "fence", Value: -1}}).
		SetProjection(bson.D{{Key: "_id", Value: 1}, {Key: "borrowKey", Value: 1}, {Key: "borrowCap", Value: 1}, {Key: "fence", Value: 1}}))
	if err != nil {
		return nil, unavailable("reading the borrowers of "+resource, err)
	}
	var docs []holderDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("reading the borrowers of "+resource, err)
	}
	return docs, nil
}

// liveEntries counts, per counter, the entries whose holders are not being released, in one
// round trip (the holders being released among those the entries name).
func (s *Store) liveEntries(ctx context.Context, counters []counterDoc) (map[string]int, error) {
	var pids []string
	for _, c := range counters {
		pids = append(pids, c.entries()...)
	}
	out := make(map[string]int, len(counters))
	if len(pids) == 0 {
		return out, nil
	}
	docs, err := s.findHolders(ctx, bson.D{{Key: "pid", Value: bson.D{{Key: "$in", Value: pids}}}, {Key: "state", Value: stateReleased}},
		bson.D{{Key: "pid", Value: 1}})
	if err != nil {
		return nil, err
	}
	released := map[string]bool{}
	for _, d := range docs {
		released[d.PID] = true
	}
	for _, c := range counters {
		for p := range c.Slots {
			if !released[p] {
				out[c.ID]++
			}
		}
	}
	return out, nil
}

// countersOf reads the counters the holders borrowed at, in one round trip.
func (s *Store) countersOf(ctx context.Context, docs []holderDoc) ([]counterDoc, error) {
	var keys bson.A
	for _, d := range docs {
		if !slices.Contains(keys, any(d.BorrowKey)) {
			keys = append(keys, d.BorrowKey)
		}
	}
	cur, err := s.counters.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}},
		options.Find().SetProjection(bson.D{{Key: "count", Value: 1}, {Key: "slots", Value: 1}}))
	if err != nil {
		return nil, unavailable("reading the borrowed counters", err)
	}
	var cs []counterDoc
	if err := cur.All(ctx, &cs); err != nil {
		return nil, unavailable("reading the borrowed counters", err)
	}
	return cs, nil
}
