package leasestore

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// readBatch is how many documents one streaming read command (reconcile, sweeps) returns: each command
// stays short on the server, and reconcile holds one batch of counters at a time. Small,
// because the development store runs one command at a time: every round trip of an
// acquisition that arrives during a sweep waits for the batch being read, so the batch
// bounds what a sweep of many holders adds to an acquisition (docs/operations.md,
// "Behaviour at scale"). On MongoDB it only costs more getMores.
const readBatch = 32

// Reconcile recomputes every counter from the holders' registered levels and corrects the
// drift left by crash windows (between increment and push, between delete and decrement).
// The decision per counter is decideCounter: only counters unchanged for the safety margin
// are touched, an excess is lowered only when confirmed by a later pass, and every write is a
// compare-and-set on the count and updatedAt it read, so a concurrent acquire or release wins.
// A counter that no holder books is deleted rather than zeroed.
//
// It streams: the holders' levels are read in batches into a count per counter key (memory
// grows with the number of counters, not with the holders' documents), then the counters in
// batches, each decided and written at once. Every read and write command has its own
// deadline (the operation timeout), so a large store takes longer but never fails for its
// size, and no single command holds the store for long (docs/operations.md, "Reconcile").
func (s *Store) Reconcile(ctx context.Context) (ReconcileResult, error) {
	var res ReconcileResult
	now, err := s.ServerTime(ctx)
	if err != nil {
		return res, err
	}
	// Everything written from here on carries an updatedAt after now, and a counter changed
	// within the margin before now is skipped: what the two reads below see of an acquire or
	// release in flight cannot lead to a write.
	b, err := s.bookings(ctx, CounterFilter{}, false)
	if err != nil {
		return res, err
	}
	booked, marks := map[string]int{}, borrowMarks{}
	for k, v := range b {
		booked[k] = v.n
		if len(v.marked) > 0 {
			marks[k] = v.marked
		}
	}
	return s.reconcile(ctx, now, booked, marks)
}

// reconcile decides and corrects every counter against booked, the holders' bookings read
// after the server's time now, and drops the borrowed marks of marks at counters that are
// within their caps (borrowMarks.staleAt), last: a mark is for the views, a count for the caps.
func (s *Store) reconcile(ctx context.Context, now time.Time, booked map[string]int, marks borrowMarks) (ReconcileResult, error) {
	var res ReconcileResult
	policy := reconcilePolicy{Now: now, Margin: s.cfg.safetyMargin, Confirm: s.cfg.confirm}
	s.mu.Lock()
	previous := s.lowering
	s.lowering = map[string]lowering{}
	s.mu.Unlock()
	seen := make(map[string]bool, len(booked))
	var stale []string
	err := s.eachCounter(ctx, bson.D{}, func(c counterDoc) error {
		want := booked[c.ID]
		stale = append(stale, marks.staleAt(c.ID, max(c.Count, want))...)
		if want > 0 {
			seen[c.ID] = true
		}
		var prev *lowering
		if p, ok := previous[c.ID]; ok {
			prev = &p
		}
		action, obs := decideCounter(counterState{Count: c.Count, UpdatedAt: c.UpdatedAt, Booked: want}, policy, prev)
		switch action {
		case actionNone:
			return nil
		case actionSkip:
			res.Skipped++
			return nil
		case actionConfirm:
			s.mu.Lock()
			s.lowering[c.ID] = obs
			s.mu.Unlock()
			res.Skipped++
			return nil
		}
		done, err := s.correctCounter(ctx, c, want, action)
		switch {
		case err != nil:
			return err
		case !done: // changed since it was read
			res.Skipped++
		case action == actionDelete:
			res.Deleted++
			if c.Count > 0 {
				res.Lowered++
			}
		default:
			res.Corrected++
			if action == actionLower {
				res.Lowered++
			}
		}
		return nil
	})
	if err != nil {
		return res, err
	}
	// A booked key without a counter cannot come from the funnel (it increments before it
	// pushes); recreate it so the cap holds again.
	for key, n := range booked {
		if seen[key] {
			continue
		}
		created, err := s.recreateCounter(ctx, key, n, now)
		switch {
		case err != nil:
			return res, err
		case created:
			res.Created++
		default:
			res.Skipped++
		}
	}
	res.Unmarked, err = s.unmark(ctx, stale)
	return res, err
}

// correctCounter applies a reconcile decision to c by a compare-and-set on the count and
// updatedAt it read, with its own deadline; done is false when c changed since.
func (s *Store) correctCounter(ctx context.Context, c counterDoc, want int, action counterAction) (done bool, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cas := bson.D{{Key: "_id", Value: c.ID}, {Key: "count", Value: c.Count}, {Key: "updatedAt", Value: c.UpdatedAt}}
	if action == actionDelete {
		r, err := s.counters.DeleteOne(ctx, cas)
		if err != nil {
			return false, unavailable("deleting counter "+c.ID, err)
		}
		return r.DeletedCount == 1, nil
	}
	r, err := s.counters.UpdateOne(ctx, cas, bson.D{
		{Key: "$set", Value: bson.D{{Key: "count", Value: want}}},
		{Key: "$inc", Value: bson.D{{Key: "rev", Value: 1}}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	})
	if err != nil {
		return false, unavailable("correcting counter "+c.ID, err)
	}
	return r.MatchedCount == 1, nil
}

// recreateCounter inserts the counter key with count n, with its own deadline; created is
// false when a counter of that key exists (made since it was missed).
func (s *Store) recreateCounter(ctx context.Context, key string, n int, now time.Time) (created bool, err error) {
	resource, level, scope, ok := splitKey(key)
	if !ok {
		return false, nil
	}
	tenant := ""
	if level != lease.LevelGlobal {
		tenant, _, _ = strings.Cut(scope, "/")
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	_, err = s.counters.InsertOne(ctx, counterDoc{
		ID: key, Resource: resource, Level: string(level), Scope: scope, Tenant: tenant, Count: n, UpdatedAt: now,
	})
	switch {
	case mongo.IsDuplicateKeyError(err):
		return false, nil
	case err != nil:
		return false, unavailable("recreating counter "+key, err)
	}
	return true, nil
}

// booking is what the holders of one counter key have in common: how many book it and,
// when asked for, the distinct definitions they were admitted under.
type booking struct {
	n    int
	refs map[lease.DefinitionRef]bool
	// waiting: live waiters in the counter's line (the views show it; reconcile ignores it).
	waiting int
	// borrowed: the booking holders whose slot of this counter is borrowed (borrowKey names
	// it); the views show it, reconcile ignores it.
	borrowed int
	// borrowCap: the highest cap those holders borrowed above (the views show no more borrowed
	// slots than the count stands above it); marked: the held ones among them (reconcile
	// drops their marks once the counter is back within that cap).
	borrowCap int
	marked    []markedHolder
}

// bookings reads the holders (of f's resource and tenant, or all) in batches and gathers,
// per counter key, the number of holders that book it and, with refs, their distinct lease
// references. Only a tenant's own holders book its tenant, project and user counters, so a
// read for one tenant's counters reads that tenant's holders alone.
func (s *Store) bookings(ctx context.Context, f CounterFilter, refs bool) (map[string]*booking, error) {
	filter := bson.D{}
	if f.Resource != "" {
		filter = append(filter, bson.E{Key: "resource", Value: f.Resource})
	}
	if f.Tenant != "" {
		filter = append(filter, bson.E{Key: "tenant", Value: f.Tenant})
	}
	projection := bson.D{{Key: "levels", Value: 1}, {Key: "grantKey", Value: 1}, {Key: "state", Value: 1},
		{Key: "waitKey", Value: 1}, {Key: "waitExp", Value: 1}, {Key: "borrowKey", Value: 1}, {Key: "borrowCap", Value: 1}}
	now := time.Now()
	if refs {
		projection = append(projection, bson.E{Key: "leaseName", Value: 1}, bson.E{Key: "tenant", Value: 1}, bson.E{Key: "project", Value: 1})
	}
	out := map[string]*booking{}
	err := eachDoc(ctx, s, s.holders, "reading holders", filter, projection, nil,
		func(d holderDoc) error {
			if d.State == stateReleased {
				return nil // being released: its slots are on their way back
			}
			if d.State == string(lease.StateWaiting) && d.WaitKey != "" && d.WaitExp.After(now) {
				b := out[d.WaitKey]
				if b == nil {
					b = &booking{}
					out[d.WaitKey] = b
				}
				b.waiting++
			}
			for _, k := range d.booked() {
				b := out[k]
				if b == nil {
					b = &booking{}
					out[k] = b
				}
				b.n++
				if k == d.BorrowKey {
					b.borrowed++
					b.borrowCap = max(b.borrowCap, d.BorrowCap)
					if d.State == string(lease.StateHeld) {
						b.marked = append(b.marked, markedHolder{id: d.ID, borrowCap: d.BorrowCap})
					}
				}
				if refs {
					if b.refs == nil {
						b.refs = map[lease.DefinitionRef]bool{}
					}
					b.refs[lease.DefinitionRef{Name: d.LeaseName, Tenant: d.Tenant, Project: d.Project}] = true
				}
			}
			return nil
		})
	return out, err
}

// sortedRefs lists the lease references of b in a stable order (none for nil).
func (b *booking) sortedRefs() []lease.DefinitionRef {
	if b == nil || len(b.refs) == 0 {
		return nil
	}
	out := make([]lease.DefinitionRef, 0, len(b.refs))
	for r := range b.refs {
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool {
		a, c := out[i], out[j]
		if a.Name != c.Name {
			return a.Name < c.Name
		}
		if a.Tenant != c.Tenant {
			return a.Tenant < c.Tenant
		}
		return a.Project < c.Project
	})
	return out
}

// eachCounter calls f with every counter matching filter, in batches, in no particular order:
// each counter is decided on its own. (Asking for an order costs nothing on MongoDB, where
// the _id index gives it, but the development server sorts the whole collection before it
// answers the first batch: 0.5 s at 11 000 counters, during which no other command runs.)
func (s *Store) eachCounter(ctx context.Context, filter bson.D, f func(counterDoc) error) error {
	return eachDoc(ctx, s, s.counters, "reading counters", filter, nil, nil, f)
}

// eachDoc streams the documents of coll matching filter to f, readBatch per command;
// the find and every getMore have their own deadline. An error from f stops it.
func eachDoc[T any](ctx context.Context, s *Store, coll *mongo.Collection, what string, filter, projection, sort bson.D, f func(T) error) error {
	opts := options.Find().SetBatchSize(readBatch)
	if projection != nil {
		opts.SetProjection(projection)
	}
	if sort != nil {
		opts.SetSort(sort)
	}
	fctx, cancel := s.bound(ctx)
	cur, err := coll.Find(fctx, filter, opts)
	cancel()
	if err != nil {
		return unavailable(what, err)
	}
	defer func() {
		cctx, cancel := s.bound(context.WithoutCancel(ctx))
		defer cancel()
		_ = cur.Close(cctx)
	}()
	for {
		nctx, cancel := s.bound(ctx)
		ok := cur.Next(nctx)
		cancel()
		if !ok {
			break
		}
		var doc T
		if err := cur.Decode(&doc); err != nil {
			return unavailable(what, err)
		}
		if err := f(doc); err != nil {
			return err
		}
	}
	if err := cur.Err(); err != nil {
		return unavailable(what, err)
	}
	return nil
}

func (s *Store) findCounters(ctx context.Context, filter bson.D) ([]counterDoc, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cur, err := s.counters.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, unavailable("reading counters", err)
	}
	var docs []counterDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("reading counters", err)
	}
	return docs, nil
}

// ListCounters reads the counters matching f with, for each, the number of holders that book
// it, so drift is visible instead of hidden.
func (s *Store) ListCounters(ctx context.Context, f CounterFilter) ([]lease.Counter, error) {
	filter := bson.D{}
	if f.Resource != "" {
		filter = append(filter, bson.E{Key: "resource", Value: f.Resource})
	}
	if f.Level != "" {
		filter = append(filter, bson.E{Key: "level", Value: string(f.Level)})
	}
	if f.Tenant != "" {
		filter = append(filter, bson.E{Key: "tenant", Value: f.Tenant})
	}
	docs, err := s.findCounters(ctx, filter)
	if err != nil {
		return nil, err
	}
	booked, err := s.bookings(ctx, f, true)
	if err != nil {
		return nil, err
	}
	out := make([]lease.Counter, len(docs))
	for i, d := range docs {
		b := booked[d.ID]
		out[i] = lease.Counter{
			Key: d.ID, Resource: d.Resource, Level: lease.Level(d.Level), Scope: d.Scope,
			Count: d.Count, UpdatedAt: d.UpdatedAt, BookedBy: b.sortedRefs(),
		}
		if b != nil {
			// Marks that outnumber the slots above the cap are stale (docs/borrowing.md,
			// "The mark"): the count shows the slots borrowed.
			out[i].Booked, out[i].Waiting, out[i].Borrowed = b.n, b.waiting, min(b.borrowed, max(d.Count-b.borrowCap, 0))
		}
	}
	return out, nil
}

// splitKey parses <resource>|<level>|<scope>. The resource may itself contain '|' only if
// a caller chose so; the level and scope are the last two fields.
func splitKey(key string) (resource string, level lease.Level, scope string, ok bool) {
	i := strings.LastIndex(key, "|")
	if i < 0 {
		return "", "", "", false
	}
	j := strings.LastIndex(key[:i], "|")
	if j < 0 {
		return "", "", "", false
	}
	return key[:j], lease.Level(key[j+1 : i]), key[i+1:], true
}

func cutPod(pod string) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(pod, "/")
	if !ok {
		return "", pod, false
	}
	return namespace, name, true
}

func sortHolders(hs []lease.Holder) {
	sort.SliceStable(hs, func(i, j int) bool {
		if !hs[i].AcquiredAt.Equal(hs[j].AcquiredAt) {
			return hs[i].AcquiredAt.Before(hs[j].AcquiredAt)
		}
		return hs[i].Token < hs[j].Token
	})
}

// lowering is a counter seen above what its holders book, remembered until a later pass
// confirms it.
type lowering struct {
	count     int
	updatedAt time.Time
	want      int
	// seen is the server time of the first pass that saw exactly this state.
	seen time.Time
}

func (l lowering) same(o lowering) bool {
	return l.count == o.count && l.updatedAt.Equal(o.updatedAt) && l.want == o.want
}
