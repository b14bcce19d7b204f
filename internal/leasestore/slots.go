package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Bookings (docs/design.md, "Bookings"). A counter document holds, in slots, one entry per
// booked slot, keyed by the public ID of the holder that books it, and in count the number
// of those entries. Every write that adds an entry adds one to count in the same update, on
// the condition that the entry is absent (and, to book, that count is below the limit);
// every write that removes one subtracts one, on the condition that it is present; a
// hand-over replaces the releaser's entry by the waiter's in one update, count unchanged. So
// count is the number of entries at every moment, and the cap is checked against the
// entries themselves: there is no number kept apart from the holders it counts.
//
// The order of the writes keeps the repair exact:
//   - an entry is written only after its holder's document exists (the holder is written
//     first, and a hand-over only names a waiter whose document it has just read);
//   - a holder's document is deleted only after its entries were removed (released holders
//     keep their document, state RELEASED, until their give-back is done).
//
// So an entry whose holder document is gone is an entry nobody will ever give back: a write
// that arrived after its holder's release (a late duplicate, a write whose answer was lost),
// and the repair (Repair, reconcile) removes it. A holder past its TTL is reaped with its
// handlers, and its entries go with it. Nothing counts holders to correct a number.

// slotDoc is the value of one entry: Borrowed marks a tenant slot taken above the tenant's
// cap (borrow.go).
type slotDoc struct {
	Borrowed bool `bson:"b,omitempty"`
}

// slotField is the path of the entry of the holder with public ID pid.
func slotField(pid string) string { return "slots." + pid }

var (
	entryAbsent  = bson.D{{Key: "$exists", Value: false}}
	entryPresent = bson.D{{Key: "$exists", Value: true}}
)

// bookAttempts bounds how often book retries its conditional update when it missed but the
// counter then showed room (a concurrent release, or the counter's creation, in between).
const bookAttempts = 3

// book adds the entry of pid to the counter of l while it has fewer than limit entries. ok
// is true when the entry is there afterwards: added now, or there already (handed over to
// the holder, or added by an earlier write whose answer was lost). A refusal answers the
// count it saw. A missing counter is created (empty) and the booking tried again.
func (s *Store) book(ctx context.Context, l funnelLevel, resource, tenant, pid string, limit int, slot slotDoc) (ok bool, count int, err error) {
	filter := bson.D{{Key: "_id", Value: l.key}, {Key: "count", Value: bson.D{{Key: "$lt", Value: limit}}}, {Key: slotField(pid), Value: entryAbsent}}
	update := bson.D{
		{Key: "$set", Value: bson.D{{Key: slotField(pid), Value: slot}}},
		{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	}
	for range bookAttempts {
		res, err := s.counters.UpdateOne(ctx, filter, update)
		if err != nil {
			return false, 0, unavailable("booking "+l.key, err)
		}
		if res.MatchedCount == 1 {
			return true, 0, nil
		}
		var c counterDoc
		err = s.counters.FindOne(ctx, bson.D{{Key: "_id", Value: l.key}}).Decode(&c)
		switch {
		case err == nil:
			if _, mine := c.Slots[pid]; mine {
				return true, 0, nil
			}
			if c.Count >= limit {
				return false, c.Count, nil
			}
			continue
		case !errors.Is(err, mongo.ErrNoDocuments):
			return false, 0, unavailable("reading counter "+l.key, err)
		}
		if err := s.createCounter(ctx, l, resource, tenant); err != nil {
			return false, 0, err
		}
	}
	// Room seen but every attempt missed (heavy churn): busy with the last count, so that
	// the caller waits and tries again rather than spinning here.
	c, err := s.count(ctx, l.key)
	return false, c, err
}

// createCounter creates a missing counter, empty, by a pure _id upsert.
func (s *Store) createCounter(ctx context.Context, l funnelLevel, resource, tenant string) error {
	counterTenant := tenant
	if l.Level == lease.LevelGlobal {
		counterTenant = ""
	}
	create := bson.D{
		{Key: "$setOnInsert", Value: bson.D{
			{Key: "resource", Value: resource},
			{Key: "level", Value: string(l.Level)},
			{Key: "scope", Value: l.scope},
			{Key: "tenant", Value: counterTenant},
			{Key: "count", Value: 0},
			{Key: "slots", Value: bson.D{}},
		}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	}
	_, err := s.counters.UpdateOne(ctx, bson.D{{Key: "_id", Value: l.key}}, create, options.UpdateOne().SetUpsert(true))
	if err != nil && !mongo.IsDuplicateKeyError(err) {
		return unavailable("creating counter "+l.key, err)
	}
	return nil
}

// count reads the number of entries of a counter (0 when it does not exist).
func (s *Store) count(ctx context.Context, key string) (int, error) {
	var c counterDoc
	err := s.counters.FindOne(ctx, bson.D{{Key: "_id", Value: key}}, options.FindOne().SetProjection(bson.D{{Key: "count", Value: 1}})).Decode(&c)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, nil
	case err != nil:
		return 0, unavailable("reading counter "+key, err)
	}
	return c.Count, nil
}

// removal is the update that removes the entry of pid: its count goes down with it.
func removal(pid string, more ...bson.E) bson.D {
	u := bson.D{
		{Key: "$unset", Value: bson.D{{Key: slotField(pid), Value: ""}}},
		{Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	}
	return append(u, more...)
}

// unbook removes the entries of pid from the counters keys, in one command; with
// unlinedOnly, only from those without a line (giveBack hands the others over). It returns
// how many it removed.
func (s *Store) unbook(ctx context.Context, keys []string, pid string, unlinedOnly bool) (int, error) {
	if len(keys) == 0 {
		return 0, nil
	}
	filter := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}, {Key: slotField(pid), Value: entryPresent}}
	update := removal(pid)
	if unlinedOnly {
		filter = append(filter, bson.E{Key: "lined", Value: bson.D{{Key: "$ne", Value: true}}})
	} else {
		// Nobody lives in these lines (handOver found nobody): the hint goes.
		update = removal(pid, bson.E{Key: "$set", Value: bson.D{{Key: "lined", Value: false}}})
		update[0].Value = append(update[0].Value.(bson.D), bson.E{Key: "linedPrio", Value: ""})
	}
	res, err := s.counters.UpdateMany(ctx, filter, update)
	if err != nil {
		return 0, unavailable(fmt.Sprintf("giving back %v", keys), err)
	}
	return int(res.ModifiedCount), nil
}

// bookedBy reads which of keys hold an entry of pid, in one round trip.
func (s *Store) bookedBy(ctx context.Context, keys []string, pid string) ([]string, error) {
	if len(keys) == 0 {
		return nil, nil
	}
	cur, err := s.counters.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}, {Key: slotField(pid), Value: entryPresent}},
		options.Find().SetProjection(bson.D{{Key: "_id", Value: 1}}))
	if err != nil {
		return nil, unavailable(fmt.Sprintf("reading %v", keys), err)
	}
	var docs []counterDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable(fmt.Sprintf("reading %v", keys), err)
	}
	out := make([]string, 0, len(docs))
	for _, d := range docs {
		out = append(out, d.ID)
	}
	return out, nil
}

// moveSlot replaces the entry of from by the entry of to at key, in one update, if from has
// one there and to has none; the count stays. slot is the value of to's entry.
func (s *Store) moveSlot(ctx context.Context, key, from, to string, slot slotDoc) (bool, error) {
	res, err := s.counters.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: key}, {Key: slotField(from), Value: entryPresent}, {Key: slotField(to), Value: entryAbsent}},
		bson.D{
			{Key: "$unset", Value: bson.D{{Key: slotField(from), Value: ""}}},
			{Key: "$set", Value: bson.D{{Key: slotField(to), Value: slot}}},
			{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
		})
	if err != nil {
		return false, unavailable("handing over "+key, err)
	}
	return res.MatchedCount == 1, nil
}

// Repair removes, from the counter key, the entries whose holder document is gone (see the
// order of the writes above: such an entry is nobody's), and returns how many it removed.
// It reads the counter, then the holders its entries name: a holder that books an entry
// read first was written before it, so the second read finds every live one. Each removal
// is conditional on the entry, so a repair that races a give-back removes nothing twice.
// Callers rate-limit it per key (a level that refuses; the sweep's reconcile).
func (s *Store) Repair(ctx context.Context, key string) (int, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var c counterDoc
	err := s.counters.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&c)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, nil
	case err != nil:
		return 0, unavailable("reading counter "+key, err)
	}
	gone, err := s.goneHolders(ctx, c.entries())
	if err != nil {
		return 0, err
	}
	return s.removeEntries(ctx, key, gone)
}

// goneHolders returns those of pids that no holder document has.
func (s *Store) goneHolders(ctx context.Context, pids []string) ([]string, error) {
	if len(pids) == 0 {
		return nil, nil
	}
	found := map[string]bool{}
	for batch := range slices.Chunk(pids, readBatch) {
		docs, err := s.findHolders(ctx, bson.D{{Key: "pid", Value: bson.D{{Key: "$in", Value: batch}}}}, bson.D{{Key: "pid", Value: 1}})
		if err != nil {
			return nil, err
		}
		for _, d := range docs {
			found[d.PID] = true
		}
	}
	var gone []string
	for _, p := range pids {
		if !found[p] {
			gone = append(gone, p)
		}
	}
	return gone, nil
}

// removeEntries removes the entries of pids from key, each on the condition that it is there.
func (s *Store) removeEntries(ctx context.Context, key string, pids []string) (int, error) {
	n := 0
	for _, p := range pids {
		res, err := s.counters.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: slotField(p), Value: entryPresent}}, removal(p))
		if err != nil {
			return n, unavailable("repairing counter "+key, err)
		}
		n += int(res.ModifiedCount)
	}
	return n, nil
}

// entries are the public IDs of the holders the counter's entries name, sorted.
func (c counterDoc) entries() []string {
	out := make([]string, 0, len(c.Slots))
	for p := range c.Slots {
		out = append(out, p)
	}
	slices.Sort(out)
	return out
}

// borrowed counts the counter's entries taken above its cap.
func (c counterDoc) borrowed() int {
	n := 0
	for _, s := range c.Slots {
		if s.Borrowed {
			n++
		}
	}
	return n
}
