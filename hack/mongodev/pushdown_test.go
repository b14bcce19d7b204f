package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestConditionalWritesByID: writes by _id with further conditions (pushed down by the
// proxy) answer as MongoDB does, matched or not, for the filter shapes the lease store uses.
func TestConditionalWritesByID(t *testing.T) {
	ctx := context.Background()
	c := connect(t, proxyURI).Database(dbName("pushdown")).Collection("c")
	at := bson.NewDateTimeFromTime(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: int32(2)}, {Key: "updatedAt", Value: at}, {Key: "name", Value: "x"}}); err != nil {
		t.Fatal(err)
	}
	inc := bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}
	count := func() int32 {
		var d struct{ Count int32 }
		if err := c.FindOne(ctx, bson.D{{Key: "_id", Value: "k"}}).Decode(&d); err != nil {
			t.Fatal(err)
		}
		return d.Count
	}
	update := func(filter bson.D) int64 {
		r, err := c.UpdateOne(ctx, filter, inc)
		if err != nil {
			t.Fatal(err)
		}
		return r.MatchedCount
	}
	for _, tc := range []struct {
		name    string
		filter  bson.D
		matched int64
	}{
		{"below the cap", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 3}}}}, 1},
		{"at the cap", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 3}}}}, 0},
		{"int64 and double compare with int32", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: int64(3)}, {Key: "count", Value: bson.D{{Key: "$lte", Value: 3.5}}}}, 1},
		{"compare-and-set on a date, stale", bson.D{{Key: "_id", Value: "k"}, {Key: "updatedAt", Value: bson.DateTime(0)}}, 0},
		{"compare-and-set on a date", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: 4}, {Key: "updatedAt", Value: at}}, 1},
		{"string equality", bson.D{{Key: "_id", Value: "k"}, {Key: "name", Value: "y"}}, 0},
		{"$ne", bson.D{{Key: "_id", Value: "k"}, {Key: "name", Value: bson.D{{Key: "$ne", Value: "y"}}}}, 1},
		{"another type: the server decides", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: "6"}}, 0},
		{"a missing field compared with 1", bson.D{{Key: "_id", Value: "k"}, {Key: "absent", Value: 1}}, 0},
		{"no such document", bson.D{{Key: "_id", Value: "nope"}, {Key: "count", Value: 1}}, 0},
		{"$not $gt on a missing field", bson.D{{Key: "_id", Value: "k"}, {Key: "queued", Value: notGT(0)}}, 1},
		{"$not $gt, numbers", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: notGT(3)}}, 0},
		{"$not $gt, numbers, matching", bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: notGT(7)}}, 1},
		{"$not $gt on a string: the server decides", bson.D{{Key: "_id", Value: "k"}, {Key: "name", Value: notGT(0)}}, 1},
	} {
		if got := update(tc.filter); got != tc.matched {
			t.Errorf("%s: matched %d, want %d", tc.name, got, tc.matched)
		}
	}
	if got := count(); got != 9 {
		t.Errorf("count = %d, want 9 after seven matched increments", got)
	}

	// findAndModify: a miss is ErrNoDocuments, a hit returns the document.
	err := c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: bson.D{{Key: "$gt", Value: 9}}}}, inc).Err()
	if !errors.Is(err, mongo.ErrNoDocuments) {
		t.Errorf("findOneAndUpdate with a failing condition = %v, want no documents", err)
	}
	var after struct{ Count int32 }
	if err := c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: bson.D{{Key: "$gte", Value: 9}}}}, inc,
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&after); err != nil || after.Count != 10 {
		t.Errorf("findOneAndUpdate = %+v, %v; want count 10", after, err)
	}
	// delete and findOneAndDelete with conditions.
	if r, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: 1}}); err != nil || r.DeletedCount != 0 {
		t.Errorf("deleteOne with a failing condition = %+v, %v", r, err)
	}
	if err := c.FindOneAndDelete(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: 10}}).Err(); err != nil {
		t.Errorf("findOneAndDelete with a matching condition: %v", err)
	}
	if n, err := c.CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Errorf("documents left = %d, %v", n, err)
	}
}

func notGT(n int) bson.D {
	return bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: n}}}}
}

// TestLeaseStoreWritesArePushedDown: the conditional writes of the lease store's hot path
// (internal/leasestore: the funnel's increment with and without the queue barrier, the
// compare-and-set corrections, the idle reap's delete) have a shape the proxy pushes down;
// one that does not falls back to a scan of the collection, and the product looks O(N) on
// the development server.
func TestLeaseStoreWritesArePushedDown(t *testing.T) {
	at := bson.NewDateTimeFromTime(time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC))
	for name, cmd := range map[string]bson.D{
		"increment": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: "r|global|*"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 6}}}}},
			{Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}}}}}},
		"increment behind the queue barrier": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: "r|global|*"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 6}}},
				{Key: "queued", Value: notGT(0)}}},
			{Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}}}}}},
		"compare-and-set": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: "r|global|*"}, {Key: "count", Value: 3}, {Key: "updatedAt", Value: at}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "count", Value: 2}}}}}}}}},
		"decrement": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"r|global|*", "r|user|t/u"}}}},
				{Key: "count", Value: bson.D{{Key: "$gt", Value: 0}}}}},
			{Key: "u", Value: bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}}}, {Key: "multi", Value: true}}}}},
		"idle reap": {{Key: "findAndModify", Value: "holders"}, {Key: "query", Value: bson.D{{Key: "_id", Value: "tok"}, {Key: "lastSeenAt", Value: at}}},
			{Key: "remove", Value: true}},
		"booking (an entry named by its holder)": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: "r|global|*"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 6}}},
				{Key: "slots.lh-1", Value: bson.D{{Key: "$exists", Value: false}}}}},
			{Key: "u", Value: bson.D{{Key: "$set", Value: bson.D{{Key: "slots.lh-1", Value: bson.D{}}}}, {Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}}}}}},
		"give-back where nobody lines up": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"r|global|*", "r|user|t/u"}}}},
				{Key: "slots.lh-1", Value: bson.D{{Key: "$exists", Value: true}}}, {Key: "lined", Value: bson.D{{Key: "$ne", Value: true}}}}},
			{Key: "u", Value: bson.D{{Key: "$unset", Value: bson.D{{Key: "slots.lh-1", Value: ""}}}, {Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}}},
			{Key: "multi", Value: true}}}}},
		"hand-over (the entry moves)": {{Key: "update", Value: "counters"}, {Key: "updates", Value: bson.A{bson.D{
			{Key: "q", Value: bson.D{{Key: "_id", Value: "r|global|*"}, {Key: "slots.lh-1", Value: bson.D{{Key: "$exists", Value: true}}},
				{Key: "slots.lh-2", Value: bson.D{{Key: "$exists", Value: false}}}}},
			{Key: "u", Value: bson.D{{Key: "$unset", Value: bson.D{{Key: "slots.lh-1", Value: ""}}}, {Key: "$set", Value: bson.D{{Key: "slots.lh-2", Value: bson.D{}}}}}}}}}},
	} {
		cmd = append(cmd, bson.E{Key: "$db", Value: "lease"})
		body, err := bson.Marshal(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if _, ok := parseIDWrite(buildOpMsg(1, 0, body)); !ok {
			t.Errorf("%s: not pushed down", name)
		}
	}
}

// TestUpdateManyByIDList: an updateMany naming its documents by _id: {$in: [...]} (the
// release's decrement) updates exactly the listed documents that match the rest of the
// filter, and answers with the counts MongoDB gives.
func TestUpdateManyByIDList(t *testing.T) {
	ctx := context.Background()
	c := connect(t, proxyURI).Database(dbName("pushdown")).Collection("many")
	docs := []any{
		bson.D{{Key: "_id", Value: "a"}, {Key: "count", Value: int32(2)}},
		bson.D{{Key: "_id", Value: "b"}, {Key: "count", Value: int32(0)}},
		bson.D{{Key: "_id", Value: "c"}, {Key: "count", Value: int32(1)}},
		bson.D{{Key: "_id", Value: "other"}, {Key: "count", Value: int32(5)}},
	}
	if _, err := c.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	dec := bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}}
	in := func(ids ...any) bson.D {
		return bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A(ids)}}}, {Key: "count", Value: bson.D{{Key: "$gt", Value: 0}}}}
	}
	for _, tc := range []struct {
		name              string
		filter            bson.D
		matched, modified int64
	}{
		{"two of three match, one is missing", in("a", "b", "c", "nope", "a"), 2, 2},
		{"one left above zero", in("a", "b", "c"), 1, 1},
		{"none above zero", in("a", "b", "c"), 0, 0},
		{"none exists", in("x", "y"), 0, 0},
		{"a value the proxy does not compare: the server decides", in("a", 7), 0, 0},
	} {
		r, err := c.UpdateMany(ctx, tc.filter, dec)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if r.MatchedCount != tc.matched || r.ModifiedCount != tc.modified {
			t.Errorf("%s: matched %d modified %d, want %d and %d", tc.name, r.MatchedCount, r.ModifiedCount, tc.matched, tc.modified)
		}
	}
	want := map[string]int32{"a": 0, "b": 0, "c": 0, "other": 5}
	cur, err := c.Find(ctx, bson.D{})
	if err != nil {
		t.Fatal(err)
	}
	var got []struct {
		ID    string `bson:"_id"`
		Count int32
	}
	if err := cur.All(ctx, &got); err != nil {
		t.Fatal(err)
	}
	for _, d := range got {
		if want[d.ID] != d.Count {
			t.Errorf("%s = %d, want %d", d.ID, d.Count, want[d.ID])
		}
	}
	if len(got) != len(want) {
		t.Errorf("%d documents, want %d", len(got), len(want))
	}
}

// TestReleaseDecrementIsPushedDown: a release's decrement of counters that nobody waits at
// ({_id: {$in}, count: {$gt: 0}, lined: {$ne: true}}, where lined is missing on most
// counters) is decided by the proxy, not by a scan of the collection, and matches as MongoDB
// does: a missing lined matches $ne, a lined counter does not.
func TestReleaseDecrementIsPushedDown(t *testing.T) {
	ctx := t.Context()
	c := connect(t, proxyURI).Database(dbName("pushdown")).Collection("lined")
	if _, err := c.InsertMany(ctx, []any{
		bson.D{{Key: "_id", Value: "plain"}, {Key: "count", Value: int32(1)}},
		bson.D{{Key: "_id", Value: "unlined"}, {Key: "count", Value: int32(1)}, {Key: "lined", Value: false}},
		bson.D{{Key: "_id", Value: "lined"}, {Key: "count", Value: int32(1)}, {Key: "lined", Value: true}},
	}); err != nil {
		t.Fatal(err)
	}
	before := writeFallbacks.Load()
	r, err := c.UpdateMany(ctx, bson.D{
		{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"plain", "unlined", "lined"}}}},
		{Key: "count", Value: bson.D{{Key: "$gt", Value: 0}}},
		{Key: "lined", Value: bson.D{{Key: "$ne", Value: true}}},
	}, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}})
	if err != nil {
		t.Fatal(err)
	}
	if r.MatchedCount != 2 || r.ModifiedCount != 2 {
		t.Errorf("matched %d modified %d, want 2 and 2", r.MatchedCount, r.ModifiedCount)
	}
	// A missing field under an order comparison matches nothing.
	r, err = c.UpdateMany(ctx, bson.D{
		{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"plain"}}}},
		{Key: "lined", Value: bson.D{{Key: "$gt", Value: 0}}},
	}, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}})
	if err != nil || r.MatchedCount != 0 {
		t.Errorf("a missing field under $gt: %+v, %v; want nothing matched", r, err)
	}
	if n := writeFallbacks.Load() - before; n != 0 {
		t.Errorf("%d writes left to the server's scan, want 0", n)
	}
}

// TestEntryWritesAnswerAsTheServer: the lease store's writes of entries (conditions on a
// dotted field's existence) give the same answers and documents through the proxy's
// push-down as FerretDB gives alone.
func TestEntryWritesAnswerAsTheServer(t *testing.T) {
	ctx := context.Background()
	db := dbName("entries")
	var results [2][]string
	for i, uri := range []string{proxyURI, backendURI} {
		c := connect(t, uri).Database(db).Collection(fmt.Sprintf("counters%d", i))
		if _, err := c.InsertMany(ctx, []any{
			bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: int32(0)}, {Key: "slots", Value: bson.D{}}},
			bson.D{{Key: "_id", Value: "l"}, {Key: "count", Value: int32(0)}, {Key: "lined", Value: true}},
		}); err != nil {
			t.Fatal(err)
		}
		book := func(key, pid string) string {
			r, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: key}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 2}}}, {Key: "slots." + pid, Value: bson.D{{Key: "$exists", Value: false}}}},
				bson.D{{Key: "$set", Value: bson.D{{Key: "slots." + pid, Value: bson.D{}}}}, {Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}})
			if err != nil {
				t.Fatal(err)
			}
			return fmt.Sprintf("book %s %s: %d", key, pid, r.MatchedCount)
		}
		var out []string
		out = append(out, book("k", "lh-a"), book("k", "lh-a"), book("k", "lh-b"), book("k", "lh-c"), book("l", "lh-a"), book("nope", "lh-a"))
		r, err := c.UpdateOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "slots.lh-a", Value: bson.D{{Key: "$exists", Value: true}}}, {Key: "slots.lh-w", Value: bson.D{{Key: "$exists", Value: false}}}},
			bson.D{{Key: "$unset", Value: bson.D{{Key: "slots.lh-a", Value: ""}}}, {Key: "$set", Value: bson.D{{Key: "slots.lh-w", Value: bson.D{}}}}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("move: %d", r.MatchedCount))
		m, err := c.UpdateMany(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"k", "l"}}}}, {Key: "slots.lh-b", Value: bson.D{{Key: "$exists", Value: true}}}, {Key: "lined", Value: bson.D{{Key: "$ne", Value: true}}}},
			bson.D{{Key: "$unset", Value: bson.D{{Key: "slots.lh-b", Value: ""}}}, {Key: "$inc", Value: bson.D{{Key: "count", Value: -1}}}})
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, fmt.Sprintf("give back: %d %d", m.MatchedCount, m.ModifiedCount))
		out = append(out, findAll(ctx, t, c, bson.D{}, options.Find())...)
		results[i] = out
	}
	if !slices.Equal(results[0], results[1]) {
		t.Errorf("through the proxy:\n%s\nFerretDB itself:\n%s", strings.Join(results[0], "\n"), strings.Join(results[1], "\n"))
	}
	t.Logf("%s", strings.Join(results[0], "; "))
}
