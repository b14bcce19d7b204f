package main

import (
	"context"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestCappedCollectionsKeepTheirSize: a capped collection holds at most its maximum (plus the
// inserts between two trims) however many documents go in, whether it was created through the
// proxy or straight on the backend (then the proxy asks at the first insert); a tailable
// cursor opened before keeps reading every new document across the trims; an uncapped
// collection keeps everything.
func TestCappedCollectionsKeepTheirSize(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	c := connect(t, proxyURI)
	direct := connect(t, backendURI)
	db := dbName("capped")
	const max, n = 4, 60
	opts := options.CreateCollection().SetCapped(true).SetSizeInBytes(1 << 20).SetMaxDocuments(max)
	if err := c.Database(db).CreateCollection(ctx, "viaproxy", opts); err != nil {
		t.Fatal(err)
	}
	if err := direct.Database(db).CreateCollection(ctx, "direct", opts); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"viaproxy", "direct"} {
		coll := c.Database(db).Collection(name)
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "n", Value: -1}}); err != nil {
			t.Fatal(err)
		}
		cur, err := coll.Find(ctx, bson.D{}, options.Find().SetCursorType(options.Tailable).SetBatchSize(1))
		if err != nil {
			t.Fatal(err)
		}
		if !cur.Next(ctx) {
			t.Fatalf("%s: tailable cursor: %v", name, cur.Err())
		}
		next := 0
		for i := range n {
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "n", Value: i}}); err != nil {
				t.Fatal(err)
			}
			if i%3 == 2 { // read now and then, so that trims happen between reads
				for cur.TryNext(ctx) {
					if got := int(cur.Current.Lookup("n").Int32()); got != next {
						t.Fatalf("%s: tailed n = %d, want %d", name, got, next)
					}
					next++
				}
			}
		}
		for next < n && cur.TryNext(ctx) {
			next++
		}
		if next != n || cur.Err() != nil {
			t.Errorf("%s: the tailable cursor read %d of %d new documents (%v)", name, next, n, cur.Err())
		}
		_ = cur.Close(ctx)
		count, err := coll.CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if count > max+trimEvery {
			t.Errorf("%s: %d documents after %d inserts, want at most %d (max %d)", name, count, n+1, max+trimEvery, max)
		}
	}
	plain := c.Database(db).Collection("plain")
	for i := range 2 * trimEvery {
		if _, err := plain.InsertOne(ctx, bson.D{{Key: "n", Value: i}}); err != nil {
			t.Fatal(err)
		}
	}
	if count, err := plain.CountDocuments(ctx, bson.D{}); err != nil || count != 2*trimEvery {
		t.Errorf("uncapped collection: %d documents (%v), want %d", count, err, 2*trimEvery)
	}
}
