package leasestore

import (
	"context"
	"strings"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Fences (docs/fencing.md). Every grant gets a number that strictly increases for its
// resource: the resource remembers the highest it has seen and refuses work that carries a
// lower one, so a holder that was reaped and replaced while it paused cannot write next to
// its successor.
//
// The numbers come from one document per resource in FencesCollection, taken by an atomic
// $inc. Nothing deletes those documents (reconcile deletes and recreates counters, never
// fences), so a number is never given twice, whichever process, manager replica or restart.
//
// The order: a fence is taken while every slot the grant consists of is held, and the write
// that grants records it. For an acquisition that books its last level itself, that is after
// its last increment and before the write that makes it HELD; for a hand-over, the releaser
// takes it while its release mark still holds the slot, before the write that hands it over.
// So for any level with a cap of one, holders follow each other and so do their fences: the
// next holder's fence is taken after the previous one's grant, because the slot was the
// previous holder's until then.

// fenceDoc is the fence document of one resource.
type fenceDoc struct {
	Resource string `bson:"_id"`
	Fence    int64  `bson:"fence"`
}

// takeFences reserves n consecutive fences of resource in one round trip and returns the
// first. Numbers reserved and never recorded (a crash, a hand-over that found nobody) are
// gaps, which the order allows.
func (s *Store) takeFences(ctx context.Context, resource string, n int) (int64, error) {
	var d fenceDoc
	err := s.fences.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: resource}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "fence", Value: int64(n)}}}},
		options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&d)
	if err != nil {
		return 0, unavailable("taking a fence of "+resource, err)
	}
	return d.Fence - int64(n) + 1, nil
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
