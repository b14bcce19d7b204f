package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
	"go.mongodb.org/mongo-driver/v2/mongo/writeconcern"
)

// proxyURI and backendURI are set by TestMain: one server for the whole package.
var proxyURI, backendURI string

var dbSeq atomic.Int64

// dbName returns a database name unique within this test binary (so that -count=N works).
func dbName(base string) string { return fmt.Sprintf("%s_%d", base, dbSeq.Add(1)) }

func TestMain(m *testing.M) {
	ctx, cancel := context.WithCancel(context.Background())
	level := slog.LevelWarn
	if os.Getenv("MONGODEV_DEBUG") != "" {
		level = slog.LevelDebug
	}
	logger := slog.New(&quietHandler{slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})})

	type addrs struct{ proxy, backend string }
	readyc := make(chan addrs, 1)
	errc := make(chan error, 1)
	start := time.Now()
	go func() {
		errc <- serve(ctx, func() {}, "127.0.0.1:0", "", 0, logger, func(p, b string) { readyc <- addrs{p, b} })
	}()
	select {
	case a := <-readyc:
		proxyURI = "mongodb://" + a.proxy + "/"
		backendURI = "mongodb://" + a.backend + "/"
		fmt.Fprintf(os.Stderr, "mongodev ready in %v\n", time.Since(start).Round(time.Millisecond))
	case err := <-errc:
		fmt.Fprintf(os.Stderr, "mongodev: %v\n", err)
		os.Exit(1)
	case <-time.After(60 * time.Second):
		fmt.Fprintln(os.Stderr, "mongodev: not ready within 60s")
		os.Exit(1)
	}

	code := m.Run()

	cancel()
	select {
	case err := <-errc:
		if err != nil {
			fmt.Fprintf(os.Stderr, "mongodev: %v\n", err)
			code = 1
		}
	case <-time.After(20 * time.Second):
		fmt.Fprintln(os.Stderr, "mongodev: did not stop within 20s")
		code = 1
	}
	os.Exit(code)
}

// connect returns a client for uri, disconnected at the end of the test; wc, if any, is its
// write concern.
func connect(t testing.TB, uri string, wc ...*writeconcern.WriteConcern) *mongo.Client {
	t.Helper()
	o := options.Client().ApplyURI(uri).SetTimeout(30 * time.Second)
	if len(wc) > 0 {
		o.SetWriteConcern(wc[0])
	}
	c, err := mongo.Connect(o)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Disconnect(context.Background()) })
	return c
}

// conditionalInc runs 32 concurrent updateOne({_id: "c", count: {$lt: 3}}, {$inc: {count: 1}})
// from 4 clients and returns the final count and the number of updates that modified.
func conditionalInc(t *testing.T, uri, db string) (final int32, modified int64) {
	t.Helper()
	ctx := context.Background()
	clients := make([]*mongo.Client, 4)
	for i := range clients {
		clients[i] = connect(t, uri)
	}
	coll := clients[0].Database(db).Collection("counters")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "c"}, {Key: "count", Value: int32(0)}}); err != nil {
		t.Fatal(err)
	}

	var wg sync.WaitGroup
	var nModified atomic.Int64
	errs := make(chan error, 32)
	start := make(chan struct{})
	for i := range 32 {
		wg.Go(func() {
			<-start
			c := clients[i%len(clients)].Database(db).Collection("counters")
			res, err := c.UpdateOne(ctx,
				bson.D{{Key: "_id", Value: "c"}, {Key: "count", Value: bson.D{{Key: "$lt", Value: 3}}}},
				bson.D{{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}}})
			if err != nil {
				errs <- err
				return
			}
			nModified.Add(res.ModifiedCount)
		})
	}
	close(start)
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}

	var doc struct {
		Count int32 `bson:"count"`
	}
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "c"}}).Decode(&doc); err != nil {
		t.Fatal(err)
	}
	return doc.Count, nModified.Load()
}

// TestSerializedConditionalInc checks that conditional $inc updates do not overbook through
// the proxy (they do against FerretDB directly, which is why the proxy serializes).
func TestSerializedConditionalInc(t *testing.T) {
	for round := range 3 {
		final, modified := conditionalInc(t, proxyURI, dbName("serial"))
		if final != 3 || modified != 3 {
			t.Fatalf("round %d through the proxy: final count %d, %d updates modified; want 3 and 3", round, final, modified)
		}
	}
}

// TestDirectBackendForReference logs what the same workload does against FerretDB without
// the proxy; it asserts nothing, as the race is timing-dependent.
func TestDirectBackendForReference(t *testing.T) {
	if testing.Short() {
		t.Skip("reference only")
	}
	final, modified := conditionalInc(t, backendURI, dbName("direct"))
	t.Logf("directly against FerretDB: final count %d, %d updates modified (3 and 3 would be correct)", final, modified)
}

// TestUnacknowledgedWrite sends w:0 writes (OP_MSG with moreToCome: no reply) and checks
// that the proxy neither waits for a reply nor desynchronizes the connection.
func TestUnacknowledgedWrite(t *testing.T) {
	ctx := context.Background()
	c := connect(t, proxyURI, writeconcern.Unacknowledged())
	coll := c.Database(dbName("unack")).Collection("docs")
	for i := range 5 {
		start := time.Now()
		if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: i}}); err != nil {
			t.Fatal(err)
		}
		if d := time.Since(start); d > 5*time.Second {
			t.Fatalf("unacknowledged insert took %v", d)
		}
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		n, err := coll.CountDocuments(ctx, bson.D{})
		if err != nil {
			t.Fatal(err)
		}
		if n == 5 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("count = %d, want 5", n)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClientDisconnect checks that a client vanishing (even mid-message) neither breaks other
// clients nor leaks the global lock.
func TestClientDisconnect(t *testing.T) {
	ctx := context.Background()
	addr := proxyURI[len("mongodb://") : len(proxyURI)-1]

	// A raw connection that sends half a header and goes away.
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Write([]byte{0x40, 0, 0, 0, 1, 0}); err != nil {
		t.Fatal(err)
	}
	_ = raw.Close()

	// A raw connection that pings, then closes without reading the reply.
	raw, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Write(pingMessage(7)); err != nil {
		t.Fatal(err)
	}
	_ = raw.Close()

	// A raw ping that reads its reply.
	raw, err = net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw.Close() }()
	_ = raw.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := raw.Write(pingMessage(8)); err != nil {
		t.Fatal(err)
	}
	resp, err := readMessage(raw)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkOK(resp); err != nil {
		t.Fatal(err)
	}

	// Driver clients that disconnect while others keep working.
	for range 3 {
		c := connect(t, proxyURI)
		if err := c.Ping(ctx, nil); err != nil {
			t.Fatal(err)
		}
		if err := c.Disconnect(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := connect(t, proxyURI).Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}

	// A request longer than the limit closes that connection only.
	raw2, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = raw2.Close() }()
	_ = raw2.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := raw2.Write([]byte{0xff, 0xff, 0xff, 0x7f, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0x07, 0, 0}); err != nil {
		t.Fatal(err)
	}
	if _, err := raw2.Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
		t.Fatalf("oversized message: read = %v, want EOF", err)
	}
}

// TestPersistentDir checks that --dir keeps data across restarts (and is kept on exit).
func TestPersistentDir(t *testing.T) {
	dir := t.TempDir()
	logger := slog.New(&quietHandler{slog.NewTextHandler(io.Discard, nil)})
	ctx := context.Background()
	for round := range 2 {
		sctx, cancel := context.WithCancel(ctx)
		readyc := make(chan string, 1)
		errc := make(chan error, 1)
		go func() {
			errc <- serve(sctx, func() {}, "127.0.0.1:0", dir, 0, logger, func(p, _ string) { readyc <- p })
		}()
		var addr string
		select {
		case addr = <-readyc:
		case err := <-errc:
			t.Fatal(err)
		}
		c := connect(t, "mongodb://"+addr+"/")
		coll := c.Database("persist").Collection("c")
		if round == 0 {
			if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "kept"}}); err != nil {
				t.Fatal(err)
			}
		} else if n, err := coll.CountDocuments(ctx, bson.D{{Key: "_id", Value: "kept"}}); err != nil || n != 1 {
			t.Fatalf("after restart: count %d, %v", n, err)
		}
		_ = c.Disconnect(ctx)
		cancel()
		if err := <-errc; err != nil {
			t.Fatal(err)
		}
		if entries, err := os.ReadDir(dir); err != nil || len(entries) == 0 {
			t.Fatalf("data directory after stop: %v entries, %v", len(entries), err)
		}
	}
}
