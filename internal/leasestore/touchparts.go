package leasestore

import (
	"context"
	"errors"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/vancetope/lease-operator/internal/lease"
)

// TouchParts is the check-at-use that answers the holder's fence and, for a holder of several
// resources, its parts, each with its fence, in one round trip: the check of such a holder
// repeats every part's fence (docs/api.md, "Check at every use"). parts is nil for a holder of
// one resource; fence is its fence, or the first part's. It reads the whole document: the
// development server (bin/mongodev) has no projection on findAndModify.
func (s *Store) TouchParts(ctx context.Context, token string) (fence int64, parts []lease.Part, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var d holderDoc
	err = s.holders.FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StateHeld)}},
		bson.D{{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}}}).Decode(&d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, nil, lostError(token)
	case err != nil:
		return 0, nil, unavailable("touching holder", err)
	}
	return d.Fence, d.parts(), nil
}
