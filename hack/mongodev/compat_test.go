package main

import (
	"context"
	"errors"
	"reflect"
	"slices"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestCompat documents which MongoDB features the lease store relies on work through mongodev
// (FerretDB v1.24.2, SQLite backend) with the v2 driver.
func TestCompat(t *testing.T) {
	ctx := context.Background()
	db := connect(t, proxyURI).Database(dbName("compat"))
	type M = bson.M
	type D = bson.D
	id := func(v any) D { return D{{Key: "_id", Value: v}} }

	t.Run("hello localTime", func(t *testing.T) {
		var res M
		if err := db.Client().Database("admin").RunCommand(ctx, D{{Key: "hello", Value: 1}}).Decode(&res); err != nil {
			t.Fatal(err)
		}
		lt, ok := res["localTime"].(bson.DateTime)
		if !ok {
			t.Fatalf("localTime = %#v (%T), want a BSON date", res["localTime"], res["localTime"])
		}
		if d := time.Since(lt.Time()); d < -2*time.Second || d > 2*time.Second {
			t.Fatalf("localTime %v is %v away from now", lt.Time(), d)
		}
	})

	t.Run("upsert setOnInsert currentDate", func(t *testing.T) {
		c := db.Collection("upsert")
		update := D{
			{Key: "$setOnInsert", Value: D{{Key: "createdBy", Value: "first"}, {Key: "count", Value: int32(0)}}},
			{Key: "$currentDate", Value: D{{Key: "updatedAt", Value: true}}},
		}
		res, err := c.UpdateOne(ctx, id("u1"), update, options.UpdateOne().SetUpsert(true))
		if err != nil {
			t.Fatal(err)
		}
		if res.UpsertedCount != 1 || res.UpsertedID != "u1" {
			t.Fatalf("first upsert: %+v", res)
		}
		var doc M
		if err := c.FindOne(ctx, id("u1")).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		first, ok := doc["updatedAt"].(bson.DateTime)
		if !ok || doc["createdBy"] != "first" || doc["count"] != int32(0) {
			t.Fatalf("after insert: %v", doc)
		}
		time.Sleep(5 * time.Millisecond)
		update[0].Value = D{{Key: "createdBy", Value: "second"}}
		res, err = c.UpdateOne(ctx, id("u1"), update, options.UpdateOne().SetUpsert(true))
		if err != nil {
			t.Fatal(err)
		}
		if res.MatchedCount != 1 || res.UpsertedCount != 0 {
			t.Fatalf("second upsert: %+v", res)
		}
		doc = nil
		if err := c.FindOne(ctx, id("u1")).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		second, _ := doc["updatedAt"].(bson.DateTime)
		if doc["createdBy"] != "first" || second <= first {
			t.Fatalf("after update: %v (first updatedAt %v)", doc, first.Time())
		}
	})

	t.Run("findOneAndDelete", func(t *testing.T) {
		c := db.Collection("fad")
		if _, err := c.InsertOne(ctx, D{{Key: "_id", Value: "x"}, {Key: "v", Value: 1}}); err != nil {
			t.Fatal(err)
		}
		var doc M
		if err := c.FindOneAndDelete(ctx, id("x")).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if doc["v"] != int32(1) {
			t.Fatalf("deleted %v", doc)
		}
		if err := c.FindOneAndDelete(ctx, id("x")).Err(); !errors.Is(err, mongo.ErrNoDocuments) {
			t.Fatalf("second findOneAndDelete: %v, want ErrNoDocuments", err)
		}
	})

	t.Run("updateMany in gt inc currentDate", func(t *testing.T) {
		c := db.Collection("many")
		docs := []any{
			D{{Key: "_id", Value: "a"}, {Key: "count", Value: int32(2)}},
			D{{Key: "_id", Value: "b"}, {Key: "count", Value: int32(0)}},
			D{{Key: "_id", Value: "c"}, {Key: "count", Value: int32(1)}},
			D{{Key: "_id", Value: "d"}, {Key: "count", Value: int32(5)}},
		}
		if _, err := c.InsertMany(ctx, docs); err != nil {
			t.Fatal(err)
		}
		res, err := c.UpdateMany(ctx,
			D{{Key: "_id", Value: D{{Key: "$in", Value: bson.A{"a", "b", "c", "zz"}}}}, {Key: "count", Value: D{{Key: "$gt", Value: 0}}}},
			D{{Key: "$inc", Value: D{{Key: "count", Value: -1}}}, {Key: "$currentDate", Value: D{{Key: "updatedAt", Value: true}}}})
		if err != nil {
			t.Fatal(err)
		}
		if res.MatchedCount != 2 || res.ModifiedCount != 2 {
			t.Fatalf("result %+v, want 2 matched and modified", res)
		}
		want := map[string]int32{"a": 1, "b": 0, "c": 0, "d": 5}
		cur, err := c.Find(ctx, D{})
		if err != nil {
			t.Fatal(err)
		}
		var got []M
		if err := cur.All(ctx, &got); err != nil {
			t.Fatal(err)
		}
		for _, doc := range got {
			k := doc["_id"].(string)
			_, dated := doc["updatedAt"].(bson.DateTime)
			if doc["count"] != want[k] || dated != (k == "a" || k == "c") {
				t.Errorf("%s: %v", k, doc)
			}
		}
	})

	t.Run("push", func(t *testing.T) {
		c := db.Collection("push")
		for _, tag := range []string{"x", "y"} {
			if _, err := c.UpdateOne(ctx, id("p"), D{{Key: "$push", Value: D{{Key: "tags", Value: tag}}}}, options.UpdateOne().SetUpsert(true)); err != nil {
				t.Fatal(err)
			}
		}
		var doc struct{ Tags []string }
		if err := c.FindOne(ctx, id("p")).Decode(&doc); err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(doc.Tags, []string{"x", "y"}) {
			t.Fatalf("tags = %v", doc.Tags)
		}
	})

	t.Run("createIndexes", func(t *testing.T) {
		c := db.Collection("idx")
		models := []mongo.IndexModel{
			{Keys: D{{Key: "token", Value: 1}}, Options: options.Index().SetUnique(true)},
			{Keys: D{{Key: "tenant", Value: 1}, {Key: "resource", Value: 1}}},
		}
		// Twice, as EnsureIndexes on every start does. The second call crashes FerretDB
		// v1.24.2's connection unless the proxy splits it (see splitCreateIndexes).
		for range 2 {
			names, err := c.Indexes().CreateMany(ctx, models)
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(names, []string{"token_1", "tenant_1_resource_1"}) {
				t.Fatalf("names = %v", names)
			}
		}
		// Existing and new mixed.
		if _, err := c.Indexes().CreateMany(ctx, append(models, mongo.IndexModel{Keys: D{{Key: "pod", Value: 1}}})); err != nil {
			t.Fatal(err)
		}
		var specs []bson.M
		cur, err := c.Indexes().List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := cur.All(ctx, &specs); err != nil {
			t.Fatal(err)
		}
		keys := map[string]string{}
		for _, s := range specs {
			k, _ := bson.MarshalExtJSON(s["key"], false, false)
			keys[s["name"].(string)] = string(k)
		}
		want := map[string]string{"_id_": `{"_id":1}`, "token_1": `{"token":1}`, "tenant_1_resource_1": `{"tenant":1,"resource":1}`, "pod_1": `{"pod":1}`}
		if !reflect.DeepEqual(keys, want) {
			t.Fatalf("indexes = %v", keys)
		}
		// A conflicting definition is an error, not a crash.
		if _, err := c.Indexes().CreateMany(ctx, []mongo.IndexModel{models[1], {Keys: D{{Key: "token", Value: -1}}, Options: options.Index().SetName("token_1")}}); err == nil {
			t.Fatal("conflicting index definition accepted")
		}
		if _, err := c.InsertOne(ctx, D{{Key: "token", Value: "t1"}}); err != nil {
			t.Fatal(err)
		}
		_, err = c.InsertOne(ctx, D{{Key: "token", Value: "t1"}})
		if !mongo.IsDuplicateKeyError(err) {
			t.Fatalf("duplicate on unique index: %v, want a duplicate-key error", err)
		}
	})

	t.Run("distinct", func(t *testing.T) {
		c := db.Collection("distinct")
		if _, err := c.InsertMany(ctx, []any{
			D{{Key: "pod", Value: "a"}, {Key: "n", Value: 1}},
			D{{Key: "pod", Value: "b"}, {Key: "n", Value: 1}},
			D{{Key: "pod", Value: "a"}, {Key: "n", Value: 2}},
			D{{Key: "pod", Value: "c"}, {Key: "n", Value: 0}},
		}); err != nil {
			t.Fatal(err)
		}
		// With a deadline the driver sends maxTimeMS, which FerretDB rejects for distinct
		// unless the proxy drops it. Check Err first: DistinctResult.Decode (driver v2.10.0)
		// ignores the command's error and reports "error decoding key arr: unexpected EOF".
		dctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		res := c.Distinct(dctx, "pod", D{{Key: "n", Value: D{{Key: "$gt", Value: 0}}}})
		if err := res.Err(); err != nil {
			t.Fatal(err)
		}
		var pods []string
		if err := res.Decode(&pods); err != nil {
			t.Fatal(err)
		}
		slices.Sort(pods)
		if !slices.Equal(pods, []string{"a", "b"}) {
			t.Fatalf("pods = %v", pods)
		}
	})

	t.Run("aggregate unwind group", func(t *testing.T) {
		c := db.Collection("agg")
		if _, err := c.InsertMany(ctx, []any{
			D{{Key: "tags", Value: bson.A{"x", "y"}}},
			D{{Key: "tags", Value: bson.A{"x"}}},
		}); err != nil {
			t.Fatal(err)
		}
		cur, err := c.Aggregate(ctx, mongo.Pipeline{
			{{Key: "$unwind", Value: "$tags"}},
			{{Key: "$group", Value: D{{Key: "_id", Value: "$tags"}, {Key: "n", Value: D{{Key: "$sum", Value: 1}}}}}},
			{{Key: "$sort", Value: D{{Key: "_id", Value: 1}}}},
		})
		if err != nil {
			t.Fatal(err)
		}
		var got []struct {
			ID string `bson:"_id"`
			N  int32  `bson:"n"`
		}
		if err := cur.All(ctx, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[0].ID != "x" || got[0].N != 2 || got[1].ID != "y" || got[1].N != 1 {
			t.Fatalf("got %+v", got)
		}
	})

	t.Run("duplicate _id 11000", func(t *testing.T) {
		c := db.Collection("dup")
		if _, err := c.InsertOne(ctx, id("k")); err != nil {
			t.Fatal(err)
		}
		_, err := c.InsertOne(ctx, id("k"))
		var we mongo.WriteException
		if !errors.As(err, &we) || len(we.WriteErrors) != 1 || we.WriteErrors[0].Code != 11000 || !mongo.IsDuplicateKeyError(err) {
			t.Fatalf("err = %#v, want a write exception with code 11000", err)
		}
	})
}

// TestProbes logs which further features work; it asserts nothing (they are not supported
// by FerretDB v1.24.2 in all cases, and the store should not depend on them).
func TestProbes(t *testing.T) {
	ctx := context.Background()
	db := connect(t, proxyURI).Database(dbName("probes"))
	type D = bson.D
	c := db.Collection("p")
	if _, err := c.InsertMany(ctx, []any{
		D{{Key: "_id", Value: 1}, {Key: "count", Value: int32(1)}, {Key: "max", Value: int32(2)}},
		D{{Key: "_id", Value: 2}, {Key: "count", Value: int32(2)}, {Key: "max", Value: int32(2)}},
	}); err != nil {
		t.Fatal(err)
	}
	probe := func(name string, f func() (any, error)) {
		res, err := f()
		if err != nil {
			t.Logf("%-40s UNSUPPORTED/ERROR: %v", name, err)
			return
		}
		t.Logf("%-40s ok: %v", name, res)
	}
	probe("find with $expr", func() (any, error) {
		var out []bson.M
		cur, err := c.Find(ctx, D{{Key: "$expr", Value: D{{Key: "$lt", Value: bson.A{"$count", "$max"}}}}})
		if err != nil {
			return nil, err
		}
		return out, cur.All(ctx, &out)
	})
	probe("updateOne with $expr filter", func() (any, error) {
		return c.UpdateOne(ctx, D{{Key: "_id", Value: 1}, {Key: "$expr", Value: D{{Key: "$lt", Value: bson.A{"$count", "$max"}}}}},
			D{{Key: "$inc", Value: D{{Key: "count", Value: 1}}}})
	})
	probe("pipeline update", func() (any, error) {
		return c.UpdateOne(ctx, D{{Key: "_id", Value: 2}}, mongo.Pipeline{{{Key: "$set", Value: D{{Key: "x", Value: "$count"}}}}})
	})
	probe("findOneAndUpdate upsert returnAfter", func() (any, error) {
		var out bson.M
		err := c.FindOneAndUpdate(ctx, D{{Key: "_id", Value: 3}},
			D{{Key: "$inc", Value: D{{Key: "count", Value: 1}}}, {Key: "$setOnInsert", Value: D{{Key: "max", Value: int32(9)}}}},
			options.FindOneAndUpdate().SetUpsert(true).SetReturnDocument(options.After)).Decode(&out)
		return out, err
	})
	probe("findOneAndUpdate conditional $inc", func() (any, error) {
		var out bson.M
		err := c.FindOneAndUpdate(ctx, D{{Key: "_id", Value: 3}, {Key: "count", Value: D{{Key: "$lt", Value: 9}}}},
			D{{Key: "$inc", Value: D{{Key: "count", Value: 1}}}, {Key: "$currentDate", Value: D{{Key: "at", Value: true}}}},
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&out)
		return out, err
	})
	probe("$pull", func() (any, error) {
		if _, err := c.UpdateOne(ctx, D{{Key: "_id", Value: 1}}, D{{Key: "$push", Value: D{{Key: "h", Value: D{{Key: "t", Value: "a"}}}}}}); err != nil {
			return nil, err
		}
		return c.UpdateOne(ctx, D{{Key: "_id", Value: 1}}, D{{Key: "$pull", Value: D{{Key: "h", Value: D{{Key: "t", Value: "a"}}}}}})
	})
	probe("$addToSet", func() (any, error) {
		return c.UpdateOne(ctx, D{{Key: "_id", Value: 1}}, D{{Key: "$addToSet", Value: D{{Key: "s", Value: "a"}}}})
	})
	probe("$unset + $min + $max", func() (any, error) {
		return c.UpdateOne(ctx, D{{Key: "_id", Value: 1}}, D{{Key: "$unset", Value: D{{Key: "s", Value: ""}}}, {Key: "$min", Value: D{{Key: "lo", Value: 1}}}, {Key: "$max", Value: D{{Key: "hi", Value: 1}}}})
	})
	probe("TTL index", func() (any, error) {
		return c.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D{{Key: "at", Value: 1}}, Options: options.Index().SetExpireAfterSeconds(60)})
	})
	probe("partial index", func() (any, error) {
		return c.Indexes().CreateOne(ctx, mongo.IndexModel{Keys: D{{Key: "pp", Value: 1}}, Options: options.Index().SetPartialFilterExpression(D{{Key: "pp", Value: D{{Key: "$exists", Value: true}}}})})
	})
	probe("bulkWrite unordered", func() (any, error) {
		return c.BulkWrite(ctx, []mongo.WriteModel{
			mongo.NewUpdateOneModel().SetFilter(D{{Key: "_id", Value: 1}}).SetUpdate(D{{Key: "$inc", Value: D{{Key: "count", Value: 1}}}}),
			mongo.NewUpdateOneModel().SetFilter(D{{Key: "_id", Value: 2}}).SetUpdate(D{{Key: "$inc", Value: D{{Key: "count", Value: 1}}}}),
		}, options.BulkWrite().SetOrdered(false))
	})
	probe("aggregate $match $group $sum field", func() (any, error) {
		cur, err := c.Aggregate(ctx, mongo.Pipeline{
			{{Key: "$match", Value: D{{Key: "count", Value: D{{Key: "$gt", Value: 0}}}}}},
			{{Key: "$group", Value: D{{Key: "_id", Value: nil}, {Key: "total", Value: D{{Key: "$sum", Value: "$count"}}}}}},
		})
		if err != nil {
			return nil, err
		}
		var out []bson.M
		return out, cur.All(ctx, &out)
	})
	probe("aggregate $lookup", func() (any, error) {
		cur, err := c.Aggregate(ctx, mongo.Pipeline{
			{{Key: "$lookup", Value: D{{Key: "from", Value: "p"}, {Key: "localField", Value: "_id"}, {Key: "foreignField", Value: "_id"}, {Key: "as", Value: "j"}}}},
		})
		if err != nil {
			return nil, err
		}
		var out []bson.M
		return len(out), cur.All(ctx, &out)
	})
	probe("transaction", func() (any, error) {
		s, err := db.Client().StartSession()
		if err != nil {
			return nil, err
		}
		defer s.EndSession(ctx)
		return s.WithTransaction(ctx, func(ctx context.Context) (any, error) {
			return c.UpdateOne(ctx, D{{Key: "_id", Value: 1}}, D{{Key: "$inc", Value: D{{Key: "count", Value: 1}}}})
		})
	})
	probe("serverStatus localTime", func() (any, error) {
		var out bson.M
		err := db.Client().Database("admin").RunCommand(ctx, D{{Key: "serverStatus", Value: 1}}).Decode(&out)
		return out["localTime"], err
	})
	probe("countDocuments with filter", func() (any, error) {
		return c.CountDocuments(ctx, D{{Key: "count", Value: D{{Key: "$gte", Value: 1}}}})
	})
	probe("find sort+limit+projection", func() (any, error) {
		cur, err := c.Find(ctx, D{}, options.Find().SetSort(D{{Key: "count", Value: -1}}).SetLimit(1).SetProjection(D{{Key: "count", Value: 1}}))
		if err != nil {
			return nil, err
		}
		var out []bson.M
		return out, cur.All(ctx, &out)
	})
	probe("dropDatabase", func() (any, error) {
		return nil, db.Client().Database("probes_drop").Drop(ctx)
	})
}
