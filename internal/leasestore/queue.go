package leasestore

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The cross-process queue of a full level (docs/waiting.md): a waiter that finds a level full
// reserves a place, ordered by the server's time; it takes a freed slot only when fewer live
// reservations are ahead of it than there is room (Turn). While a counter has reservations
// (its queued field is positive), an acquisition without one does not take a slot there even
// if there is room: a process that just released cannot re-take its own slot ahead of older
// waiters elsewhere. A reservation is never counted as a holder. It expires unless renewed;
// Turn removes expired ones, and DropReservations removes those of a pod that is gone.

// QueueCollection holds the reservations of waiting acquisitions.
const QueueCollection = "resource_lease_queue"

// Reservation is a waiter's place in the queue of one counter.
type Reservation struct {
	ID  string
	Key string
	// At is the server's time of the reservation: the queue's order (ties by ID).
	At time.Time
	// Pod is the waiting pod.
	Pod lease.PodRef
	// ExpiresAt is when it lapses unless renewed (the waiting process's clock).
	ExpiresAt time.Time
}

type reservationDoc struct {
	ID        string    `bson:"_id"`
	Key       string    `bson:"key"`
	Origin    string    `bson:"origin"`
	Pod       podDoc    `bson:"pod"`
	At        time.Time `bson:"at"`
	ExpiresAt time.Time `bson:"expiresAt"`
}

func (d reservationDoc) reservation() Reservation {
	return Reservation{ID: d.ID, Key: d.Key, At: d.At, ExpiresAt: d.ExpiresAt,
		Pod: lease.PodRef{Namespace: d.Pod.Namespace, Name: d.Pod.Name, UID: d.Pod.UID}}
}

// Reserve queues a waiter on counter key until expires (unless renewed): one reservation
// insert (its time is the server's) and one increment of the counter's queued field.
func (s *Store) Reserve(ctx context.Context, key string, pod lease.PodRef, expires time.Time) (Reservation, error) {
	id, err := newToken()
	if err != nil {
		return Reservation{}, err
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var doc reservationDoc
	err = s.queue.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: id}}, bson.D{
		{Key: "$setOnInsert", Value: bson.D{
			{Key: "key", Value: key}, {Key: "origin", Value: s.origin}, {Key: "expiresAt", Value: expires},
			{Key: "pod", Value: podDoc{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID}},
		}},
		{Key: "$currentDate", Value: bson.D{{Key: "at", Value: true}}},
	}, options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&doc)
	if err != nil {
		return Reservation{}, unavailable("reserving a place on "+key, err)
	}
	if _, err := s.counters.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "queued", Value: 1}}}}); err != nil {
		return Reservation{}, errors.Join(unavailable("reserving a place on "+key, err), s.Leave(ctx, doc.reservation()))
	}
	return doc.reservation(), nil
}

// Renew extends every reservation this store made on key until expires (one write for all
// the waiters of this process there).
func (s *Store) Renew(ctx context.Context, key string, expires time.Time) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	_, err := s.queue.UpdateMany(ctx, bson.D{{Key: "key", Value: key}, {Key: "origin", Value: s.origin}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "expiresAt", Value: expires}}}})
	if err != nil {
		return unavailable("renewing reservations on "+key, err)
	}
	return nil
}

// Leave removes a reservation (the waiter got its slot, gave up or failed) and, if this
// call removed it, lowers the counter's queued field. It runs whatever the caller's context.
func (s *Store) Leave(ctx context.Context, r Reservation) error {
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	return s.dropReservations(ctx, r.Key, bson.D{{Key: "_id", Value: r.ID}})
}

// dropReservations deletes the reservations on key matching filter and lowers queued by as
// many as this call deleted.
func (s *Store) dropReservations(ctx context.Context, key string, filter bson.D) error {
	res, err := s.queue.DeleteMany(ctx, append(bson.D{{Key: "key", Value: key}}, filter...))
	if err != nil {
		return unavailable("leaving the queue of "+key, err)
	}
	if res.DeletedCount == 0 {
		return nil
	}
	_, err = s.counters.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "queued", Value: bson.D{{Key: "$gte", Value: res.DeletedCount}}}},
		bson.D{{Key: "$inc", Value: bson.D{{Key: "queued", Value: -res.DeletedCount}}}})
	if err != nil {
		return unavailable("leaving the queue of "+key, err)
	}
	return nil
}

// turnWindow is how many reservations ahead Turn reads beyond the room it needs to compare.
const turnWindow = 8

// Turn reports whether r may take a slot of its counter (capped at cap) now: fewer live
// reservations are ahead of it than the counter has room; and whether a live reservation
// ahead of it was made by this store (process). Two reads; reservations ahead that have
// expired (now: the caller's clock) are removed on the way.
func (s *Store) Turn(ctx context.Context, r Reservation, cap int, now time.Time) (mine, localAhead bool, err error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	count, err := s.count(ctx, r.Key)
	if err != nil {
		return false, false, err
	}
	room := cap - count
	if room <= 0 {
		return false, false, nil
	}
	ahead := bson.D{{Key: "key", Value: r.Key}, {Key: "$or", Value: bson.A{
		bson.D{{Key: "at", Value: bson.D{{Key: "$lt", Value: r.At}}}},
		bson.D{{Key: "at", Value: r.At}, {Key: "_id", Value: bson.D{{Key: "$lt", Value: r.ID}}}},
	}}}
	cur, err := s.queue.Find(ctx, ahead, options.Find().
		SetSort(bson.D{{Key: "at", Value: 1}, {Key: "_id", Value: 1}}).SetLimit(int64(room+turnWindow)))
	if err != nil {
		return false, false, unavailable("reading the queue of "+r.Key, err)
	}
	var docs []reservationDoc
	if err := cur.All(ctx, &docs); err != nil {
		return false, false, unavailable("reading the queue of "+r.Key, err)
	}
	live, expired := 0, bson.A{}
	for _, d := range docs {
		if d.ExpiresAt.After(now) {
			live++
			localAhead = localAhead || d.Origin == s.origin
		} else {
			expired = append(expired, d.ID)
		}
	}
	if len(expired) > 0 {
		err := s.dropReservations(ctx, r.Key, bson.D{
			{Key: "_id", Value: bson.D{{Key: "$in", Value: expired}}},
			{Key: "expiresAt", Value: bson.D{{Key: "$lte", Value: now}}},
		})
		if err != nil {
			return false, false, err
		}
	}
	return live < room, localAhead, nil
}

// ListReservations reads the reservations on key ("" for all), in queue order.
func (s *Store) ListReservations(ctx context.Context, key string) ([]Reservation, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	filter := bson.D{}
	if key != "" {
		filter = bson.D{{Key: "key", Value: key}}
	}
	cur, err := s.queue.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "at", Value: 1}, {Key: "_id", Value: 1}}))
	if err != nil {
		return nil, unavailable("reading the queue", err)
	}
	var docs []reservationDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("reading the queue", err)
	}
	out := make([]Reservation, len(docs))
	for i, d := range docs {
		out[i] = d.reservation()
	}
	return out, nil
}

// DropReservations removes every reservation of a pod that is gone (exactly that pod:
// namespace, name and UID) at once, and returns how many it removed.
func (s *Store) DropReservations(ctx context.Context, pod lease.PodRef) (int, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	filter := bson.D{
		{Key: "pod.namespace", Value: pod.Namespace}, {Key: "pod.name", Value: pod.Name}, {Key: "pod.uid", Value: pod.UID},
	}
	cur, err := s.queue.Find(ctx, filter, options.Find().SetProjection(bson.D{{Key: "key", Value: 1}}))
	if err != nil {
		return 0, unavailable("reading the queue", err)
	}
	var docs []reservationDoc
	if err := cur.All(ctx, &docs); err != nil {
		return 0, unavailable("reading the queue", err)
	}
	for _, d := range docs {
		if err := s.dropReservations(ctx, d.Key, bson.D{{Key: "_id", Value: d.ID}}); err != nil {
			return 0, fmt.Errorf("dropping the reservations of %s: %w", pod, err)
		}
	}
	return len(docs), nil
}

// ensureQueueIndexes creates the indexes of the queue (Turn's order, DropReservations).
func (s *Store) ensureQueueIndexes(ctx context.Context) error {
	_, err := s.queue.Indexes().CreateMany(ctx, []mongo.IndexModel{
		{Keys: bson.D{{Key: "key", Value: 1}, {Key: "at", Value: 1}, {Key: "_id", Value: 1}}},
		{Keys: bson.D{{Key: "pod.uid", Value: 1}}},
	})
	if err != nil {
		return unavailable("creating queue indexes", err)
	}
	return nil
}
