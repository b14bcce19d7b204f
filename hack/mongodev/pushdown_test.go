package main

import (
	"context"
	"errors"
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
		{"a missing field: the server decides", bson.D{{Key: "_id", Value: "k"}, {Key: "absent", Value: 1}}, 0},
		{"no such document", bson.D{{Key: "_id", Value: "nope"}, {Key: "count", Value: 1}}, 0},
	} {
		if got := update(tc.filter); got != tc.matched {
			t.Errorf("%s: matched %d, want %d", tc.name, got, tc.matched)
		}
	}
	if got := count(); got != 6 {
		t.Errorf("count = %d, want 6 after four matched increments", got)
	}

	// findAndModify: a miss is ErrNoDocuments, a hit returns the document.
	err := c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: bson.D{{Key: "$gt", Value: 6}}}}, inc).Err()
	if !errors.Is(err, mongo.ErrNoDocuments) {
		t.Errorf("findOneAndUpdate with a failing condition = %v, want no documents", err)
	}
	var after struct{ Count int32 }
	if err := c.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: bson.D{{Key: "$gte", Value: 6}}}}, inc,
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&after); err != nil || after.Count != 7 {
		t.Errorf("findOneAndUpdate = %+v, %v; want count 7", after, err)
	}
	// delete and findOneAndDelete with conditions.
	if r, err := c.DeleteOne(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: 1}}); err != nil || r.DeletedCount != 0 {
		t.Errorf("deleteOne with a failing condition = %+v, %v", r, err)
	}
	if err := c.FindOneAndDelete(ctx, bson.D{{Key: "_id", Value: "k"}, {Key: "count", Value: 7}}).Err(); err != nil {
		t.Errorf("findOneAndDelete with a matching condition: %v", err)
	}
	if n, err := c.CountDocuments(ctx, bson.D{}); err != nil || n != 0 {
		t.Errorf("documents left = %d, %v", n, err)
	}
}
