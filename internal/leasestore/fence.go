package leasestore

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Fences (docs/fencing.md). Every grant gets a number that strictly increases for its
// resource: the resource remembers the highest it has seen and refuses work that carries a
// lower one, so a holder that was reaped and replaced while it paused cannot write next to
// its successor.
//
// The numbers come from one document per resource in FencesCollection, taken by an atomic
// $inc. Nothing deletes those documents (reconcile deletes unused counters, never
// fences), so a number is never given twice, whichever process, manager replica or restart.
//
// The order: a fence is taken while every slot the grant consists of is held, and the write
// that grants records it. For an acquisition that books its last level itself, that is after
// its last booking and before the write that makes it HELD; for a hand-over, the releaser
// takes it while its entry still holds the slot, before it names the waiter (with the fence)
// and moves the entry.
// So for any level with a cap of one, holders follow each other and so do their fences: the
// next holder's fence is taken after the previous one's grant, because the slot was the
// previous holder's until then.

// fenceDoc is the fence document of one resource. Holds keeps the resource's recent hold
// times (holdSlots of them, in milliseconds): the views estimate waits from them.
type fenceDoc struct {
	Resource string           `bson:"_id"`
	Fence    int64            `bson:"fence"`
	Holds    map[string]int64 `bson:"holds,omitempty"`
}

// holdSlots is how many recent hold times a resource keeps.
const holdSlots = 8

// holdSample is a finished hold: how long a holder held, which the hand-over its release
// makes records in the fence document (the write the hand-over makes anyway). Slot is the
// holder's fence modulo holdSlots, so that consecutive holders fill different slots. The
// zero value records nothing.
type holdSample struct {
	ms   int64
	slot int64
	// pre is a fence taken beside the release's mark, with the hold recorded (prefence.go):
	// the first hand-over uses it instead of taking one.
	pre *preFence
}

// holdOf is the hold sample of a holder being released: none for one that held nothing
// (a waiter leaving its line).
func holdOf(d holderDoc) holdSample {
	if d.State != string(lease.StateHeld) || d.AcquiredAt.IsZero() {
		return holdSample{}
	}
	return holdSample{ms: max(time.Since(d.AcquiredAt).Milliseconds(), 1), slot: d.Fence % holdSlots}
}

// fencesFor returns the first of the fences a hand-over of n slots of resource starts with
// and how many it has: the one taken beside the mark if there is one, else n taken now.
func (s *Store) fencesFor(ctx context.Context, resource string, n int, hold holdSample) (first int64, got int, err error) {
	if f, ok := hold.pre.take(resource); ok {
		return f, 1, nil
	}
	if hold.pre != nil && hold.pre.resource == resource {
		hold = holdSample{} // recorded beside the mark (or lost with its write: a sample, no more)
	}
	f, err := s.takeFences(ctx, resource, n, hold)
	return f, n, err
}

// takeFences reserves n consecutive fences of resource in one round trip and returns the
// first, recording hold in the same write. Numbers reserved and never recorded (a crash, a
// hand-over that found nobody) are gaps, which the order allows.
func (s *Store) takeFences(ctx context.Context, resource string, n int, hold holdSample) (int64, error) {
	update := bson.D{{Key: "$inc", Value: bson.D{{Key: "fence", Value: int64(n)}}}}
	if hold.ms > 0 {
		update = append(update, bson.E{Key: "$set", Value: bson.D{{Key: "holds.h" + strconv.FormatInt(hold.slot, 10), Value: hold.ms}}})
	}
	var d fenceDoc
	err := s.fences.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: resource}}, update,
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&d)
	if err != nil {
		return 0, unavailable("taking a fence of "+resource, err)
	}
	s.holds.keep(resource, d.Holds, time.Now())
	return d.Fence - int64(n) + 1, nil
}

// HoldTimes returns the recent hold times of resource (at most holdSlots, unordered; none
// before its first hand-over): what this store learnt from its own hand-overs or read in
// the last holdsFresh, else read from the store.
func (s *Store) HoldTimes(ctx context.Context, resource string) ([]time.Duration, error) {
	if hs, ok := s.holds.get(resource, time.Now()); ok {
		return hs, nil
	}
	m, err := s.readHolds(ctx, []string{resource})
	if err != nil {
		return nil, err
	}
	return m[resource], nil
}

// readHolds reads the hold times of resources in one round trip and keeps them.
func (s *Store) readHolds(ctx context.Context, resources []string) (map[string][]time.Duration, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cur, err := s.fences.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: resources}}}})
	if err != nil {
		return nil, unavailable("reading hold times", err)
	}
	var docs []fenceDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("reading hold times", err)
	}
	now := time.Now()
	out := make(map[string][]time.Duration, len(resources))
	for _, r := range resources {
		s.holds.keep(r, nil, now) // none yet, until a document says otherwise
	}
	for _, d := range docs {
		s.holds.keep(d.Resource, d.Holds, now)
		out[d.Resource], _ = s.holds.get(d.Resource, now)
	}
	return out, nil
}

// holdsFresh is how long a store answers hold times from what it last learnt.
const holdsFresh = 2 * time.Second

// holdCache keeps the hold times each resource had when this store last wrote or read them.
type holdCache struct {
	mu sync.Mutex
	m  map[string]heldTimes
}

type heldTimes struct {
	at    time.Time
	holds []time.Duration
}

func (c *holdCache) keep(resource string, ms map[string]int64, now time.Time) {
	hs := make([]time.Duration, 0, len(ms))
	for _, v := range ms {
		hs = append(hs, time.Duration(v)*time.Millisecond)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil || len(c.m) >= maxLined {
		c.m = map[string]heldTimes{}
	}
	c.m[resource] = heldTimes{at: now, holds: hs}
}

func (c *holdCache) get(resource string, now time.Time) ([]time.Duration, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	e, ok := c.m[resource]
	if !ok || now.Sub(e.at) > holdsFresh {
		return nil, false
	}
	return e.holds, true
}

// byResource groups counter keys (lease.CounterKey) by their resource: the keys one holder
// gives back are of one resource.
func byResource(keys []string) map[string][]string {
	out := map[string][]string{}
	for _, k := range keys {
		r, _, _ := strings.Cut(k, "|")
		out[r] = append(out[r], k)
	}
	return out
}
