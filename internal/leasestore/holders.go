package leasestore

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// maxPayloadEntries bounds a holder's payload.
const maxPayloadEntries = 32

// Touch is the check-at-use: it sets lastSeenAt to the server's now and reports lease.ErrLost
// when the holder is gone. A touch that matches but does not modify (two in the same
// millisecond) still counts as held.
func (s *Store) Touch(ctx context.Context, token string) error {
	_, err := s.TouchFence(ctx, token)
	return err
}

// TouchFence is Touch that also answers the holder's fence (the first part's for a holder of
// several resources), in the same round trip.
func (s *Store) TouchFence(ctx context.Context, token string) (int64, error) {
	fence, _, err := s.TouchParts(ctx, token)
	return fence, err
}

// UpdatePayload replaces the payload of a held lease (values often known only after
// acquire). It also counts as a touch.
func (s *Store) UpdatePayload(ctx context.Context, token string, payload map[string]string) error {
	if len(payload) > maxPayloadEntries {
		return fmt.Errorf("%w: payload has %d entries, at most %d", lease.ErrInvalid, len(payload), maxPayloadEntries)
	}
	if payload == nil {
		payload = map[string]string{}
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	res, err := s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StateHeld)}},
		bson.D{
			{Key: "$set", Value: bson.D{{Key: "payload", Value: payload}}},
			{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}},
		})
	if err != nil {
		return unavailable("updating payload", err)
	}
	if res.MatchedCount == 0 {
		return lostError(token)
	}
	return nil
}

// Release gives a lease back: the holder is released (releaseHolder) and its entries given
// back. Only the one that released the holder gives its entries back, so release is
// idempotent and safe against a concurrent reap; released is false when the holder was
// already gone.
func (s *Store) Release(ctx context.Context, token string) (released bool, err error) {
	_, ok, err := s.releaseHolderWith(ctx, bson.D{{Key: "_id", Value: token}}, nil, token)
	return ok, err
}

// releaseHolder releases one holder matching filter and gives back its entries, in two
// writes on the caller's path when nobody waits: the holder is marked released (a
// findAndModify answering the holder as it was; from then on it answers as gone everywhere),
// and its entries are handed to the next waiters or removed (giveBack). Its document is
// deleted afterwards, off the path (marks.go): a holder's document goes only after its
// entries, so that the repair, which removes entries whose holder is gone, never removes a
// live one (slots.go). A release that stops before the end (a crash) leaves a released holder
// that expires an operation timeout and markMargin after it was written, and the sweep does
// its give-back again (dropReleased).
//
// filter gets "not released" added unless it has a condition on state of its own (which
// must then leave released holders out). ok is false when nothing matched. It runs to its end
// whatever the caller's context (bounded by the operation timeout): a write cut mid-flight may
// still apply, and its slots must come back. gone is called with the holder once it is
// released, before its give-back (the handed-over cache forgets it).
func (s *Store) releaseHolder(ctx context.Context, filter bson.D, gone func(holderDoc)) (h lease.Holder, ok bool, err error) {
	return s.releaseHolderWith(ctx, filter, gone, "")
}

// releaseHolderWith is releaseHolder of the lease token ("" when the filter names no token):
// when this store granted it and a line waits at one of its levels, the hand-over's fence is
// taken beside the mark (prefence.go).
func (s *Store) releaseHolderWith(ctx context.Context, filter bson.D, gone func(holderDoc), token string) (h lease.Holder, ok bool, err error) {
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	var pre *preFence
	if token != "" {
		pre = s.fenceBeside(ctx, token)
		defer pre.wait()
	}
	if !slices.ContainsFunc(filter, func(e bson.E) bool { return e.Key == "state" }) {
		filter = append(slices.Clip(filter), notReleased)
	}
	var doc holderDoc
	err = s.holders.FindOneAndUpdate(ctx, filter, bson.D{
		{Key: "$set", Value: bson.D{{Key: "state", Value: stateReleased}, {Key: "ttlSeconds", Value: (s.cfg.opTimeout + markMargin).Seconds()}}},
		{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}},
	}).Decode(&doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return lease.Holder{}, false, nil
	case err != nil:
		return lease.Holder{}, false, unavailable("releasing holder", err)
	}
	ok = true
	s.takeHanded(lease.HolderID(doc.ID))
	if gone != nil {
		gone(doc)
	}
	if err := s.fault(StepHolderReleased, doc.ID); err != nil {
		return doc.holder(), true, unavailable("releasing holder "+lease.HolderID(doc.ID), err)
	}
	_, err = s.giveBackAll(ctx, doc, pre)
	if err != nil {
		return doc.holder(), true, err
	}
	if !s.dropMark(doc.ID) {
		if err := s.deleteMark(ctx, doc.ID); err != nil {
			return doc.holder(), ok, err
		}
	}
	return doc.holder(), ok, nil
}

// giveBackAll gives back every entry the released holder doc may have: at its levels, a slot
// handed to it, and, unless it was held (then its levels are exactly its entries), every
// other counter of its funnel. A borrowed slot goes last, so that its line's waiter goes on
// to the slots given back first.
// pre, if not nil, is a fence taken beside the mark, for the first hand-over.
func (s *Store) giveBackAll(ctx context.Context, doc holderDoc, pre *preFence) (given int, err error) {
	pid := doc.PID
	if pid == "" {
		pid = lease.HolderID(doc.ID)
	}
	exact := doc.State == string(lease.StateHeld)
	keys := doc.booked()
	if !exact {
		keys = union(union(keys, doc.Keys), nonEmpty(doc.WaitKey))
	}
	borrowed := doc.BorrowKey != "" && slices.Contains(keys, doc.BorrowKey)
	if borrowed {
		keys = slices.DeleteFunc(slices.Clone(keys), func(k string) bool { return k == doc.BorrowKey })
	}
	hold := holdOf(doc)
	hold.pre = pre
	given, _, err = s.giveBackN(ctx, keys, pid, hold, exact)
	if err != nil || !borrowed {
		return given, err
	}
	n, err := s.giveBackBorrowed(ctx, doc.BorrowKey, pid, doc.BorrowCap)
	return given + n, err
}

// markMargin is how long a released holder outlives the operation timeout that bounds its
// give-back before the sweep does the give-back again.
const markMargin = time.Second

// notReleased leaves out the holders being released (releaseHolder).
var notReleased = bson.E{Key: "state", Value: bson.D{{Key: "$ne", Value: stateReleased}}}

// liveLease selects the leases among the holders: neither waiting in a line nor being released.
var liveLease = bson.E{Key: "state", Value: bson.D{{Key: "$nin", Value: bson.A{string(lease.StateWaiting), stateReleased}}}}

// ReapIdle deletes the holders of resource ("" for all) whose lastSeenAt + TTL lies before
// the server's now, giving back their entries, and returns them so that a dispatcher can
// run their handlers; on an error, those released so far (the one whose give-back failed
// included). Each delete is a compare-and-delete on the lastSeenAt it read, so a
// touch in between makes it miss.
func (s *Store) ReapIdle(ctx context.Context, resource string) ([]lease.Holder, error) {
	sw, err := s.SweepIdle(ctx, resource)
	return sw.Reaped, err
}

// IdleSweep is what a sweep of idle holders did and saw.
type IdleSweep struct {
	// Reaped are the holders it deleted.
	Reaped []lease.Holder
	// NextExpiry is how long after the sweep's read the first holder it left in place goes
	// idle (as a touch would leave it); 0 when it left none. A waiter on a full level looks
	// again then at the latest (docs/waiting.md, "The safety look").
	NextExpiry time.Duration
}

// SweepIdle is ReapIdle, also telling when the next of the holders it read goes idle.
func (s *Store) SweepIdle(ctx context.Context, resource string) (IdleSweep, error) {
	now, err := s.ServerTime(ctx)
	if err != nil {
		return IdleSweep{}, err
	}
	// One resource: every holder of it, so that the next expiry is the earliest of all of
	// them. All resources: those last seen before now (in practice all as well); no next
	// expiry is asked of that sweep.
	filter := bson.D{ofResource(resource)}
	if resource == "" {
		filter = bson.D{{Key: "lastSeenAt", Value: bson.D{{Key: "$lt", Value: now}}}}
	}
	// Stream the candidates, keeping only the expired ones: memory grows with what is
	// reaped, not with the holders (docs/operations.md, "Behaviour at scale").
	var expired []idleCandidate
	var next time.Time
	err = eachDoc(ctx, s, s.holders, "reading holders", filter,
		bson.D{
			{Key: "_id", Value: 1}, {Key: "lastSeenAt", Value: 1}, {Key: "ttlSeconds", Value: 1},
			{Key: "state", Value: 1},
		}, nil,
		func(c holderDoc) error {
			switch at := c.idleAt(); {
			case at.Before(now):
				expired = append(expired, candidate(c))
			case next.IsZero() || at.Before(next):
				next = at
			}
			return nil
		})
	sw := IdleSweep{}
	if !next.IsZero() {
		sw.NextExpiry = max(next.Sub(now), time.Millisecond)
	}
	if err != nil {
		return sw, err
	}
	sw.Reaped, err = s.reapExpired(ctx, expired)
	return sw, err
}

// maxPodsPerQuery bounds the pods one HolderPodsOf query names, so that each command stays
// short on the server.
const maxPodsPerQuery = 100

// HolderPodsOf returns the distinct holder pods (with the UIDs their holders recorded) among
// pods, matched by namespace and name (their UIDs are ignored): one query per 100 pods, on
// the namespaces and names as two $in conditions (the pod index serves both; a simple filter
// for a store that evaluates it per document), the pairs checked here. A pod that holds
// nothing costs no more than its share of that query.
func (s *Store) HolderPodsOf(ctx context.Context, pods []lease.PodRef) ([]lease.PodRef, error) {
	seen := map[lease.PodRef]bool{}
	var out []lease.PodRef
	for batch := range slices.Chunk(pods, maxPodsPerQuery) {
		asked := map[[2]string]bool{}
		var namespaces, names bson.A
		for _, p := range batch {
			if !slices.Contains(namespaces, any(p.Namespace)) {
				namespaces = append(namespaces, p.Namespace)
			}
			names = append(names, p.Name)
			asked[[2]string{p.Namespace, p.Name}] = true
		}
		docs, err := s.findHolders(ctx, bson.D{
			{Key: "pod.namespace", Value: bson.D{{Key: "$in", Value: namespaces}}},
			{Key: "pod.name", Value: bson.D{{Key: "$in", Value: names}}},
			notReleased,
		}, bson.D{{Key: "pod", Value: 1}})
		if err != nil {
			return out, err
		}
		for _, d := range docs {
			p := lease.PodRef{Namespace: d.Pod.Namespace, Name: d.Pod.Name, UID: d.Pod.UID}
			if asked[[2]string{p.Namespace, p.Name}] && !seen[p] {
				seen[p] = true
				out = append(out, p)
			}
		}
	}
	return out, nil
}

// ReapPod deletes every holder of exactly that pod (namespace, name and UID) and returns
// them; used when the pod is dead.
func (s *Store) ReapPod(ctx context.Context, pod lease.PodRef) ([]lease.Holder, error) {
	return s.deleteAll(ctx, bson.D{
		{Key: "pod.namespace", Value: pod.Namespace},
		{Key: "pod.name", Value: pod.Name},
		{Key: "pod.uid", Value: pod.UID},
	})
}

// RevokePod deletes every holder of the pod namespace/name, whatever its UID (operator's
// revoke-pod).
func (s *Store) RevokePod(ctx context.Context, namespace, name string) ([]lease.Holder, error) {
	return s.deleteAll(ctx, bson.D{{Key: "pod.namespace", Value: namespace}, {Key: "pod.name", Value: name}})
}

// Revoke deletes one holder by token; with a tenant, only a holder of that tenant (the
// tenant binding is in the delete filter). ok is false when nothing matched.
func (s *Store) Revoke(ctx context.Context, token, tenant string) (lease.Holder, bool, error) {
	filter := bson.D{{Key: "_id", Value: token}, liveLease}
	if tenant != "" {
		filter = append(filter, bson.E{Key: "tenant", Value: tenant})
	}
	return s.releaseHolder(ctx, filter, nil)
}

// RevokeByID is Revoke by the public holder ID (docs/live-api.md, "Holder IDs").
func (s *Store) RevokeByID(ctx context.Context, id, tenant string) (lease.Holder, bool, error) {
	filter := bson.D{{Key: "pid", Value: id}, liveLease}
	if tenant != "" {
		filter = append(filter, bson.E{Key: "tenant", Value: tenant})
	}
	return s.releaseHolder(ctx, filter, nil)
}

// deleteAll deletes, one by one, the holders matching filter, and returns those it deleted,
// also when it stops at an error.
func (s *Store) deleteAll(ctx context.Context, filter bson.D) ([]lease.Holder, error) {
	docs, err := s.findHolders(ctx, filter, bson.D{{Key: "_id", Value: 1}})
	if err != nil {
		return nil, err
	}
	var out []lease.Holder
	for _, d := range docs {
		h, ok, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: d.ID}}, nil)
		// Released is revoked, even when giving its slots back failed (the sweep does it
		// again); a waiter of the pod was no lease.
		if ok && h.State != lease.StateWaiting {
			out = append(out, h)
		}
		if err != nil {
			return out, err
		}
	}
	return out, nil
}

// GetHolder reads one holder; lease.ErrLost when it does not exist.
func (s *Store) GetHolder(ctx context.Context, token string) (lease.Holder, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var doc holderDoc
	err := s.holders.FindOne(ctx, bson.D{{Key: "_id", Value: token}}).Decode(&doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments), err == nil && doc.State == stateReleased:
		return lease.Holder{}, lostError(token)
	case err != nil:
		return lease.Holder{}, unavailable("reading holder", err)
	}
	return doc.holder(), nil
}

// lostError is lease.ErrLost for the holder with token. It names the holder by its public ID:
// the error reaches logs, Events and the answers of the APIs, and the token is a bearer
// secret (docs/security.md, "Tokens").
func lostError(token string) error {
	return fmt.Errorf("holder %s: %w", lease.HolderID(token), lease.ErrLost)
}

// GetHolderByID reads one holder by its public ID; lease.ErrLost when none has it.
func (s *Store) GetHolderByID(ctx context.Context, id string) (lease.Holder, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var doc holderDoc
	err := s.holders.FindOne(ctx, bson.D{{Key: "pid", Value: id}, notReleased}).Decode(&doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return lease.Holder{}, fmt.Errorf("holder %s: %w", id, lease.ErrLost)
	case err != nil:
		return lease.Holder{}, unavailable("reading holder", err)
	}
	return doc.holder(), nil
}

// ListHolders reads the holders matching f, oldest first.
func (s *Store) ListHolders(ctx context.Context, f HolderFilter) ([]lease.Holder, error) {
	docs, err := s.findHolders(ctx, holderFilter(notWaiting, f), nil)
	if err != nil {
		return nil, err
	}
	out := make([]lease.Holder, 0, len(docs))
	for _, d := range docs {
		if d.State != stateReleased {
			out = append(out, d.holder())
		}
	}
	sortHolders(out)
	return out, nil
}

// EachHolder streams every holder (not the waiters, not those being released) to f, in
// batches with a deadline each and in no particular order, so that no command holds the
// store for long: the live API's change feed reads them so. An error from f stops it.
func (s *Store) EachHolder(ctx context.Context, f func(lease.Holder) error) error {
	return eachDoc(ctx, s, s.holders, "reading holders", holderFilter(notWaiting, HolderFilter{}), nil, nil, func(d holderDoc) error {
		if d.State == stateReleased {
			return nil
		}
		return f(d.holder())
	})
}

// ListHoldersPage reads one page of the holders matching f in the order of their public
// IDs, starting after the ID after ("" for the first page), at most limit of them (0: all).
// next is the last ID of the page when more follow, "" otherwise. One round trip: the first batch holds
// the whole page, and one holder more tells whether another page follows.
func (s *Store) ListHoldersPage(ctx context.Context, f HolderFilter, after string, limit int) (holders []lease.Holder, next string, err error) {
	filter := holderFilter(notWaiting, f)
	if after != "" {
		filter = append(filter, bson.E{Key: "pid", Value: bson.D{{Key: "$gt", Value: after}}})
	}
	opts := options.Find().SetSort(bson.D{{Key: "pid", Value: 1}})
	if limit > 0 {
		// A batch one larger than the limit: the server sees the cursor exhausted and closes
		// it, so no getMore or killCursors follows.
		opts.SetLimit(int64(limit) + 1).SetBatchSize(int32(min(limit+2, math.MaxInt32)))
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cur, err := s.holders.Find(ctx, filter, opts)
	if err != nil {
		return nil, "", unavailable("reading holders", err)
	}
	var docs []holderDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, "", unavailable("reading holders", err)
	}
	if limit > 0 && len(docs) > limit {
		docs = docs[:limit]
		next = docs[limit-1].holder().ID
	}
	holders = make([]lease.Holder, 0, len(docs))
	for _, d := range docs {
		if d.State != stateReleased { // being released: gone already (the page may come out short)
			holders = append(holders, d.holder())
		}
	}
	return holders, next, nil
}

// ofResource selects the holders that book resource: those of it, and those of several
// resources with a part of it.
func ofResource(resource string) bson.E {
	return bson.E{Key: "$or", Value: bson.A{bson.D{{Key: "resource", Value: resource}}, bson.D{{Key: "parts.resource", Value: resource}}}}
}

// notWaiting leaves out the holders waiting in a line: they are no leases (wait.go).
var notWaiting = bson.E{Key: "state", Value: bson.D{{Key: "$ne", Value: string(lease.StateWaiting)}}}

// holderFilter is the filter of f's fields after state, the condition on the holder's state
// (notWaiting for the holders; WAITING for the waiters, ListWaiters).
func holderFilter(state bson.E, f HolderFilter) bson.D {
	filter := bson.D{state}
	for _, e := range []struct{ key, value string }{
		{"_id", f.Token}, {"pid", f.ID}, {"tenant", f.Tenant}, {"type", f.Type}, {"project", f.Project}, {"user", f.User},
	} {
		if e.value != "" {
			filter = append(filter, bson.E{Key: e.key, Value: e.value})
		}
	}
	if f.Resource != "" {
		filter = append(filter, ofResource(f.Resource))
	}
	if len(f.ExcludeTenants) > 0 && f.Tenant == "" {
		filter = append(filter, bson.E{Key: "tenant", Value: bson.D{{Key: "$nin", Value: f.ExcludeTenants}}})
	}
	if f.Pod != "" {
		ns, name, _ := cutPod(f.Pod)
		filter = append(filter, bson.E{Key: "pod.namespace", Value: ns}, bson.E{Key: "pod.name", Value: name})
	}
	return filter
}

func (s *Store) findHolders(ctx context.Context, filter, projection bson.D) ([]holderDoc, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	opts := options.Find()
	if projection != nil {
		opts.SetProjection(projection)
	}
	cur, err := s.holders.Find(ctx, filter, opts)
	if err != nil {
		return nil, unavailable("reading holders", err)
	}
	var docs []holderDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("reading holders", err)
	}
	return docs, nil
}
