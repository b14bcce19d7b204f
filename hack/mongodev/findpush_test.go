package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestFindByIndexedFieldAnswersAsTheServer: a find with an equality on tenant, answered by the
// proxy through its index, returns what FerretDB itself returns for the same find (read
// directly from the backend), for the shapes the lease store's views send and for the shapes
// the proxy must leave to the server.
func TestFindByIndexedFieldAnswersAsTheServer(t *testing.T) {
	ctx := t.Context()
	db := dbName("findpush")
	viaProxy := connect(t, proxyURI).Database(db).Collection("holders")
	direct := connect(t, backendURI).Database(db).Collection("holders")
	var docs []any
	for i := range 40 {
		state := "HELD"
		if i%5 == 0 {
			state = "WAITING"
		}
		docs = append(docs, bson.D{
			{Key: "_id", Value: fmt.Sprintf("tok-%02d", i)}, {Key: "pid", Value: fmt.Sprintf("lh-%02d", 39-i)},
			{Key: "tenant", Value: fmt.Sprintf("t%d", i%4)}, {Key: "resource", Value: fmt.Sprintf("r%d", i%3)},
			{Key: "state", Value: state}, {Key: "levels", Value: bson.A{"global", "tenant"}}, {Key: "n", Value: int32(i)},
		})
	}
	docs = append(docs,
		bson.D{{Key: "_id", Value: "odd-array"}, {Key: "tenant", Value: bson.A{"t9", "x"}}, {Key: "pid", Value: "lh-a"}, {Key: "state", Value: "HELD"}},
		bson.D{{Key: "_id", Value: bson.NewObjectID()}, {Key: "tenant", Value: "t8"}, {Key: "pid", Value: "lh-b"}, {Key: "state", Value: "HELD"}},
		bson.D{{Key: "_id", Value: "no-state"}, {Key: "tenant", Value: "t7"}, {Key: "pid", Value: "lh-c"}},
		bson.D{{Key: "_id", Value: "mixed-pid"}, {Key: "tenant", Value: "t6"}, {Key: "pid", Value: 7}, {Key: "state", Value: "HELD"}},
		bson.D{{Key: "_id", Value: "mixed-pid-2"}, {Key: "tenant", Value: "t6"}, {Key: "pid", Value: "lh-d"}, {Key: "state", Value: "HELD"}},
	)
	if _, err := viaProxy.InsertMany(ctx, docs); err != nil {
		t.Fatal(err)
	}
	notWaiting := bson.E{Key: "state", Value: bson.D{{Key: "$ne", Value: "WAITING"}}}
	byPID := bson.D{{Key: "pid", Value: 1}}
	for _, tc := range []struct {
		name     string
		filter   bson.D
		opts     *options.FindOptionsBuilder
		answered bool // by the proxy through the index
	}{
		{"a tenant's page of holders (the live API's list)", bson.D{notWaiting, {Key: "tenant", Value: "t1"}},
			options.Find().SetSort(byPID).SetLimit(4).SetBatchSize(6), true},
		{"the next page", bson.D{notWaiting, {Key: "tenant", Value: "t1"}, {Key: "pid", Value: bson.D{{Key: "$gt", Value: "lh-20"}}}},
			options.Find().SetSort(byPID).SetLimit(4), true},
		{"descending", bson.D{{Key: "tenant", Value: "t2"}}, options.Find().SetSort(bson.D{{Key: "pid", Value: -1}}), true},
		{"a tenant's bookings (projection, batches)", bson.D{{Key: "resource", Value: "r1"}, {Key: "tenant", Value: "t0"}},
			options.Find().SetProjection(bson.D{{Key: "levels", Value: 1}, {Key: "tenant", Value: 1}}).SetBatchSize(2), true},
		{"exclusion projection", bson.D{{Key: "tenant", Value: "t3"}}, options.Find().SetProjection(bson.D{{Key: "levels", Value: 0}, {Key: "_id", Value: 0}}), true},
		{"no such tenant", bson.D{{Key: "tenant", Value: "nobody"}}, nil, true},
		{"the field is an array: the server decides", bson.D{{Key: "tenant", Value: "t9"}}, nil, false},
		{"an _id that is no string: the server decides", bson.D{{Key: "tenant", Value: "t8"}}, nil, false},
		{"a missing field under $ne", bson.D{notWaiting, {Key: "tenant", Value: "t7"}}, nil, true},
		{"a missing field under $eq", bson.D{{Key: "tenant", Value: "t7"}, {Key: "state", Value: "HELD"}}, nil, true},
		{"sort keys of two types: the server decides", bson.D{{Key: "tenant", Value: "t6"}}, options.Find().SetSort(byPID), false},
		{"a condition the proxy does not evaluate: forwarded", bson.D{{Key: "tenant", Value: "t1"}, {Key: "n", Value: bson.D{{Key: "$in", Value: bson.A{1, 5}}}}}, nil, false},
		{"skip: forwarded", bson.D{{Key: "tenant", Value: "t1"}}, options.Find().SetSort(byPID).SetSkip(2), false},
		{"holders by public IDs (the repair's look-up)", bson.D{{Key: "pid", Value: bson.D{{Key: "$in", Value: bson.A{"lh-01", "lh-05", "lh-zz"}}}}},
			options.Find().SetProjection(byPID), true},
		{"by public IDs, with a state", bson.D{{Key: "pid", Value: bson.D{{Key: "$in", Value: bson.A{"lh-01", "lh-04", "lh-05"}}}}, {Key: "state", Value: "WAITING"}}, nil, true},
		{"an $in with a number: forwarded", bson.D{{Key: "pid", Value: bson.D{{Key: "$in", Value: bson.A{"lh-01", 7}}}}}, nil, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := tc.opts
			if opts == nil {
				opts = options.Find()
			}
			got := findAll(ctx, t, viaProxy, tc.filter, opts)
			want := findAll(ctx, t, direct, tc.filter, opts)
			if !slices.Equal(got, want) {
				t.Errorf("through the proxy:\n%s\nFerretDB itself:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
			}
			if len(want) == 0 && tc.name != "no such tenant" && tc.name != "a missing field under $eq" {
				t.Errorf("the case matched nothing: it tests nothing")
			}
			before := indexedAnswers.Load()
			findAll(ctx, t, viaProxy, tc.filter, opts)
			if answered := indexedAnswers.Load() > before; answered != tc.answered {
				t.Errorf("answered through the index: %v, want %v", answered, tc.answered)
			}
		})
	}
}

// findAll runs a find and returns its documents as extended JSON, in the order given when the
// find sorts, else ordered by _id.
func findAll(ctx context.Context, t *testing.T, c *mongo.Collection, filter bson.D, opts *options.FindOptionsBuilder) []string {
	t.Helper()
	cur, err := c.Find(ctx, filter, opts)
	if err != nil {
		t.Fatal(err)
	}
	var raws []bson.Raw
	if err := cur.All(ctx, &raws); err != nil {
		t.Fatal(err)
	}
	var fo options.FindOptions
	for _, set := range opts.Opts {
		_ = set(&fo)
	}
	out := make([]string, len(raws))
	for i, r := range raws {
		out[i] = r.String()
	}
	if fo.Sort == nil {
		slices.Sort(out)
	}
	return out
}
