package leasestore

import (
	"context"
	"slices"
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

// Reconcile repairs every counter (docs/operations.md, "Reconcile"): the entries whose
// holder document is gone are removed (slots.go), a count that differs from the number of
// entries is set to it, a counter nobody has booked for the safety margin is deleted, and the
// borrowed marks of holders whose tenant counter is back within its cap are dropped. It reads
// the holders, then streams the counters in batches; an entry of a holder the first read did
// not see is looked up again after its batch (the holder may have been written since), so
// that only entries of holders that are gone are removed. Every write is conditional on what
// was read, so a concurrent booking or give-back wins.
func (s *Store) Reconcile(ctx context.Context) (ReconcileResult, error) {
	now, err := s.ServerTime(ctx)
	if err != nil {
		return ReconcileResult{}, err
	}
	// One streaming read of every holder (an unfiltered read comes back in short batches on
	// every store): the holders that exist, and the borrowed marks.
	known, marks := map[string]bool{}, borrowMarks{}
	err = eachDoc(ctx, s, s.holders, "reading holders", bson.D{},
		bson.D{{Key: "_id", Value: 1}, {Key: "pid", Value: 1}, {Key: "state", Value: 1}, {Key: "borrowKey", Value: 1}, {Key: "borrowCap", Value: 1}}, nil,
		func(d holderDoc) error {
			if d.PID != "" {
				known[d.PID] = true
			}
			if d.BorrowKey != "" && d.State == string(lease.StateHeld) {
				marks[d.BorrowKey] = append(marks[d.BorrowKey], markedHolder{id: d.ID, borrowCap: d.BorrowCap})
			}
			return nil
		})
	if err != nil {
		return ReconcileResult{}, err
	}
	return s.reconcile(ctx, now, known, marks)
}

// reconcile decides and repairs every counter. known are holder IDs read before the counters
// (a sweep's read), which need no second look; every other entry's holder is looked up.
// marks are the held holders marked borrowed, per tenant counter, read before the counters:
// those at counters within the cap they borrowed above are dropped (borrowMarks.staleAt),
// last: a mark is for the views, an entry for the caps.
func (s *Store) reconcile(ctx context.Context, now time.Time, known map[string]bool, marks borrowMarks) (ReconcileResult, error) {
	var res ReconcileResult
	policy := reconcilePolicy{Now: now, Margin: s.cfg.safetyMargin}
	var stale []string
	var batch []counterDoc
	flush := func() error {
		if len(batch) == 0 {
			return nil
		}
		var ask []string
		for _, c := range batch {
			for _, p := range c.entries() {
				if !known[p] {
					ask = append(ask, p)
				}
			}
		}
		gone, err := s.goneHolders(ctx, ask)
		if err != nil {
			return err
		}
		isGone := map[string]bool{}
		for _, p := range gone {
			isGone[p] = true
		}
		for _, c := range batch {
			st := counterState{Count: c.Count, Entries: len(c.Slots), UpdatedAt: c.UpdatedAt, Lined: c.Lined}
			for _, p := range c.entries() {
				if isGone[p] {
					st.Gone = append(st.Gone, p)
				}
			}
			stale = append(stale, marks.staleAt(c.ID, c.Count)...)
			if err := s.apply(ctx, c, decideCounter(st, policy), &res); err != nil {
				return err
			}
		}
		batch = batch[:0]
		return nil
	}
	err := s.eachCounter(ctx, bson.D{}, func(c counterDoc) error {
		batch = append(batch, c)
		if len(batch) < readBatch {
			return nil
		}
		return flush()
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return res, err
	}
	res.Unmarked, err = s.unmark(ctx, stale)
	return res, err
}

// apply carries out a reconcile decision on c, each write with its own deadline and
// conditional on what was read.
func (s *Store) apply(ctx context.Context, c counterDoc, d counterDecision, res *ReconcileResult) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	switch {
	case len(d.Remove) > 0:
		n, err := s.removeEntries(ctx, c.ID, d.Remove)
		res.Repaired += n
		if n > 0 {
			res.Corrected++
		}
		return err
	case d.FixCount:
		r, err := s.counters.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: c.ID}, {Key: "count", Value: c.Count}, {Key: "updatedAt", Value: c.UpdatedAt}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "count", Value: len(c.Slots)}}}, {Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}}})
		if err != nil {
			return unavailable("correcting counter "+c.ID, err)
		}
		if r.MatchedCount == 1 {
			res.Corrected++
		} else {
			res.Skipped++
		}
	case d.Delete:
		r, err := s.counters.DeleteOne(ctx, bson.D{{Key: "_id", Value: c.ID}, {Key: "count", Value: 0}, {Key: "updatedAt", Value: c.UpdatedAt},
			{Key: "lined", Value: bson.D{{Key: "$ne", Value: true}}}})
		if err != nil {
			return unavailable("deleting counter "+c.ID, err)
		}
		if r.DeletedCount == 1 {
			res.Deleted++
		} else {
			res.Skipped++
		}
	}
	return nil
}

// counterUse is what the holders of one counter key show the views: the distinct definitions
// they were admitted under, its live waiters, and the highest cap its borrowers borrowed
// above.
type counterUse struct {
	refs map[lease.DefinitionRef]bool
	// waiting: live waiters in the counter's line.
	waiting int
	// borrowCap: the highest cap the counter's borrowers borrowed above (the views show no
	// more borrowed slots than the count stands above it).
	borrowCap int
	// holders: the public IDs of the holders that book it (not being released).
	holders map[string]bool
}

// uses reads the holders (of f's resource and tenant, or all) in batches and gathers, per
// counter key, what the views show of them. Only a tenant's own holders book its tenant,
// project and user counters, so a read for one tenant's counters reads that tenant's holders
// alone.
func (s *Store) uses(ctx context.Context, f CounterFilter) (map[string]*counterUse, error) {
	filter := bson.D{}
	if f.Resource != "" {
		filter = append(filter, ofResource(f.Resource))
	}
	if f.Tenant != "" {
		filter = append(filter, bson.E{Key: "tenant", Value: f.Tenant})
	}
	projection := bson.D{{Key: "pid", Value: 1}, {Key: "levels", Value: 1}, {Key: "grantKey", Value: 1}, {Key: "state", Value: 1},
		{Key: "waitKey", Value: 1}, {Key: "waitExp", Value: 1}, {Key: "borrowKey", Value: 1}, {Key: "borrowCap", Value: 1},
		{Key: "leaseName", Value: 1}, {Key: "parts", Value: 1}, {Key: "tenant", Value: 1}, {Key: "project", Value: 1}}
	now := time.Now()
	out := map[string]*counterUse{}
	use := func(k string) *counterUse {
		u := out[k]
		if u == nil {
			u = &counterUse{refs: map[lease.DefinitionRef]bool{}, holders: map[string]bool{}}
			out[k] = u
		}
		return u
	}
	err := eachDoc(ctx, s, s.holders, "reading holders", filter, projection, nil,
		func(d holderDoc) error {
			if d.State == stateReleased {
				return nil // being released: its slots are on their way back
			}
			if d.State == string(lease.StateWaiting) && d.WaitKey != "" && d.WaitExp.After(now) {
				use(d.WaitKey).waiting++
			}
			for _, k := range d.booked() {
				u := use(k)
				u.holders[d.PID] = true
				if k == d.BorrowKey {
					u.borrowCap = max(u.borrowCap, d.BorrowCap)
				}
				u.refs[lease.DefinitionRef{Name: d.partOf(k), Tenant: d.Tenant, Project: d.Project}] = true
			}
			return nil
		})
	return out, err
}

// sortedRefs lists the lease references of b in a stable order (none for nil).
func (b *counterUse) sortedRefs() []lease.DefinitionRef {
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

// ListCounters reads the counters matching f with, for each, the holders its entries name
// and which of them are gone (entries the repair removes), so that drift is visible instead
// of hidden.
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
	uses, err := s.uses(ctx, f)
	if err != nil {
		return nil, err
	}
	var ask []string
	for _, d := range docs {
		for _, p := range d.entries() {
			if u := uses[d.ID]; u == nil || !u.holders[p] {
				ask = append(ask, p)
			}
		}
	}
	gone, err := s.goneHolders(ctx, ask)
	if err != nil {
		return nil, err
	}
	out := make([]lease.Counter, len(docs))
	for i, d := range docs {
		u := uses[d.ID]
		entries := d.entries()
		out[i] = lease.Counter{
			Key: d.ID, Resource: d.Resource, Level: lease.Level(d.Level), Scope: d.Scope,
			Count: d.Count, UpdatedAt: d.UpdatedAt, BookedBy: u.sortedRefs(), Holders: entries,
		}
		for _, p := range entries {
			if slices.Contains(gone, p) {
				out[i].Gone = append(out[i].Gone, p)
			}
		}
		out[i].Booked = len(entries) - len(out[i].Gone)
		if u != nil {
			// Marks that outnumber the slots above the cap are stale (docs/borrowing.md,
			// "The mark"): the count shows the slots borrowed.
			out[i].Waiting, out[i].Borrowed = u.waiting, min(d.borrowed(), max(d.Count-u.borrowCap, 0))
		}
	}
	return out, nil
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
