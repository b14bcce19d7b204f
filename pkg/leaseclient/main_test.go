package leaseclient_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"testing"
	"testing/fstest"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/openapitest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// The client is tested against the real admission API: internal/httpapi on an httptest
// server, backed by internal/leasing on the development MongoDB.

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

// definitions are the default-layer documents of the tests.
var definitions = fstest.MapFS{
	// solo: one slot per project, long wait (the tests shorten it).
	"solo.yaml": {Data: []byte("name: solo\nresource: solo-res\nlevels:\n  project: 1\n  global: 4\nttlSeconds: 60\nwaitMs: 10000\n")},
	// seat: one slot per user.
	"seat.yaml": {Data: []byte("name: seat\nlevels:\n  user: 1\nttlSeconds: 60\nwaitMs: 0\n")},
	// gpu and licence: acquired together (parts_test.go); one gpu worldwide.
	"gpu.yaml":     {Data: []byte("name: gpu\nlevels:\n  global: 1\nttlSeconds: 120\nwaitMs: 0\n")},
	"licence.yaml": {Data: []byte("name: licence\nlevels:\n  project: 2\nttlSeconds: 60\nwaitMs: 0\n")},
}

var testPod = lease.PodRef{Namespace: "apps", Name: "worker-0", UID: "uid-0"}

// testTenants maps testPod's namespace to tenant acme, as the servers bind callers.
var testTenants = tenancy.Static{System: "lease-system", Tenants: map[string]string{"apps": "acme"}}

type env struct {
	store  *leasestore.Store
	hub    *notify.Hub
	srv    *httptest.Server
	client *leaseclient.Client
}

type envOpts struct {
	uri       string
	storeOpts []leasestore.Option
	// wrap wraps the API handler (to inject transport failures in front of it).
	wrap func(http.Handler) http.Handler
}

func newEnv(t *testing.T, o envOpts, clientOpts ...leaseclient.Option) *env {
	t.Helper()
	var s *leasestore.Store
	if o.uri == "" {
		s = storetest.New(t, o.storeOpts...)
	} else {
		// A store that is down: no indexes to create, nothing to drop.
		var err error
		if s, err = leasestore.Connect(o.uri, "down", o.storeOpts...); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = s.Close(context.Background()) })
	}
	builtins, err := definition.LoadBuiltins(definitions)
	if err != nil {
		t.Fatal(err)
	}
	svc := leasing.NewService(s, definition.NewResolver(builtins, nil), leasing.NewStaticTypes("tex", "mcp"))
	hub := notify.NewHub(time.Minute, testingclock.NewFakeClock(time.Now()))
	// Every exchange is also checked against the OpenAPI document: the client sends only
	// what the document allows.
	h := openapitest.Conformance(t, httpapi.NewHandler(svc, httpapi.WithEvents(hub),
		httpapi.WithPodIdentity(httpapi.StaticPodIdentity(testPod)),
		httpapi.WithTenantBinder(tenancy.Binder{Map: testTenants}.Bind)))
	if o.wrap != nil {
		h = o.wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(func() { waitfor.Do(t, "the test server to close (its handlers to return)", srv.Close) })
	c, err := leaseclient.New(srv.URL, clientOpts...)
	if err != nil {
		t.Fatal(err)
	}
	return &env{store: s, hub: hub, srv: srv, client: c}
}

// holders returns the stored holders.
func (e *env) holders(t *testing.T) []lease.Holder {
	t.Helper()
	hs, err := e.store.ListHolders(context.Background(), leasestore.HolderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	return hs
}

// ctx returns a context bounded for one test step.
func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}
