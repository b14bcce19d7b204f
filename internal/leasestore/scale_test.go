package leasestore_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// fillHolders writes n holders of resource "r" spread over the given number of tenants
// straight into the database (as many acquisitions would, much faster), each booking the
// global and its tenant's counter, and those counters with their entries. Holders are
// from pods pod-0 ... pod-99 in namespace ns, with a TTL of an hour.
func fillHolders(t testing.TB, uri, db string, n, tenants int) {
	t.Helper()
	ctx := context.Background()
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(ctx) }()
	holders := c.Database(db).Collection(leasestore.HoldersCollection)
	now := time.Now().UTC()
	global := lease.CounterKey("r", lease.LevelGlobal, "*")
	perTenant := map[string]bson.D{}
	all := bson.D{}
	const chunk = 1000
	for start := 0; start < n; start += chunk {
		var docs []any
		for i := start; i < min(start+chunk, n); i++ {
			tenant := fmt.Sprintf("t%04d", i%tenants)
			tkey := lease.CounterKey("r", lease.LevelTenant, tenant)
			perTenant[tenant] = append(perTenant[tenant], bson.E{Key: lease.HolderID(holderToken(i)), Value: bson.D{}})
			all = append(all, bson.E{Key: lease.HolderID(holderToken(i)), Value: bson.D{}})
			docs = append(docs, bson.D{
				{Key: "_id", Value: holderToken(i)}, {Key: "pid", Value: lease.HolderID(holderToken(i))}, {Key: "state", Value: "HELD"},
				{Key: "leaseName", Value: "r"}, {Key: "resource", Value: "r"}, {Key: "type", Value: "tex"},
				{Key: "tenant", Value: tenant}, {Key: "project", Value: "p"}, {Key: "user", Value: "u"},
				{Key: "holderRef", Value: "job"},
				{Key: "pod", Value: bson.D{{Key: "namespace", Value: "ns"}, {Key: "name", Value: fmt.Sprintf("pod-%d", i%100)}, {Key: "uid", Value: fmt.Sprintf("uid-%d", i%100)}}},
				{Key: "podBound", Value: true}, {Key: "payload", Value: bson.D{}}, {Key: "ttlSeconds", Value: 3600.0},
				{Key: "levels", Value: bson.A{tkey, global}}, {Key: "keys", Value: bson.A{tkey, global}},
				{Key: "acquiredAt", Value: now}, {Key: "lastSeenAt", Value: now},
			})
		}
		if _, err := holders.InsertMany(ctx, docs); err != nil {
			t.Fatalf("filling holders: %v", err)
		}
	}
	old := now.Add(-time.Hour) // outside any safety margin
	counters := []any{bson.D{{Key: "_id", Value: global}, {Key: "resource", Value: "r"}, {Key: "level", Value: "global"},
		{Key: "scope", Value: "*"}, {Key: "tenant", Value: ""}, {Key: "count", Value: n}, {Key: "slots", Value: all}, {Key: "updatedAt", Value: old}}}
	for tenant, slots := range perTenant {
		counters = append(counters, bson.D{{Key: "_id", Value: lease.CounterKey("r", lease.LevelTenant, tenant)},
			{Key: "resource", Value: "r"}, {Key: "level", Value: "tenant"}, {Key: "scope", Value: tenant},
			{Key: "tenant", Value: tenant}, {Key: "count", Value: len(slots)}, {Key: "slots", Value: slots}, {Key: "updatedAt", Value: old}})
	}
	if _, err := c.Database(db).Collection(leasestore.CountersCollection).InsertMany(ctx, counters); err != nil {
		t.Fatalf("filling counters: %v", err)
	}
}

// holderToken is the token of fillHolders' holder i.
func holderToken(i int) string { return fmt.Sprintf("%032x", i+1) }

// largestCommand is how long the store takes now to answer a read of the global counter that
// fillHolders wrote, its largest document.
func largestCommand(t testing.TB, uri, db string) time.Duration {
	t.Helper()
	ctx := ctxT(t)
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(ctx) }()
	began := time.Now()
	if err := c.Database(db).Collection(leasestore.CountersCollection).FindOne(ctx,
		bson.D{{Key: "_id", Value: lease.CounterKey("r", lease.LevelGlobal, "*")}}).Err(); err != nil {
		t.Fatal(err)
	}
	return time.Since(began)
}

// TestReconcileStreamsALargeStore: reconcile of a store with many holders reads them in
// batches, each command with its own deadline, so an operation timeout far shorter than
// reading everything at once does not fail it; with an entry of a gone holder, it repairs.
func TestReconcileStreamsALargeStore(t *testing.T) {
	if testing.Short() {
		t.Skip("fills the store")
	}
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	// The global counter holds 20 000 entries (about 700 kB): one batch of counters carries
	// it, the largest single command of the pass; the holders alone would take many seconds
	// to read at once. The operation timeout is 3 s, or twice that largest command as
	// the store answers it now when a starved machine makes it slower: what is tested is that
	// no command reads more than a batch, not the machine's speed.
	const n, tenants = 20000, 1000
	newStoreAt(t, uri, db) // the indexes, on the empty store
	fillHolders(t, uri, db, n, tenants)
	timeout := max(3*time.Second, 2*largestCommand(t, uri, db))
	t.Logf("operation timeout %v", timeout)
	s, err := leasestore.Connect(uri, db, leasestore.WithOpTimeout(timeout), leasestore.WithSafetyMargin(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close(context.Background()) })
	// An entry whose holder is gone: reconcile removes it.
	if err := storetest.LateEntry(ctxT(t), uri, db, lease.CounterKey("r", lease.LevelTenant, "t0007"), "lh-00000000000000000000dead"); err != nil {
		t.Fatal(err)
	}

	res, err := s.Reconcile(ctxT(t))
	if err != nil {
		t.Fatalf("reconcile of %d holders with a %v operation timeout: %v", n, timeout, err)
	}
	if want := (leasestore.ReconcileResult{Repaired: 1, Corrected: 1}); res != want {
		t.Errorf("reconcile = %+v, want %+v", res, want)
	}
}

// TestStreamingReadsHoldTheStoreBriefly: the reads of the scheduled sweep (idle sweep, pod
// scan, reconcile) come in small batches, so that on the development store, which runs one
// command at a time, an acquisition's round trip never waits behind a long one (issue 17:
// acquire p99 at 10 000 holders).
func TestStreamingReadsHoldTheStoreBriefly(t *testing.T) {
	const n, maxPerCommand = 300, 64
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	var mu sync.Mutex
	most := map[string]int{}
	s := newStoreAt(t, uri, db, leasestore.WithReplyObserver(func(cmd string, docs int) {
		mu.Lock()
		defer mu.Unlock()
		most[cmd] = max(most[cmd], docs)
	}))
	fillHolders(t, uri, db, n, 10)
	for name, run := range map[string]func() error{
		"idle sweep": func() error { _, err := s.ReapIdle(ctxT(t), ""); return err },
		"sweep round": func() error {
			r, err := s.SweepRound(ctxT(t))
			if err == nil {
				_, err = s.ReconcileRound(ctxT(t), r)
			}
			return err
		},
		"reconcile": func() error { _, err := s.Reconcile(ctxT(t)); return err },
	} {
		mu.Lock()
		clear(most)
		mu.Unlock()
		if err := run(); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		mu.Lock()
		for cmd, docs := range most {
			if docs > maxPerCommand {
				t.Errorf("%s: a %s reply carried %d documents, want at most %d per command", name, cmd, docs, maxPerCommand)
			}
		}
		mu.Unlock()
	}
}

// TestSweepRoundReadsEachHolderOnce: the scheduled sweep's round serves its three uses from
// one read of the holders: it reaps the idle holder, lists every holder pod, and its reconcile
// removes an entry whose holder is gone without looking up the holders it has seen. Across the round and its
// reconcile the store returns each holder and each counter once (three reads of the holders,
// as the idle reap, the pod scan and reconcile each made before, return three times as many).
func TestSweepRoundReadsEachHolderOnce(t *testing.T) {
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatal(err)
	}
	db := mongotest.DatabaseName(t)
	var read atomic.Int64
	s := newStoreAt(t, uri, db, leasestore.WithSafetyMargin(time.Minute), leasestore.WithReplyObserver(func(cmd string, docs int) {
		if cmd == "find" || cmd == "getMore" {
			read.Add(int64(docs))
		}
	}))
	const n, tenants = 300, 10
	fillHolders(t, uri, db, n, tenants)
	idleID := setHolderLastSeen(t, uri, db, 0, time.Now().Add(-2*time.Hour)) // tenant t0000
	if err := storetest.LateEntry(ctxT(t), uri, db, lease.CounterKey("r", lease.LevelTenant, "t0007"), "lh-00000000000000000000dead"); err != nil {
		t.Fatal(err)
	}

	read.Store(0)
	round, err := s.SweepRound(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(round.Idle) != 1 || round.Idle[0].Token != idleID {
		t.Errorf("reaped %v, want the idle holder %s alone", tokens(round.Idle), idleID)
	}
	if len(round.Pods) != 100 {
		t.Errorf("the round lists %d holder pods, want 100 (pod-0 ... pod-99)", len(round.Pods))
	}
	res, err := s.ReconcileRound(ctxT(t), round)
	if err != nil {
		t.Fatal(err)
	}
	// The late entry goes; nothing else is written.
	if res.Repaired != 1 || res.Corrected != 1 || res.Deleted != 0 {
		t.Errorf("reconcile after the round = %+v, want the late entry removed and nothing else written", res)
	}
	// Holders and counters once each (1 global + 9 tenant counters were there to read), and
	// the few documents that reading the server's time and the reap's writes return.
	const slack = 10
	if got, want := read.Load(), int64(n+tenants); got > want+slack {
		t.Errorf("the round and its reconcile read %d documents, want about %d (each holder and counter once)", got, want)
	}

	counters, err := s.ListCounters(ctxT(t), leasestore.CounterFilter{Tenant: "t0007"})
	if err != nil {
		t.Fatal(err)
	}
	if len(counters) != 1 || counters[0].Count != n/tenants || len(counters[0].Gone) != 0 {
		t.Errorf("t0007's counters after reconcile = %+v, want one of count %d", counters, n/tenants)
	}
	// A round whose read failed reconciles nothing.
	if _, err := s.ReconcileRound(ctxT(t), leasestore.Round{}); err == nil {
		t.Error("reconcile of a round that read no holders succeeded, want an error")
	}
}

// setHolderLastSeen sets the lastSeenAt of fillHolders' holder i and returns its token.
func setHolderLastSeen(t *testing.T, uri, db string, i int, at time.Time) string {
	t.Helper()
	c, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(context.Background()) }()
	id := holderToken(i)
	r, err := c.Database(db).Collection(leasestore.HoldersCollection).UpdateOne(context.Background(),
		bson.D{{Key: "_id", Value: id}}, bson.D{{Key: "$set", Value: bson.D{{Key: "lastSeenAt", Value: at}}}})
	if err != nil || r.MatchedCount != 1 {
		t.Fatalf("setting lastSeenAt of %s: %v, %+v", id, err, r)
	}
	return id
}
