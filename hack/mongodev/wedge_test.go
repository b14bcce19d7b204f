package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestStoreSurvivesTailersAndCutClients runs the lease store's traffic on a fresh database
// under a CPU hog: first writes from several clients at once, tailing awaitData cursors on
// a capped collection (woken by every insert), and clients whose commands are cut by short
// deadlines or by closing their connections mid-command. Every write from a client that
// waits for its answer must succeed, during the churn and after it.
//
// Before the fix, an awaitData getMore reached FerretDB with a maxTimeMS, which FerretDB
// turns into a context deadline on its SQLite queries. The SQLite driver (modernc.org/sqlite
// v1.32.0) drops, without resetting it, a statement that has already returned a row when
// that deadline ends during the query call: the pooled connection keeps an open read
// transaction on a snapshot that never moves again (and, when sqlite3_interrupt landed
// after the first step, a pending interrupt). Every later write on that connection fails
// with "database is locked (517)" (SQLITE_BUSY_SNAPSHOT) or "interrupted (9)", and the
// pool, which hands out the most recently returned connection first, gives it to nearly
// every command: the store is wedged for good.
func TestStoreSurvivesTailersAndCutClients(t *testing.T) {
	ctx := context.Background()
	db := dbName("wedge")

	stop := make(chan struct{})
	var hogs sync.WaitGroup
	for range 1 {
		hogs.Go(func() {
			for n := 0; ; n++ {
				if n%1024 == 0 {
					select {
					case <-stop:
						return
					default:
					}
				}
			}
		})
	}
	defer hogs.Wait()
	defer close(stop)

	setup := connect(t, proxyURI).Database(db)
	if err := setup.CreateCollection(ctx, "events",
		options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<20).SetMaxDocuments(1000)); err != nil {
		t.Fatal(err)
	}
	// FerretDB closes a tailable cursor whose first batch is short: start on one document.
	if _, err := setup.Collection("events").InsertOne(ctx, bson.D{{Key: "n", Value: -1}}); err != nil {
		t.Fatal(err)
	}

	var (
		tailers  sync.WaitGroup
		writerWG sync.WaitGroup
		mu       sync.Mutex
		failures []string
		done     atomic.Bool // the writers have finished: the tailers stop
	)
	fail := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		if len(failures) < 10 {
			failures = append(failures, fmt.Sprintf(format, args...))
		}
	}

	// Tailers: the lease store's wake-up cursor, with a short await so that getMores
	// end by their time limit as well as by inserts.
	for i := range 3 {
		c := connect(t, proxyURI)
		tailers.Go(func() {
			cur, err := c.Database(db).Collection("events").Find(ctx, bson.D{},
				options.Find().SetCursorType(options.TailableAwait).SetBatchSize(1).SetMaxAwaitTime(20*time.Millisecond))
			if err != nil {
				fail("tailer %d: find: %v", i, err)
				return
			}
			defer func() { _ = cur.Close(ctx) }()
			for !done.Load() {
				if !cur.TryNext(ctx) && cur.Err() != nil {
					fail("tailer %d: getMore: %v", i, cur.Err())
					return
				}
			}
		})
	}

	// Writers that wait for their answers: first writes on the fresh database at once,
	// then a holder insert, a conditional increment and an event, as the lease store does.
	const writers, rounds = 4, 12
	start := make(chan struct{})
	for w := range writers {
		c := connect(t, proxyURI).Database(db)
		writerWG.Go(func() {
			<-start
			for r := range rounds {
				id := fmt.Sprintf("w%d-%d", w, r)
				if _, err := c.Collection("holders").InsertOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
					fail("writer %d round %d: insert holder: %v", w, r, err)
				}
				if _, err := c.Collection("counters").UpdateOne(ctx,
					bson.D{{Key: "_id", Value: "c"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 1 << 30}}}},
					bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}},
					options.UpdateOne().SetUpsert(true)); err != nil && !mongo.IsDuplicateKeyError(err) {
					fail("writer %d round %d: increment: %v", w, r, err)
				}
				if r%3 == 0 {
					if _, err := c.Collection("events").InsertOne(ctx, bson.D{{Key: "n", Value: r}}); err != nil {
						fail("writer %d round %d: insert event: %v", w, r, err)
					}
				}
				if _, err := c.Collection("holders").DeleteOne(ctx, bson.D{{Key: "_id", Value: id}}); err != nil {
					fail("writer %d round %d: delete holder: %v", w, r, err)
				}
			}
		})
	}

	// Clients that give up: deadlines shorter than a command, and connections closed while
	// their commands are in flight. Their own errors are expected; they must not break the
	// store for anyone else.
	var cutters sync.WaitGroup
	for k := range 2 {
		cutters.Go(func() {
			<-start
			for r := range rounds {
				c, err := mongo.Connect(options.Client().ApplyURI(proxyURI).SetTimeout(30 * time.Second))
				if err != nil {
					continue
				}
				coll := c.Database(db).Collection("holders")
				cctx, cancel := context.WithTimeout(ctx, time.Duration(r%5)*time.Millisecond)
				_, _ = coll.InsertOne(cctx, bson.D{{Key: "_id", Value: fmt.Sprintf("cut%d-%d", k, r)}})
				cancel()
				inflight := make(chan struct{})
				go func() {
					close(inflight)
					_, _ = coll.UpdateMany(ctx, bson.D{}, bson.D{{Key: "$set", Value: bson.D{{Key: "seen", Value: r}}}})
				}()
				<-inflight
				_ = c.Disconnect(ctx)
			}
		})
	}

	close(start)
	// Every command is bounded by its client's 30 s timeout, so these waits end.
	cutters.Wait()
	writerWG.Wait()
	done.Store(true)
	tailers.Wait()

	// After the churn: a fresh client's writes all succeed.
	after := connect(t, proxyURI).Database(db).Collection("after")
	for i := range 20 {
		if _, err := after.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			fail("after the churn: insert %d: %v", i, err)
		}
		if _, err := after.UpdateOne(ctx, bson.D{{Key: "_id", Value: i}}, bson.D{{Key: "$set", Value: bson.D{{Key: "x", Value: 1}}}}); err != nil {
			fail("after the churn: update %d: %v", i, err)
		}
	}

	if len(failures) > 0 {
		t.Fatalf("the store failed writes:\n%s", strings.Join(failures, "\n"))
	}
}
