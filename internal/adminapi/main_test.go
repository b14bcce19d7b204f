package adminapi_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vancetope/lease-operator/internal/adminapi"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

const secret = "s3cret-admin-token"

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

// newStore connects to the test server with a fresh database that is dropped on cleanup.
func newStore(t testing.TB, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatalf("test MongoDB: %v", err)
	}
	return newStoreAt(t, uri, mongotest.DatabaseName(t), opts...)
}

func newStoreAt(t testing.TB, uri, db string, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	return storetest.Open(t, uri, db, opts...)
}

// downStore is a store whose server does not exist: every call fails with ErrUnavailable
// after the short operation timeout.
func downStore(t testing.TB) *leasestore.Store {
	t.Helper()
	s, err := leasestore.Connect("mongodb://127.0.0.1:1/?directConnection=true", "down", leasestore.WithOpTimeout(300*time.Millisecond))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = s.Close(ctx)
	})
	return s
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// caps returns caps for all four levels.
func caps(user, project, tenant, global int) []lease.LevelCap {
	return []lease.LevelCap{
		{Level: lease.LevelUser, Cap: user},
		{Level: lease.LevelProject, Cap: project},
		{Level: lease.LevelTenant, Cap: tenant},
		{Level: lease.LevelGlobal, Cap: global},
	}
}

func request(tenant, user string, pod lease.PodRef, c []lease.LevelCap) leasestore.AcquireRequest {
	return leasestore.AcquireRequest{
		LeaseName: "tex",
		Resource:  "tex2pdf",
		Caps:      c,
		Tenant:    tenant,
		Project:   "p",
		User:      user,
		Type:      "tex",
		HolderRef: "job-1",
		Pod:       pod,
		PodBound:  true,
		Payload:   map[string]string{"jobId": "42"},
		TTL:       time.Hour,
	}
}

var (
	podA  = lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"}
	podA2 = lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a2"} // pod-a recreated
	podB  = lease.PodRef{Namespace: "ns", Name: "pod-b", UID: "uid-b"}
)

func mustAcquire(t testing.TB, s *leasestore.Store, req leasestore.AcquireRequest) lease.Holder {
	t.Helper()
	h, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("acquire for %s/%s on %s: %v", req.Tenant, req.User, req.Pod, err)
	}
	return h
}

// counters returns count and booked holders per counter key.
func counters(t testing.TB, s *leasestore.Store) map[string][2]int {
	t.Helper()
	cs, err := s.ListCounters(context.Background(), leasestore.CounterFilter{})
	if err != nil {
		t.Fatalf("list counters: %v", err)
	}
	out := map[string][2]int{}
	for _, c := range cs {
		out[c.Key] = [2]int{c.Count, c.Booked}
	}
	return out
}

func holderTokens(t testing.TB, s *leasestore.Store) []string {
	t.Helper()
	hs, err := s.ListHolders(context.Background(), leasestore.HolderFilter{})
	if err != nil {
		t.Fatalf("list holders: %v", err)
	}
	out := []string{}
	for _, h := range hs {
		out = append(out, h.Token)
	}
	return out
}

// call is one Revoked call the listener received.
type call struct {
	Reason string
	Tokens []string
}

// recordingListener records what it is handed, and whether the context was still live when
// the request had been answered (an asynchronous listener works after that).
type recordingListener struct {
	mu    sync.Mutex
	calls []call
	ctxs  []context.Context
}

func (l *recordingListener) Revoked(ctx context.Context, reason string, holders []lease.Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := call{Reason: reason, Tokens: []string{}}
	for _, h := range holders {
		c.Tokens = append(c.Tokens, h.Token)
	}
	l.calls = append(l.calls, c)
	l.ctxs = append(l.ctxs, ctx)
}

func (l *recordingListener) got() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call{}, l.calls...)
}

func (l *recordingListener) cancelledContexts() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, c := range l.ctxs {
		if c.Err() != nil {
			n++
		}
	}
	return n
}

// fakeSweeper returns a fixed result and counts its rounds.
type fakeSweeper struct {
	mu     sync.Mutex
	res    sweeper.Result
	err    error
	rounds int
}

func (f *fakeSweeper) Sweep(context.Context) (sweeper.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rounds++
	return f.res, f.err
}

func (f *fakeSweeper) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rounds
}

// fixture is an admin handler over a store with a recording listener and a fake sweeper.
type fixture struct {
	store    *leasestore.Store
	listener *recordingListener
	sweeper  *fakeSweeper
	metrics  *metrics.Metrics
	handler  http.Handler
}

func newFixture(t testing.TB, store *leasestore.Store, secret string, opts ...adminapi.Option) *fixture {
	t.Helper()
	f := &fixture{
		store:    store,
		listener: &recordingListener{},
		sweeper:  &fakeSweeper{},
		metrics:  metrics.New(prometheus.NewRegistry()),
	}
	opts = append([]adminapi.Option{adminapi.WithMetrics(f.metrics)}, opts...)
	f.handler = adminapi.NewHandler(store, f.listener, f.sweeper, secret, opts...)
	return f
}

// post sends an authorized POST.
func (f *fixture) post(t testing.TB, path, body string) *httptest.ResponseRecorder {
	t.Helper()
	return f.do(t, http.MethodPost, path, body, "Bearer "+secret)
}

func (f *fixture) do(t testing.TB, method, path, body, authorization string) *httptest.ResponseRecorder {
	t.Helper()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequestWithContext(ctxT(t), method, path, r)
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	rec := httptest.NewRecorder()
	f.handler.ServeHTTP(rec, req)
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s %s: Content-Type %q, want application/json", method, path, ct)
	}
	return rec
}

// decode parses a response body strictly into T.
func decode[T any](t testing.TB, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(rec.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %T from %d response: %v", v, rec.Code, err)
	}
	return v
}

// expectError checks status and code of an error answer and returns its body.
func expectError(t testing.TB, rec *httptest.ResponseRecorder, status int, code string) httpjson.ErrorBody {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	var body httpjson.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("decoding error body %q: %v", rec.Body, err)
	}
	if body.Error != code {
		t.Errorf("error %q, want %q (message %q)", body.Error, code, body.Message)
	}
	if body.Message == "" {
		t.Error("error body without message")
	}
	return body
}
