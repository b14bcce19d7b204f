package leasestore

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/vancetope/lease-operator/internal/lease"
)

// The views of the lines: who waits where, at which place, and for about how long
// (docs/waiting.md, "Who waits").

// placeProjection is what a place in a line needs: the waiter, its key, its priority, its
// place and whether it is live.
var placeProjection = bson.D{{Key: "_id", Value: 1}, {Key: "waitKey", Value: 1}, {Key: "priority", Value: 1}, {Key: "queuedAt", Value: 1}, {Key: "waitExp", Value: 1}}

// ListWaiters reads the acquisitions waiting in a line that match f (Token, ID, Tenant,
// ExcludeTenants, Resource, Project, User, Pod), highest priority first, oldest first within
// a priority, each with its position
// among the live waiters of its line (waiters of every tenant count, none is named) and
// the estimate of its wait. At most three round trips: the waiters, the lines they are in
// when f leaves other waiters out, and the hold times of their resources.
func (s *Store) ListWaiters(ctx context.Context, f HolderFilter) ([]lease.Waiter, error) {
	filter := append(holderFilter(bson.E{Key: "state", Value: string(lease.StateWaiting)}, f),
		bson.E{Key: "waitKey", Value: bson.D{{Key: "$exists", Value: true}}})
	docs, err := s.findHolders(ctx, filter, nil)
	if err != nil {
		return nil, err
	}
	if len(docs) == 0 {
		return []lease.Waiter{}, nil
	}
	lines := docs
	if len(filter) > 2 { // a narrower read than every line: read the lines themselves
		var keys []string
		for _, d := range docs {
			if !slices.Contains(keys, d.WaitKey) {
				keys = append(keys, d.WaitKey)
			}
		}
		if lines, err = s.findHolders(ctx, bson.D{
			{Key: "state", Value: string(lease.StateWaiting)},
			{Key: "waitKey", Value: bson.D{{Key: "$in", Value: keys}}},
		}, placeProjection); err != nil {
			return nil, err
		}
	}
	now := time.Now()
	ahead := positions(lines, now)
	var resources []string
	for _, d := range docs {
		if r := d.waitResource(); !slices.Contains(resources, r) {
			resources = append(resources, r)
		}
	}
	holds, err := s.readHolds(ctx, resources)
	if err != nil {
		return nil, err
	}
	out := make([]lease.Waiter, 0, len(docs))
	for _, d := range docs {
		w := waiterOf(d, now)
		w.Position = ahead[d.ID]
		w.EstimatedWait = lease.EstimateWait(w.Position, w.Cap, holds[w.Resource])
		out = append(out, w)
	}
	slices.SortStableFunc(out, func(a, b lease.Waiter) int {
		if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
			return c
		}
		if c := a.Since.Compare(b.Since); c != 0 {
			return c
		}
		return strings.Compare(a.Holder.ID, b.Holder.ID)
	})
	return out, nil
}

// Ahead is the number of live waiters in the line of key ahead of the waiting holder token;
// every live waiter of the line when token is not in it (an acquisition refused without
// waiting). One round trip.
func (s *Store) Ahead(ctx context.Context, key, token string) (int, error) {
	docs, err := s.findHolders(ctx, bson.D{
		{Key: "state", Value: string(lease.StateWaiting)},
		{Key: "waitKey", Value: key},
	}, placeProjection)
	if err != nil {
		return 0, err
	}
	now := time.Now()
	if n, ok := positions(docs, now)[token]; ok {
		return n, nil
	}
	live := 0
	for _, d := range docs {
		if d.WaitExp.After(now) {
			live++
		}
	}
	return live, nil
}

// positions returns, for each waiter of lines, the number of live waiters ahead of it in
// its line: the order is the hand-overs' (lineOrder: priority descending, queuedAt, _id), so
// the waiters of a higher priority count first.
func positions(lines []holderDoc, now time.Time) map[string]int {
	sorted := slices.Clone(lines)
	slices.SortStableFunc(sorted, func(a, b holderDoc) int {
		if c := cmp.Compare(b.Priority, a.Priority); c != 0 {
			return c
		}
		if c := a.QueuedAt.Compare(b.QueuedAt); c != 0 {
			return c
		}
		return strings.Compare(a.ID, b.ID)
	})
	live := map[string]int{}
	out := make(map[string]int, len(sorted))
	for _, d := range sorted {
		out[d.ID] = live[d.WaitKey]
		if d.WaitExp.After(now) {
			live[d.WaitKey]++
		}
	}
	return out
}

func waiterOf(d holderDoc, now time.Time) lease.Waiter {
	h := d.holder()
	h.Token = ""
	w := lease.Waiter{Holder: h, Key: d.WaitKey, Cap: d.WaitCap, Since: d.QueuedAt, Priority: d.Priority, Lapsed: !d.WaitExp.After(now)}
	w.Resource, w.Lease = d.Resource, d.LeaseName
	if r, l, sc, ok := lease.SplitCounterKey(d.WaitKey); ok {
		w.Level, w.Scope, w.Resource, w.Lease = l, sc, r, d.partOf(d.WaitKey)
	}
	return w
}

// waitResource is the resource of the level a waiting holder waits at.
func (d holderDoc) waitResource() string {
	if r, _, _, ok := lease.SplitCounterKey(d.WaitKey); ok {
		return r
	}
	return d.Resource
}
