package main

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// TestAwaitDataGetMoreDoesNotHoldTheLock tails a capped collection with an awaitData cursor
// whose getMore may wait 30 s, and writes to it from another client while that getMore waits.
// Under the one-command-at-a-time lock the write would queue behind the getMore until its
// await ran out (the write's 10 s bound fails first); without it, the write goes through and
// the waiting getMore returns the new document.
func TestAwaitDataGetMoreDoesNotHoldTheLock(t *testing.T) {
	ctx := context.Background()
	started := make(chan struct{}, 16)
	mon := &event.CommandMonitor{Started: func(_ context.Context, e *event.CommandStartedEvent) {
		if e.CommandName == "getMore" {
			started <- struct{}{}
		}
	}}
	tailer, err := mongo.Connect(options.Client().ApplyURI(proxyURI).SetMonitor(mon))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = tailer.Disconnect(context.Background()) })
	writer := connect(t, proxyURI)

	db := dbName("await")
	if err := writer.Database(db).CreateCollection(ctx, "events",
		options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<16).SetMaxDocuments(16)); err != nil {
		t.Fatal(err)
	}
	events := writer.Database(db).Collection("events")
	// FerretDB closes a tailable cursor whose first batch is short: start on one document.
	if _, err := events.InsertOne(ctx, bson.D{{Key: "n", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	cur, err := tailer.Database(db).Collection("events").Find(ctx, bson.D{},
		options.Find().SetCursorType(options.TailableAwait).SetBatchSize(1).SetMaxAwaitTime(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cur.Close(context.Background()) })
	if cur.RemainingBatchLength() != 1 || cur.ID() == 0 {
		t.Fatalf("first batch %d documents, cursor %d: want 1 and an open cursor", cur.RemainingBatchLength(), cur.ID())
	}
	cur.Next(ctx) // the first document, from the first batch

	got := make(chan bson.Raw, 1)
	go func() {
		if cur.Next(ctx) { // a getMore that waits for data
			got <- cur.Current
		}
		close(got)
	}()
	<-started
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if _, err := events.InsertOne(wctx, bson.D{{Key: "n", Value: 1}}); err != nil {
		t.Fatalf("insert while a getMore awaits data: %v", err)
	}
	doc, ok := <-got
	if !ok {
		t.Fatalf("tailing cursor ended: %v", cur.Err())
	}
	if n := doc.Lookup("n").Int32(); n != 1 {
		t.Fatalf("tailed document n = %d, want 1", n)
	}
}

// TestAwaitDataGetMoreTimesOutEmpty: with no insert, a parked awaitData getMore answers an
// empty batch once its maxTimeMS is up, and the cursor stays open.
func TestAwaitDataGetMoreTimesOutEmpty(t *testing.T) {
	ctx := context.Background()
	c := connect(t, proxyURI)
	db := dbName("awaitempty")
	if err := c.Database(db).CreateCollection(ctx, "events",
		options.CreateCollection().SetCapped(true).SetSizeInBytes(1<<16).SetMaxDocuments(16)); err != nil {
		t.Fatal(err)
	}
	events := c.Database(db).Collection("events")
	if _, err := events.InsertOne(ctx, bson.D{{Key: "n", Value: 0}}); err != nil {
		t.Fatal(err)
	}
	cur, err := events.Find(ctx, bson.D{},
		options.Find().SetCursorType(options.TailableAwait).SetBatchSize(1).SetMaxAwaitTime(200*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cur.Close(context.Background()) })
	cur.Next(ctx)
	if cur.TryNext(ctx) {
		t.Fatalf("got %v, want an empty batch", cur.Current)
	}
	if cur.Err() != nil || cur.ID() == 0 {
		t.Fatalf("cursor after an empty await: err %v, id %d; want open", cur.Err(), cur.ID())
	}
	if _, err := events.InsertOne(ctx, bson.D{{Key: "n", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	if !cur.Next(ctx) || cur.Current.Lookup("n").Int32() != 1 {
		t.Fatalf("next after an insert: %v %v", cur.Current, cur.Err())
	}
}

// TestMonitoringDoesNotWaitForTheLock: hello answers while another command holds the
// exchange lock. Queued behind it, they would inflate the driver's round-trip estimate, and
// with it shrink the maxTimeMS the driver puts on every command until FerretDB interrupts
// ordinary writes.
func TestMonitoringDoesNotWaitForTheLock(t *testing.T) {
	p := newProxy(strings.TrimSuffix(strings.TrimPrefix(backendURI, "mongodb://"), "/"),
		slog.New(slog.NewTextHandler(io.Discard, nil)))
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go p.serve(ln)
	t.Cleanup(func() { _ = ln.Close() })
	uri := "mongodb://" + ln.Addr().String() + "/?directConnection=true"
	c := connect(t, uri)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.Ping(ctx, nil); err != nil { // connected and handshaken before the lock is taken
		t.Fatal(err)
	}

	p.exchange.Lock() // a long command in flight
	defer p.exchange.Unlock()
	pctx, pcancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer pcancel()
	var hello bson.M
	if err := c.Database("admin").RunCommand(pctx, bson.D{{Key: "hello", Value: 1}}).Decode(&hello); err != nil {
		t.Errorf("hello while another command holds the lock: %v", err)
	}
}

// TestSlowCommandsAreLogged: a command that holds the store longer than --slow-command is
// logged with its name and collection (a getMore's too); with the threshold at 0 nothing is.
func TestSlowCommandsAreLogged(t *testing.T) {
	for _, tc := range []struct {
		slow time.Duration
		want bool
	}{{time.Nanosecond, true}, {0, false}} {
		var log syncBuffer
		p := newProxy(strings.TrimSuffix(strings.TrimPrefix(backendURI, "mongodb://"), "/"),
			slog.New(slog.NewTextHandler(&log, &slog.HandlerOptions{Level: slog.LevelInfo})))
		p.slow = tc.slow
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go p.serve(ln)
		t.Cleanup(func() { _ = ln.Close() })
		c := connect(t, "mongodb://"+ln.Addr().String()+"/?directConnection=true")
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		coll := c.Database(t.Name()).Collection("slowlog")
		if err := coll.Drop(ctx); err != nil { // the other case's documents
			t.Fatal(err)
		}
		if _, err := coll.InsertMany(ctx, []any{bson.D{{Key: "n", Value: 1}}, bson.D{{Key: "n", Value: 2}}}); err != nil {
			t.Fatal(err)
		}
		cur, err := coll.Find(ctx, bson.D{}, options.Find().SetBatchSize(1))
		if err != nil {
			t.Fatal(err)
		}
		var docs []bson.M
		if err := cur.All(ctx, &docs); err != nil || len(docs) != 2 { // the second comes by getMore
			t.Fatalf("find: %v, %d documents", err, len(docs))
		}
		for _, cmd := range []string{"insert", "getMore"} {
			got := strings.Contains(log.String(), `msg="slow command" command=`+cmd+` target=slowlog`)
			if got != tc.want {
				t.Errorf("threshold %v: %s logged as slow = %t, want %t; log:\n%s", tc.slow, cmd, got, tc.want, log.String())
			}
		}
	}
}

// syncBuffer is a bytes.Buffer for a logger written from the proxy's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
