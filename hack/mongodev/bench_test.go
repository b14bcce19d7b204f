package main

import (
	"context"
	"fmt"
	"testing"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// BenchmarkWriteByID measures single-document commands by _id, through the proxy, on a
// collection of 0, 1 000 and 4 000 other documents: a write by _id must not grow with the
// collection (docs/operations.md, "The development store").
func BenchmarkWriteByID(b *testing.B) {
	ctx := context.Background()
	for _, size := range []int{0, 1000, 4000} {
		db := dbName("bench")
		c := connect(b, proxyURI).Database(db).Collection("c")
		docs := make([]any, 0, size)
		for i := range size {
			docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("doc-%06d", i)}, {Key: "count", Value: 1}, {Key: "pad", Value: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}})
		}
		if size > 0 {
			if _, err := c.InsertMany(ctx, docs); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "target"}, {Key: "count", Value: 0}}); err != nil {
			b.Fatal(err)
		}
		id := bson.D{{Key: "_id", Value: "target"}}
		b.Run(fmt.Sprintf("findOne/docs=%d", size), func(b *testing.B) {
			for b.Loop() {
				if err := c.FindOne(ctx, id).Err(); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("updateOne/docs=%d", size), func(b *testing.B) {
			for b.Loop() {
				if _, err := c.UpdateOne(ctx, id, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("updateOneConditional/docs=%d", size), func(b *testing.B) {
			filter := bson.D{{Key: "_id", Value: "target"}, {Key: "count", Value: bson.D{{Key: "$gte", Value: 0}}}}
			for b.Loop() {
				if _, err := c.UpdateOne(ctx, filter, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("updateOneBehindBarrier/docs=%d", size), func(b *testing.B) {
			// The lease store's increment: a cap and the queue barrier ($not on a missing field).
			filter := bson.D{{Key: "_id", Value: "target"}, {Key: "count", Value: bson.D{{Key: "$gte", Value: 0}}},
				{Key: "queued", Value: bson.D{{Key: "$not", Value: bson.D{{Key: "$gt", Value: 0}}}}}}
			for b.Loop() {
				if _, err := c.UpdateOne(ctx, filter, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("updateManyByIDList/docs=%d", size), func(b *testing.B) {
			// The lease store's decrement of a release: the funnel's counters by _id list.
			filter := bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: bson.A{"target", "doc-000001", "doc-000002"}}}},
				{Key: "count", Value: bson.D{{Key: "$gte", Value: 0}}}}
			for b.Loop() {
				if _, err := c.UpdateMany(ctx, filter, bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}}); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("findOneAndDelete+insert/docs=%d", size), func(b *testing.B) {
			for b.Loop() {
				if err := c.FindOneAndDelete(ctx, id).Err(); err != nil && err != mongo.ErrNoDocuments {
					b.Fatal(err)
				}
				if _, err := c.InsertOne(ctx, bson.D{{Key: "_id", Value: "target"}, {Key: "count", Value: 0}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkFindByTenant measures a find of one tenant's 10 documents among 10 000 (the
// operator's per-tenant views), through the proxy (answered through its tenant index) and
// from FerretDB directly (a pass over the collection).
func BenchmarkFindByTenant(b *testing.B) {
	ctx := context.Background()
	db := dbName("benchtenant")
	c := connect(b, proxyURI).Database(db).Collection("holders")
	docs := make([]any, 0, 10000)
	for i := range 10000 {
		docs = append(docs, bson.D{{Key: "_id", Value: fmt.Sprintf("tok-%06d", i)}, {Key: "pid", Value: fmt.Sprintf("lh-%06d", i)},
			{Key: "tenant", Value: fmt.Sprintf("t%04d", i%1000)}, {Key: "state", Value: "HELD"},
			{Key: "levels", Value: bson.A{"global", "tenant", "project", "user"}}, {Key: "pad", Value: "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"}})
	}
	for i := 0; i < len(docs); i += 1000 {
		if _, err := c.InsertMany(ctx, docs[i:i+1000]); err != nil {
			b.Fatal(err)
		}
	}
	filter := bson.D{{Key: "state", Value: bson.D{{Key: "$ne", Value: "WAITING"}}}, {Key: "tenant", Value: "t0042"}}
	for _, tc := range []struct {
		name string
		uri  string
	}{{"proxy", proxyURI}, {"ferretdb", backendURI}} {
		coll := connect(b, tc.uri).Database(db).Collection("holders")
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				cur, err := coll.Find(ctx, filter, options.Find().SetSort(bson.D{{Key: "pid", Value: 1}}).SetLimit(501))
				if err != nil {
					b.Fatal(err)
				}
				var got []bson.Raw
				if err := cur.All(ctx, &got); err != nil {
					b.Fatal(err)
				}
				if len(got) != 10 {
					b.Fatalf("%d documents, want 10", len(got))
				}
			}
		})
	}
}
