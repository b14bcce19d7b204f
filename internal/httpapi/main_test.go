package httpapi_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/openapitest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	// Every answer the OpenAPI document describes must have been produced by a test (only
	// meaningful when the whole package ran).
	if code == 0 && flag.Lookup("test.run").Value.String() == "" {
		missing, err := openapitest.Unexercised()
		if err != nil || len(missing) > 0 {
			fmt.Fprintf(os.Stderr, "OpenAPI answers no test produced: %v %v\n", missing, err)
			code = 1
		}
	}
	os.Exit(code)
}

// leaseDef is a system-layer definition document.
type leaseDef struct {
	name, resource        string
	user, project, global int32
	ttlSeconds, waitMs    int32
	maxPriority           int32
}

// memSource is an in-memory definition.LayerSource holding system-layer documents.
type memSource struct {
	docs map[definition.LayerKey][]definition.Layer
}

func newMemSource(defs ...leaseDef) *memSource {
	m := &memSource{docs: map[definition.LayerKey][]definition.Layer{}}
	set := func(v int32) *int32 {
		if v == 0 {
			return nil
		}
		return &v
	}
	for _, d := range defs {
		l := definition.Layer{Kind: definition.KindSystem, Source: "test " + d.name, Name: d.name,
			Tenant: definition.SystemTenant, Project: definition.TenantProject,
			Levels:     definition.Levels{Global: set(d.global), Project: set(d.project), User: set(d.user)},
			TTLSeconds: set(d.ttlSeconds), WaitMs: &d.waitMs, MaxPriority: set(d.maxPriority)}
		if d.resource != "" {
			l.Resource = &d.resource
		}
		k := definition.LayerKey{Name: d.name, Tenant: l.Tenant, Project: l.Project}
		m.docs[k] = append(m.docs[k], l)
	}
	return m
}

func (m *memSource) Layers(_ context.Context, key definition.LayerKey) ([]definition.Layer, error) {
	return m.docs[key], nil
}

func (m *memSource) SystemLayers(context.Context) ([]definition.Layer, error) {
	var out []definition.Layer
	for k, docs := range m.docs {
		if k.Kind() == definition.KindSystem {
			out = append(out, docs...)
		}
	}
	return out, nil
}

// commands counts the store's round trips, by command name.
type commands struct {
	mu    sync.Mutex
	n     int
	names map[string]int
}

func (c *commands) observe(name string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
	if c.names == nil {
		c.names = map[string]int{}
	}
	c.names[name]++
}

func (c *commands) get() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// readCommands are the commands that change nothing on the server.
var readCommands = map[string]bool{"find": true, "getMore": true, "aggregate": true, "count": true, "distinct": true,
	"killCursors": true, "listCollections": true, "listIndexes": true}

// connectionCommands are the driver's own: they read and change no data.
var connectionCommands = map[string]bool{"hello": true, "isMaster": true, "ping": true, "endSessions": true}

// split returns the commands since the last split, as reads and writes (any command that
// is no read counts as a write: insert, update, delete, findAndModify, create, ...).
func (c *commands) split() (reads, writes map[string]int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	reads, writes = map[string]int{}, map[string]int{}
	for name, n := range c.names {
		if connectionCommands[name] {
			continue
		}
		if readCommands[name] {
			reads[name] += n
		} else {
			writes[name] += n
		}
	}
	c.names = nil
	return reads, writes
}

type env struct {
	store   *leasestore.Store
	cmds    *commands
	svc     *leasing.Service
	metrics *metrics.Metrics
	srv     *httptest.Server
}

type envOpts struct {
	uri       string
	storeOpts []leasestore.Option
	httpOpts  []httpapi.Option
	// log, when set, is the logger in every request's context (where the handler logs), as
	// the manager's and the agent's global logger is.
	log logr.Logger
}

func newEnv(t *testing.T, defs []leaseDef, o envOpts) *env {
	t.Helper()
	e := &env{cmds: &commands{}}
	uri := o.uri
	if uri == "" {
		var err error
		if uri, err = mongotest.URI(); err != nil {
			t.Fatalf("test MongoDB: %v", err)
		}
	}
	s, err := leasestore.Connect(uri, mongotest.DatabaseName(t),
		append([]leasestore.Option{leasestore.WithCommandObserver(e.cmds.observe)}, o.storeOpts...)...)
	if err != nil {
		t.Fatal(err)
	}
	e.store = s
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if o.uri == "" {
			_ = s.Drop(ctx)
		}
		_ = s.Close(ctx)
	})
	e.metrics = metrics.New(prometheus.NewRegistry())
	e.svc = leasing.NewService(s, definition.NewResolver(nil, newMemSource(defs...)),
		leasing.NewStaticTypes("tex", "mcp"), leasing.WithMetrics(e.metrics))
	h := httpapi.NewHandler(e.svc, o.httpOpts...)
	if o.log.GetSink() != nil {
		api := h
		h = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			api.ServeHTTP(w, r.WithContext(logr.NewContext(r.Context(), o.log)))
		})
	}
	e.srv = httptest.NewServer(openapitest.Conformance(t, h))
	t.Cleanup(func() { waitfor.Do(t, "the test server to close (its handlers to return)", e.srv.Close) })
	return e
}

// do sends a request and decodes a JSON answer (nil for an empty body).
func (e *env) do(t *testing.T, method, path, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, e.srv.URL+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := e.srv.Client().Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) == 0 {
		return resp.StatusCode, nil
	}
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s: status %d, body %q is not a JSON object: %v", method, path, resp.StatusCode, raw, err)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q", method, path, ct)
	}
	return resp.StatusCode, out
}

// acquire posts an acquisition and expects 200; it returns the token.
func (e *env) acquire(t *testing.T, body string) string {
	t.Helper()
	status, out := e.do(t, http.MethodPost, "/v1/leases", body)
	if status != http.StatusOK {
		t.Fatalf("acquire %s = %d %v", body, status, out)
	}
	tok, _ := out["token"].(string)
	return tok
}

// empty fails unless the store has no holder and no counter.
func (e *env) empty(t *testing.T) {
	t.Helper()
	ctx := context.Background()
	hs, err := e.store.ListHolders(ctx, leasestore.HolderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	cs, err := e.store.ListCounters(ctx, leasestore.CounterFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 0 || len(cs) != 0 {
		t.Errorf("store has %d holders and %d counters, want none", len(hs), len(cs))
	}
}
