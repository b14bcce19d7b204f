package leasestore_test

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// TestFirstStartMigratesCounters: a store written by the former model (counters with a count
// and no entries, holders naming the counters they book, one mid-acquisition with incKey, one
// being released) is migrated on the first start of this version: every counter gets the
// entries of the holders that book it, the count is their number, and the caps hold from the
// first acquisition on.
func TestFirstStartMigratesCounters(t *testing.T) {
	uri, db := newDatabase(t)
	ctx := ctxT(t)
	counters, holders := rawCounters(t, uri, db), rawHolders(t, uri, db)
	g := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	ten := key("gpu", lease.LevelTenant, "acme", "p", "ann")
	now := time.Now()
	holder := func(token, state string, levels bson.A, more ...bson.E) bson.D {
		return append(bson.D{
			{Key: "_id", Value: token}, {Key: "pid", Value: lease.HolderID(token)}, {Key: "state", Value: state},
			{Key: "leaseName", Value: "gpu"}, {Key: "resource", Value: "gpu"}, {Key: "type", Value: "tex"},
			{Key: "tenant", Value: "acme"}, {Key: "project", Value: "p"}, {Key: "user", Value: "ann"},
			{Key: "ttlSeconds", Value: 3600.0}, {Key: "levels", Value: levels},
			{Key: "acquiredAt", Value: now}, {Key: "lastSeenAt", Value: now},
		}, more...)
	}
	for _, d := range []bson.D{
		holder("00000000000000000000000000000001", "HELD", bson.A{ten, g}),
		holder("00000000000000000000000000000002", "HELD", bson.A{ten}, bson.E{Key: "grantKey", Value: g}),
		holder("00000000000000000000000000000003", "PENDING", bson.A{ten}, bson.E{Key: "incKey", Value: g}),
		holder("00000000000000000000000000000004", "RELEASED", bson.A{ten, g}),
	} {
		if _, err := holders.InsertOne(ctx, d); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []bson.D{
		{{Key: "_id", Value: g}, {Key: "resource", Value: "gpu"}, {Key: "level", Value: "global"}, {Key: "scope", Value: "*"},
			{Key: "tenant", Value: ""}, {Key: "count", Value: 4}, {Key: "rev", Value: 9}, {Key: "updatedAt", Value: now}},
		{{Key: "_id", Value: ten}, {Key: "resource", Value: "gpu"}, {Key: "level", Value: "tenant"}, {Key: "scope", Value: "acme"},
			{Key: "tenant", Value: "acme"}, {Key: "count", Value: 3}, {Key: "rev", Value: 4}, {Key: "updatedAt", Value: now}},
	} {
		if _, err := counters.InsertOne(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	s := newStoreAt(t, uri, db) // EnsureIndexes migrates
	cs, err := s.ListCounters(ctx, leasestore.CounterFilter{Resource: "gpu"})
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][]string{
		g:   {lease.HolderID("00000000000000000000000000000001"), lease.HolderID("00000000000000000000000000000002")},
		ten: {lease.HolderID("00000000000000000000000000000001"), lease.HolderID("00000000000000000000000000000002"), lease.HolderID("00000000000000000000000000000003")},
	}
	for _, c := range cs {
		w := slices.Sorted(slices.Values(want[c.Key]))
		if c.Count != len(w) || !slices.Equal(c.Holders, w) || len(c.Gone) != 0 {
			t.Errorf("counter %s after the migration: count %d, entries %v; want %v", c.Key, c.Count, c.Holders, w)
		}
	}
	if n, err := holders.CountDocuments(ctx, bson.D{{Key: "incKey", Value: bson.D{{Key: "$exists", Value: true}}}}); err != nil || n != 0 {
		t.Errorf("%d holders still name an incKey (%v)", n, err)
	}
	if n, err := counters.CountDocuments(ctx, bson.D{{Key: "rev", Value: bson.D{{Key: "$exists", Value: true}}}}); err != nil || n != 0 {
		t.Errorf("%d counters still carry rev (%v)", n, err)
	}
	// A second start finds nothing to do; the caps hold (global 2: full).
	again := newStoreAt(t, uri, db)
	r := userReq("bob", []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 2}, {Level: lease.LevelTenant, Cap: 5}})
	if _, err := again.Acquire(context.Background(), r); !errors.Is(err, lease.ErrBusy) {
		t.Errorf("an acquisition at a migrated full level: %v, want busy", err)
	}
}
