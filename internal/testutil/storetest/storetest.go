// Package storetest opens lease stores for tests: a fresh database on the test MongoDB
// (internal/testutil/mongotest), with indexes, dropped and closed on cleanup.
package storetest

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// New opens a store on a database of its own on the test MongoDB.
func New(t testing.TB, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatalf("test MongoDB: %v", err)
	}
	return Open(t, uri, mongotest.DatabaseName(t), opts...)
}

// Open opens a store on database db of uri (another client on a shared database, e.g. one
// with a fault hook), creates the indexes, and drops the database and closes the client on
// cleanup.
func Open(t testing.TB, uri, db string, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	s, err := leasestore.Connect(uri, db, opts...)
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	if err := s.EnsureIndexes(context.Background()); err != nil {
		t.Fatalf("indexes: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Drop(ctx)
		_ = s.Close(ctx)
	})
	return s
}

// OpenShared opens a store for a whole suite (TestMain), on a fresh database named with
// prefix on the test MongoDB, with indexes. close drops the database and disconnects.
func OpenShared(ctx context.Context, prefix string, opts ...leasestore.Option) (s *leasestore.Store, uri, db string, close func(), err error) {
	if uri, err = mongotest.URI(); err != nil {
		return nil, "", "", nil, fmt.Errorf("test MongoDB: %w", err)
	}
	db = fmt.Sprintf("%s-%d", prefix, time.Now().UnixNano())
	if s, err = leasestore.Connect(uri, db, opts...); err != nil {
		return nil, "", "", nil, err
	}
	close = func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Drop(c)
		_ = s.Close(c)
	}
	if err := s.EnsureIndexes(ctx); err != nil {
		close()
		return nil, "", "", nil, err
	}
	return s, uri, db, close, nil
}

// LateEntry writes, at the counter key of database db, an entry of the holder with public ID
// pid, as a booking would that arrives after its holder was released and deleted (a
// network's late duplicate): an entry nobody will give back, which the repair removes. The
// counter is created if needed.
func LateEntry(ctx context.Context, uri, db, key, pid string) error {
	client, err := mongo.Connect(options.Client().ApplyURI(uri))
	if err != nil {
		return err
	}
	defer func() { _ = client.Disconnect(context.WithoutCancel(ctx)) }()
	resource, rest, _ := strings.Cut(key, "|")
	level, scope, _ := strings.Cut(rest, "|")
	tenant := ""
	if level != "global" {
		tenant, _, _ = strings.Cut(scope, "/")
	}
	_, err = client.Database(db).Collection(leasestore.CountersCollection).UpdateOne(ctx,
		bson.D{{Key: "_id", Value: key}, {Key: "slots." + pid, Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{
			{Key: "$set", Value: bson.D{{Key: "slots." + pid, Value: bson.D{}}}},
			{Key: "$setOnInsert", Value: bson.D{{Key: "resource", Value: resource}, {Key: "level", Value: level}, {Key: "scope", Value: scope}, {Key: "tenant", Value: tenant}}},
			{Key: "$inc", Value: bson.D{{Key: "count", Value: 1}}},
			{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
		}, options.UpdateOne().SetUpsert(true))
	return err
}
