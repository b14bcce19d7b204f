package mongotest

import (
	"context"
	"net"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

func TestMain(m *testing.M) {
	code := m.Run()
	Stop()
	os.Exit(code)
}

func ping(ctx context.Context, uri string) error {
	c, err := mongo.Connect(options.Client().ApplyURI(uri).SetServerSelectionTimeout(2 * time.Second))
	if err != nil {
		return err
	}
	defer func() { _ = c.Disconnect(context.Background()) }()
	return c.Ping(ctx, nil)
}

func TestURI(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// Concurrent callers share one server.
	var wg sync.WaitGroup
	uris := make([]string, 4)
	errs := make([]error, 4)
	for i := range uris {
		wg.Go(func() { uris[i], errs[i] = URI() })
	}
	wg.Wait()
	for i := range uris {
		if errs[i] != nil {
			t.Fatal(errs[i])
		}
		if uris[i] != uris[0] {
			t.Fatalf("URI() returned %q and %q", uris[0], uris[i])
		}
	}
	if err := ping(ctx, uris[0]); err != nil {
		t.Fatalf("ping %s: %v", uris[0], err)
	}

	// Round trip through a real database.
	c, err := mongo.Connect(options.Client().ApplyURI(uris[0]))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(context.Background()) }()
	coll := c.Database(DatabaseName(t)).Collection("c")
	if _, err := coll.InsertOne(ctx, bson.D{{Key: "_id", Value: "x"}, {Key: "n", Value: 1}}); err != nil {
		t.Fatal(err)
	}
	var doc struct{ N int }
	if err := coll.FindOne(ctx, bson.D{{Key: "_id", Value: "x"}}).Decode(&doc); err != nil || doc.N != 1 {
		t.Fatalf("FindOne = %+v, %v", doc, err)
	}
	if err := coll.Database().Drop(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestStartServerStop(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := StartServer()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(s.URI(), "mongodb://127.0.0.1:") {
		t.Fatalf("URI = %q", s.URI())
	}
	// A client stays connected across Stop, as in a test of the store losing its server.
	c, err := mongo.Connect(options.Client().ApplyURI(s.URI()).SetServerSelectionTimeout(500 * time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = c.Disconnect(context.Background()) }()
	if err := c.Ping(ctx, nil); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := s.Stop(); err != nil {
		t.Fatal(err)
	}
	t.Logf("stopped in %v", time.Since(start))
	if err := s.Stop(); err != nil {
		t.Fatalf("second Stop: %v", err)
	}
	if err := c.Ping(ctx, nil); err == nil {
		t.Fatal("ping after Stop succeeded")
	}
	host := strings.TrimSuffix(strings.TrimPrefix(s.URI(), "mongodb://"), "/")
	if conn, err := net.DialTimeout("tcp", host, time.Second); err == nil {
		_ = conn.Close()
		t.Fatalf("%s still accepts connections after Stop", host)
	}
}

func TestDatabaseName(t *testing.T) {
	valid := regexp.MustCompile(`^lt_[a-z0-9_]+$`)
	seen := map[string]bool{}
	check := func(t *testing.T) {
		for range 3 {
			name := DatabaseName(t)
			if !valid.MatchString(name) || len(name) > 38 || strings.Contains(name, "__") {
				t.Errorf("DatabaseName = %q (%d bytes)", name, len(name))
			}
			if seen[name] {
				t.Errorf("DatabaseName repeated %q", name)
			}
			seen[name] = true
		}
	}
	check(t)
	t.Run("A very long sub-test name / with $pecial.chars and spaces", check)
	t.Run("__", check)
}

func TestRepoRoot(t *testing.T) {
	root, err := RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(root + "/hack/mongodev/go.mod"); err != nil {
		t.Fatal(err)
	}
	if got := moduleName([]byte("// c\nmodule \"github.com/vancetope/lease-operator\" // x\n\ngo 1.26\n")); got != modulePath {
		t.Fatalf("moduleName = %q", got)
	}
}
