package leasestore

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
)

// Test hooks for the external tests of the package.

// BookPartsInRequestOrder makes acquisitions of several resources book their parts in the
// order requested instead of the order of their resources, until the returned func is called.
func BookPartsInRequestOrder() (restore func()) {
	inRequestOrder = true
	return func() { inRequestOrder = false }
}

// Bounds of the events collection.
const (
	EventsBytes    = eventsBytes
	EventMaxGrants = eventMaxGrants
	EventsRetry    = eventsRetry
)

// SetBackoff shortens the notifier's pause between two rounds (before Run).
func (n *Notifier) SetBackoff(d time.Duration) { n.backoff = d }

// Origin names the store in the events it publishes.
func (s *Store) Origin() string { return s.origin }

// Publish tells the store of grants it made to waiters of the stores origins names, as its
// hand-overs do.
func (s *Store) Publish(grants []Grant, origins []string) { s.granted(grants, origins) }

// EventSizes lists the BSON sizes of the events the store published.
func (s *Store) EventSizes(ctx context.Context) ([]int, error) {
	cur, err := s.events.Find(ctx, bson.D{{Key: "origin", Value: s.origin}})
	if err != nil {
		return nil, err
	}
	var sizes []int
	for cur.Next(ctx) {
		sizes = append(sizes, len(cur.Current))
	}
	return sizes, cur.Err()
}

// EventSize is the BSON size of an event of grants.
func EventSize(grants []Grant) (int, error) {
	raw, err := bson.Marshal(eventDoc{ID: bson.NewObjectID(), Origin: newOrigin(), Grants: grants})
	return len(raw), err
}

// DeleteMark deletes the release mark of token on the caller's path, as a release does when
// the mark cannot wait for the background delete.
func (s *Store) DeleteMark(ctx context.Context, token string) error { return s.deleteMark(ctx, token) }
