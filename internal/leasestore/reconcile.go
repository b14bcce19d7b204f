package leasestore

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Reconcile recomputes every counter from the holders' registered levels and corrects the
// drift left by crash windows (between increment and push, between delete and decrement).
// Only counters whose updatedAt is older than the safety margin are touched, and only by a
// compare-and-set on the count and updatedAt it read, so a concurrent acquire or release
// wins. A counter that no holder books is deleted rather than zeroed.
//
// Lowering a counter needs more than one look: a release deletes its holder first and
// decrements second, and a delete does not change the counter, so one pass that reads
// between the two would take the slot back twice (overbooking the cap). A counter is
// therefore lowered (or deleted) only when this store saw the same count, updatedAt and
// booked number in an earlier pass at least the confirmation delay before (longer than any
// in-flight decrement may take: WithReconcileConfirm, default twice the operation
// timeout). Raising a counter to what is booked is safe at once.
func (s *Store) Reconcile(ctx context.Context) (ReconcileResult, error) {
	var res ReconcileResult
	now, err := s.ServerTime(ctx)
	if err != nil {
		return res, err
	}
	// Counters first, holders second: a holder that books a counter after this read changes
	// the counter's count, and the compare-and-set then misses.
	counters, err := s.findCounters(ctx, bson.D{})
	if err != nil {
		return res, err
	}
	booked, err := s.booked(ctx, "")
	if err != nil {
		return res, err
	}
	cutoff := now.Add(-s.cfg.safetyMargin)
	ctx, cancel := s.bound(ctx)
	defer cancel()
	seen := make(map[string]bool, len(counters))
	s.mu.Lock()
	previous := s.lowering
	s.lowering = map[string]lowering{}
	s.mu.Unlock()
	for _, c := range counters {
		seen[c.ID] = true
		want := booked[c.ID]
		if c.Count == want && want > 0 {
			continue
		}
		if !c.UpdatedAt.Before(cutoff) {
			res.Skipped++
			continue
		}
		if want < c.Count {
			obs := lowering{count: c.Count, updatedAt: c.UpdatedAt, want: want, seen: now}
			p, confirmed := previous[c.ID]
			confirmed = confirmed && p.same(obs)
			if confirmed {
				obs.seen = p.seen
			}
			if !confirmed || now.Sub(obs.seen) < s.cfg.confirm {
				s.mu.Lock()
				s.lowering[c.ID] = obs
				s.mu.Unlock()
				res.Skipped++
				continue
			}
		}
		cas := bson.D{{Key: "_id", Value: c.ID}, {Key: "count", Value: c.Count}, {Key: "updatedAt", Value: c.UpdatedAt}}
		if want == 0 {
			r, err := s.counters.DeleteOne(ctx, cas)
			if err != nil {
				return res, unavailable("deleting counter "+c.ID, err)
			}
			if r.DeletedCount == 1 {
				res.Deleted++
				s.freed(repeat(c.ID, c.Count))
			} else {
				res.Skipped++
			}
			continue
		}
		r, err := s.counters.UpdateOne(ctx, cas, bson.D{
			{Key: "$set", Value: bson.D{{Key: "count", Value: want}}},
			{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
		})
		if err != nil {
			return res, unavailable("correcting counter "+c.ID, err)
		}
		if r.MatchedCount == 1 {
			res.Corrected++
			s.freed(repeat(c.ID, c.Count-want))
		} else {
			res.Skipped++
		}
	}
	// A booked key without a counter cannot come from the funnel (it increments before it
	// pushes); recreate it so the cap holds again.
	for key, n := range booked {
		if seen[key] {
			continue
		}
		resource, level, scope, ok := splitKey(key)
		if !ok {
			continue
		}
		tenant := ""
		if level != lease.LevelGlobal {
			tenant, _, _ = strings.Cut(scope, "/")
		}
		_, err := s.counters.InsertOne(ctx, counterDoc{
			ID: key, Resource: resource, Level: string(level), Scope: scope, Tenant: tenant, Count: n, UpdatedAt: now,
		})
		switch {
		case mongo.IsDuplicateKeyError(err):
			res.Skipped++
		case err != nil:
			return res, unavailable("recreating counter "+key, err)
		default:
			res.Created++
		}
	}
	return res, nil
}

// booked counts, per counter key, the holders that book it (of one resource, or all).
func (s *Store) booked(ctx context.Context, resource string) (map[string]int, error) {
	filter := bson.D{}
	if resource != "" {
		filter = append(filter, bson.E{Key: "resource", Value: resource})
	}
	docs, err := s.findHolders(ctx, filter, bson.D{{Key: "levels", Value: 1}})
	if err != nil {
		return nil, err
	}
	out := map[string]int{}
	for _, d := range docs {
		for _, k := range d.Levels {
			out[k]++
		}
	}
	return out, nil
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

// ListCounters reads the counters matching f with, for each, the number of holders that book
// it, so drift is visible instead of hidden.
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
	booked, err := s.booked(ctx, f.Resource)
	if err != nil {
		return nil, err
	}
	out := make([]lease.Counter, len(docs))
	for i, d := range docs {
		out[i] = lease.Counter{
			Key: d.ID, Resource: d.Resource, Level: lease.Level(d.Level), Scope: d.Scope,
			Count: d.Count, UpdatedAt: d.UpdatedAt, Booked: booked[d.ID],
		}
	}
	return out, nil
}

// splitKey parses <resource>|<level>|<scope>. The resource may itself contain '|' only if
// a caller chose so; the level and scope are the last two fields.
func splitKey(key string) (resource string, level lease.Level, scope string, ok bool) {
	i := strings.LastIndex(key, "|")
	if i < 0 {
		return "", "", "", false
	}
	j := strings.LastIndex(key[:i], "|")
	if j < 0 {
		return "", "", "", false
	}
	return key[:j], lease.Level(key[j+1 : i]), key[i+1:], true
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

// lowering is a counter seen above what its holders book, remembered until a later pass
// confirms it.
type lowering struct {
	count     int
	updatedAt time.Time
	want      int
	// seen is the server time of the first pass that saw exactly this state.
	seen time.Time
}

func (l lowering) same(o lowering) bool {
	return l.count == o.count && l.updatedAt.Equal(o.updatedAt) && l.want == o.want
}
