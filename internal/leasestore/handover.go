package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Giving slots back (docs/waiting.md, "Hand-over"). A holder's entry at a level where a live
// waiter lines up is handed to the first of them: the waiter's document is named first (its
// state becomes the one it asked for, grantFrom the releaser), then the entry moves from the
// releaser to the waiter in one update of the counter, conditional on the releaser's entry
// being there and the waiter's not, and only then is the waiter woken. The slot is the
// waiter's from the move on: a waiter answers held only once it has seen its entry (the
// wake-up says the move happened; a read of a named holder checks the counter). An entry at a
// level nobody lines up at is removed.
//
// A counter with waiters carries the flag lined (set by every waiter when it tries the
// level, cleared by a give-back that finds no live waiter). The flag is only a hint of where
// to look first: a key this store saw lined in the last second is handed over first (one
// round trip when a waiter takes it); from the other keys the entries are removed at once, on
// the condition that the counter is not lined, so that a release where nobody waits costs one
// write; an entry that condition kept is handed over after all. A wrong hint costs a round
// trip, never a slot: a flag cleared while a waiter had just set it is set again at that
// waiter's next look, and until then the slot is free at the counter, where that look takes it.

// giveBack gives back the entries of pid at keys: handed over where a live waiter lines up,
// removed elsewhere. exact says that pid has an entry at every key (a held holder's levels);
// otherwise the keys are those it may have one at, and a read first finds which it has one
// at. pid is a released holder's (or one that never was a holder).
func (s *Store) giveBack(ctx context.Context, keys []string, pid string, hold holdSample, exact bool) error {
	_, _, err := s.giveBackN(ctx, keys, pid, hold, exact)
	return err
}

func (s *Store) giveBackN(ctx context.Context, keys []string, pid string, hold holdSample, exact bool) (given, handed int, err error) {
	if len(keys) == 0 {
		return 0, 0, nil
	}
	if !exact {
		// Which of the keys it has an entry at: one read, and nothing more to do when it has
		// none (a waiter leaving a line it was never handed a slot of, the usual case). From
		// here on the holder is released, so no hand-over names it and it gains no entry
		// (a write of its own delivered late is the repair's, as after any release).
		has, err := s.bookedBy(ctx, keys, pid)
		if err != nil || len(has) == 0 {
			return 0, 0, err
		}
		keys, exact = has, true
	}
	var hot, cold []string
	for _, k := range keys {
		if exact && s.linedRecently(k) {
			hot = append(hot, k)
		} else {
			cold = append(cold, k)
		}
	}
	var left []string
	if len(hot) > 0 {
		rest, err := s.handOver(ctx, hot, pid, hold)
		if err != nil {
			return given, handed, err
		}
		handed += len(hot) - len(rest)
		left = rest
	}
	if len(cold) > 0 {
		n, err := s.unbook(ctx, cold, pid, true)
		if err != nil {
			return given, handed, err
		}
		given += n
		if err := s.fault(StepGivenBack, cold[0]); err != nil {
			return given, handed, unavailable(fmt.Sprintf("giving back %v", cold), err)
		}
		if !exact || n < len(cold) {
			// The entries the removal kept are at lined counters: when it kept all of a held
			// holder's (one level, or a line at every one), they are known without a read.
			kept := cold
			if !exact || n > 0 {
				if kept, err = s.bookedBy(ctx, cold, pid); err != nil {
					return given, handed, err
				}
			}
			for _, k := range kept {
				s.sawLined(k)
			}
			rest, err := s.handOver(ctx, kept, pid, hold)
			if err != nil {
				return given, handed, err
			}
			handed += len(kept) - len(rest)
			left = append(left, rest...)
		}
	}
	// Nobody lives in these lines: the entries go, and so does the hint.
	n, err := s.unbook(ctx, left, pid, false)
	given += n + handed
	if err != nil {
		return given, handed, err
	}
	if len(left) > 0 {
		if err := s.fault(StepGivenBack, left[0]); err != nil {
			return given, handed, unavailable(fmt.Sprintf("giving back %v", left), err)
		}
	}
	return given, handed, nil
}

// handOver hands the entry of from at each key to the key's first live waiter and returns
// the keys that had none: per key, one round trip that names the waiter and one that moves
// the entry, after one that takes the fences of the grants (fence.go).
func (s *Store) handOver(ctx context.Context, keys []string, from string, hold holdSample) ([]string, error) {
	var rest []string
	for resource, keys := range byResource(keys) {
		r, err := s.handOverOf(ctx, resource, keys, from, hold, nil)
		if err != nil {
			return nil, err
		}
		rest = append(rest, r...)
	}
	return rest, nil
}

// handOverOf is handOver of keys of one resource. mark is set on the waiter named (a
// borrowed slot's borrowKey and borrowCap, borrow.go), and its entry is then marked borrowed;
// more narrows the waiters it may name (passUp: those of a higher priority).
func (s *Store) handOverOf(ctx context.Context, resource string, keys []string, from string, hold holdSample, mark bson.D, more ...bson.E) ([]string, error) {
	rest := slices.Clone(keys)
	var grants []Grant
	var origins []string
	defer func() { s.granted(grants, origins) }()
	// The fences are taken while the releaser still has the slots; a hand-over that
	// completes a waiter's acquisition records the next one, another leaves a gap.
	fence, spare, err := s.fencesFor(ctx, resource, len(rest), hold)
	if err != nil {
		return nil, err // the entries stay the releaser's: its release is done again (sweep)
	}
	slot := slotDoc{Borrowed: len(mark) > 0}
	for len(rest) > 0 {
		if spare == 0 {
			if fence, err = s.takeFences(ctx, resource, 1, holdSample{}); err != nil {
				return nil, err
			}
			spare = 1
		}
		d, err := s.name(ctx, rest, from, fence, mark, more...)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			s.forgetHandOvers(rest) // nobody lives in these lines any more
			return rest, nil
		case err != nil:
			return nil, err
		}
		fence, spare = fence+1, spare-1
		if err := s.fault(StepPicked, d.GrantKey); err != nil {
			return nil, unavailable("handing over "+d.GrantKey, err)
		}
		moved, err := s.moveSlot(ctx, d.GrantKey, from, d.PID, slot)
		if err != nil {
			return nil, err // ambiguous: the waiter reads its entry (verifyGrant)
		}
		if !moved {
			// The releaser's entry is gone (given back by another), or the waiter booked the
			// level itself meanwhile (its document as named is then right). The waiter, if
			// it has no entry, goes back to its place by itself (verifyGrant).
			mine, err := s.bookedBy(ctx, []string{d.GrantKey}, from)
			if err != nil {
				return nil, err
			}
			if len(mine) == 0 {
				rest = slices.DeleteFunc(rest, func(k string) bool { return k == d.GrantKey })
			}
			continue
		}
		held := d.State == string(lease.StateHeld)
		if held && d.Origin == s.origin {
			s.keepHanded(d)
		}
		g := Grant{ID: d.PID, Key: d.GrantKey, Held: held, To: d.Origin}
		if held {
			g.Fence = d.Fence
		}
		grants = append(grants, g)
		origins = append(origins, d.Origin)
		s.sawLined(d.GrantKey)
		s.sawHandOver(d.GrantKey)
		rest = slices.DeleteFunc(rest, func(k string) bool { return k == d.GrantKey })
		if err := s.fault(StepHandedOver, d.GrantKey); err != nil {
			return nil, unavailable("handing over "+d.GrantKey, err)
		}
	}
	return nil, nil
}

// name names the first live waiter of the lines of keys as the one a slot of from is handed
// to: its state becomes the one it asked for when it queued (HELD at its last level), with
// the fence of the grant, grantKey the level, grantFrom the releaser and grantAt the server's
// time. lastSeenAt stays: a waiter whose process died is reaped a TTL after its last sign of
// life, whatever it was handed since.
func (s *Store) name(ctx context.Context, keys []string, from string, fence int64, mark bson.D, more ...bson.E) (holderDoc, error) {
	var d holderDoc
	err := s.holders.FindOneAndUpdate(ctx,
		append(bson.D{
			{Key: "state", Value: string(lease.StateWaiting)},
			{Key: "waitKey", Value: bson.D{{Key: "$in", Value: keys}}},
			{Key: "waitExp", Value: bson.D{{Key: "$gt", Value: time.Now()}}},
			{Key: "grantState", Value: bson.D{{Key: "$exists", Value: true}}},
		}, more...),
		bson.D{
			{Key: "$rename", Value: bson.D{{Key: "waitKey", Value: "grantKey"}, {Key: "grantState", Value: "state"}}},
			{Key: "$set", Value: append(bson.D{{Key: "fence", Value: fence}, {Key: "grantFrom", Value: from}}, mark...)},
			{Key: "$unset", Value: bson.D{{Key: "waitExp", Value: ""}, {Key: "waitCap", Value: ""}}},
			{Key: "$currentDate", Value: bson.D{{Key: "grantAt", Value: true}}},
		},
		options.FindOneAndUpdate().SetSort(lineOrder).SetReturnDocument(options.After)).Decode(&d)
	if err != nil && !errors.Is(err, mongo.ErrNoDocuments) {
		return d, unavailable(fmt.Sprintf("handing over %v", keys), err)
	}
	return d, err
}

// finishHandOvers completes the hand-overs of from that named a waiter but did not move the
// entry (a releaser that stopped between the two writes): the entry moves to the waiter
// named, which waits for it. Used when a release is done again (an expired release).
func (s *Store) finishHandOvers(ctx context.Context, from string) error {
	docs, err := s.findHolders(ctx, bson.D{{Key: "grantFrom", Value: from}},
		bson.D{{Key: "pid", Value: 1}, {Key: "grantKey", Value: 1}, {Key: "borrowKey", Value: 1}})
	if err != nil {
		return err
	}
	for _, d := range docs {
		if _, err := s.moveSlot(ctx, d.GrantKey, from, d.PID, slotDoc{Borrowed: d.BorrowKey == d.GrantKey}); err != nil {
			return err
		}
	}
	return nil
}

// lineOrder is the order of a line: highest priority first (a missing priority sorts after
// every number, and is 0), then oldest place, then _id. With no priority written it is the
// order of before priorities: queuedAt, _id.
var lineOrder = bson.D{{Key: "priority", Value: -1}, {Key: "queuedAt", Value: 1}, {Key: "_id", Value: 1}}

// linedHint is how long this store hands a key over first after it saw the key lined.
const linedHint = time.Second

// handedHint is how long after this store handed a slot of a key over a newcomer joins the
// key's line without trying the level (queue). A hand-over of the key that finds nobody in
// line forgets it.
const handedHint = 250 * time.Millisecond

func (s *Store) sawLined(key string)            { s.lined.saw(key) }
func (s *Store) linedRecently(key string) bool  { return s.lined.within(key, linedHint) }
func (s *Store) sawHandOver(key string)         { s.handedAt.saw(key) }
func (s *Store) forgetHandOvers(keys []string)  { s.handedAt.forget(keys) }
func (s *Store) handedRecently(key string) bool { return s.handedAt.within(key, handedHint) }

// recentKeys remembers when this store last saw something of a counter key: a hint of where
// to look first, never a condition of a write. It keeps at most maxLined keys and starts over
// when full.
type recentKeys struct {
	mu sync.Mutex
	at map[string]time.Time
}

func (r *recentKeys) saw(key string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.at == nil || len(r.at) >= maxLined {
		r.at = map[string]time.Time{}
	}
	r.at[key] = time.Now()
}

func (r *recentKeys) within(key string, d time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	at, ok := r.at[key]
	return ok && time.Since(at) < d
}

func (r *recentKeys) forget(keys []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, k := range keys {
		delete(r.at, k)
	}
}
