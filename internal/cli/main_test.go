package cli_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"strings"
	"sync"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/vancetope/lease-operator/internal/cli"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/livefeed"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/livetest"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// The suite's live API runs over whichever store, listener and sweeper the current test
// set with newManager (tests of this package do not run in parallel).
var (
	live         *livetest.Env
	liveStore    = &switchStore{}
	liveListener = &switchListener{}
	liveSweeper  = &switchSweeper{}
	liveReviewer = &switchReviewer{}
	// operatorFile is the kubeconfig of a user bound to the live-operator ClusterRole;
	// aliceFile of one bound to the viewer and revoker roles in namespace acme only.
	operatorFile, aliceFile string
)

const systemNS = "lease-system"

func TestMain(m *testing.M) {
	code, err := runSuite(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	mongotest.Stop()
	os.Exit(code)
}

func runSuite(m *testing.M) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var err error
	feed := livefeed.New(feedSource{}, livefeed.Options{Interval: 50 * time.Millisecond})
	go func() { _ = feed.Run(ctx) }()
	live, err = livetest.Start(ctx, liveapi.Deps{
		Feed:     feed,
		Store:    liveStore,
		Tenants:  tenancy.Static{System: systemNS, Tenants: map[string]string{"acme": "acme", "globex": "globex"}},
		Listener: liveListener,
		Sweeper:  liveSweeper,
		Reviewer: liveReviewer,
		Metrics:  metrics.New(prometheus.NewRegistry()),
	}, "acme", "globex")
	if err != nil {
		return 1, err
	}
	defer func() { _ = live.Stop() }()
	if err := live.BindCluster(ctx, "operator", livetest.RoleOperator); err != nil {
		return 1, err
	}
	if err := live.Bind(ctx, "alice", "acme", livetest.RoleViewer, livetest.RoleRevoker); err != nil {
		return 1, err
	}
	if _, operatorFile, err = live.User("operator"); err != nil {
		return 1, err
	}
	if _, aliceFile, err = live.User("alice"); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

type switchStore struct {
	mu sync.Mutex
	liveapi.Store
}

func (s *switchStore) set(st liveapi.Store) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.Store = st
}

func (s *switchStore) get() liveapi.Store {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.Store
}

func (s *switchStore) GetHolderByID(ctx context.Context, id string) (lease.Holder, error) {
	return s.get().GetHolderByID(ctx, id)
}
func (s *switchStore) ListHoldersPage(ctx context.Context, f leasestore.HolderFilter, after string, limit int) ([]lease.Holder, string, error) {
	return s.get().ListHoldersPage(ctx, f, after, limit)
}
func (s *switchStore) ListCounters(ctx context.Context, f leasestore.CounterFilter) ([]lease.Counter, error) {
	return s.get().ListCounters(ctx, f)
}
func (s *switchStore) ListWaiters(ctx context.Context, f leasestore.HolderFilter) ([]lease.Waiter, error) {
	return s.get().ListWaiters(ctx, f)
}
func (s *switchStore) RevokeByID(ctx context.Context, id, tenant string) (lease.Holder, bool, error) {
	return s.get().RevokeByID(ctx, id, tenant)
}
func (s *switchStore) RevokePod(ctx context.Context, namespace, name string) ([]lease.Holder, error) {
	return s.get().RevokePod(ctx, namespace, name)
}
func (s *switchStore) Reconcile(ctx context.Context) (leasestore.ReconcileResult, error) {
	return s.get().Reconcile(ctx)
}

// feedSource is the live API's feed's view of the current test's store: unavailable between
// tests.
type feedSource struct{}

func (feedSource) store() (liveapi.Store, error) {
	if st := liveStore.get(); st != nil {
		return st, nil
	}
	return nil, lease.ErrUnavailable
}

func (f feedSource) EachHolder(ctx context.Context, each func(lease.Holder) error) error {
	st, err := f.store()
	if err != nil {
		return err
	}
	return st.(livefeed.Source).EachHolder(ctx, each) // the tests' stores are *leasestore.Store
}
func (f feedSource) ListCounters(ctx context.Context, cf leasestore.CounterFilter) ([]lease.Counter, error) {
	st, err := f.store()
	if err != nil {
		return nil, err
	}
	return st.ListCounters(ctx, cf)
}
func (f feedSource) ListWaiters(ctx context.Context, hf leasestore.HolderFilter) ([]lease.Waiter, error) {
	st, err := f.store()
	if err != nil {
		return nil, err
	}
	return st.ListWaiters(ctx, hf)
}

type switchListener struct {
	mu sync.Mutex
	l  *recordingListener
}

func (s *switchListener) Revoked(ctx context.Context, reason string, holders []lease.Holder) {
	s.mu.Lock()
	l := s.l
	s.mu.Unlock()
	l.Revoked(ctx, reason, holders)
}

type switchSweeper struct {
	mu sync.Mutex
	s  *fakeSweeper
}

func (s *switchSweeper) Sweep(ctx context.Context) (sweeper.Result, error) {
	s.mu.Lock()
	f := s.s
	s.mu.Unlock()
	return f.Sweep(ctx)
}

// testStore is a store on a fresh database (dropped on cleanup) with the flags that point the
// plugin at it.
type testStore struct {
	*leasestore.Store
	uri, db string
}

func (s testStore) flags() []string {
	return []string{"--mongodb-uri", s.uri, "--mongodb-database", s.db}
}

func newStore(t testing.TB, opts ...leasestore.Option) testStore {
	t.Helper()
	uri, err := mongotest.URI()
	if err != nil {
		t.Fatalf("test MongoDB: %v", err)
	}
	db := mongotest.DatabaseName(t)
	ts := testStore{Store: connect(t, uri, db, opts...), uri: uri, db: db}
	// The suite's live API reads this test's store.
	newManager(t, ts.Store)
	return ts
}

// connect opens another client on the same database (e.g. one with a fault hook).
func connect(t testing.TB, uri, db string, opts ...leasestore.Option) *leasestore.Store {
	t.Helper()
	return storetest.Open(t, uri, db, opts...)
}

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// result is one run of the plugin.
type result struct {
	stdout, stderr string
	code           int
}

// run executes the plugin in-process with env as its whole environment.
func run(t testing.TB, env map[string]string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	streams := cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut}
	code := cli.Run(ctxT(t), args, streams, cli.WithEnv(func(k string) string { return env[k] }))
	return result{stdout: out.String(), stderr: errOut.String(), code: code}
}

// mustRun runs the plugin and fails the test unless it succeeds.
func mustRun(t testing.TB, env map[string]string, args ...string) result {
	t.Helper()
	r := run(t, env, args...)
	if r.code != 0 {
		t.Fatalf("kubectl lease %s: exit %d\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	return r
}

// mustFail runs the plugin and fails the test unless it exits 1 with an error on stderr
// containing every want.
func mustFail(t testing.TB, env map[string]string, args []string, want ...string) result {
	t.Helper()
	r := run(t, env, args...)
	if r.code != 1 {
		t.Fatalf("kubectl lease %s: exit %d, want 1\nstdout:\n%s\nstderr:\n%s", strings.Join(args, " "), r.code, r.stdout, r.stderr)
	}
	if !strings.HasPrefix(r.stderr, "error: ") {
		t.Errorf("stderr %q does not start with \"error: \"", r.stderr)
	}
	for _, w := range want {
		if !strings.Contains(r.stderr, w) {
			t.Errorf("stderr %q does not contain %q", r.stderr, w)
		}
	}
	return r
}

func args(s testStore, a ...string) []string { return append(a, s.flags()...) }

// caps returns caps for all four levels.
func caps(user, project, tenant, global int) []lease.LevelCap {
	return []lease.LevelCap{
		{Level: lease.LevelUser, Cap: user},
		{Level: lease.LevelProject, Cap: project},
		{Level: lease.LevelTenant, Cap: tenant},
		{Level: lease.LevelGlobal, Cap: global},
	}
}

var (
	podA  = lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"}
	podA2 = lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a2"} // pod-a recreated
	podB  = lease.PodRef{Namespace: "other", Name: "pod-b", UID: "uid-b"}
)

func request(resource, tenant, user string, pod lease.PodRef, c []lease.LevelCap) leasestore.AcquireRequest {
	return leasestore.AcquireRequest{
		LeaseName: "tex",
		Resource:  resource,
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

func mustAcquire(t testing.TB, s *leasestore.Store, req leasestore.AcquireRequest) lease.Holder {
	t.Helper()
	h, err := s.Acquire(context.Background(), req)
	if err != nil {
		t.Fatalf("acquire for %s/%s on %s: %v", req.Tenant, req.User, req.Pod, err)
	}
	return h
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

// tableRows splits a table into its rows of whitespace-separated cells, header included.
// Every cell of the plugin's tables is a single word.
func tableRows(s string) [][]string {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimSpace(s), "\n") {
		if strings.TrimSpace(line) != "" {
			rows = append(rows, strings.Fields(line))
		}
	}
	return rows
}

// columns picks the named columns of a table (header first), so that tests can leave out the
// columns that depend on time.
func columns(t testing.TB, s string, names ...string) [][]string {
	t.Helper()
	rows := tableRows(s)
	if len(rows) == 0 {
		t.Fatalf("no table in %q", s)
	}
	idx := make([]int, len(names))
	for i, n := range names {
		idx[i] = -1
		for j, h := range rows[0] {
			if h == n {
				idx[i] = j
			}
		}
		if idx[i] < 0 {
			t.Fatalf("table has no column %s: header %v", n, rows[0])
		}
	}
	var out [][]string
	for _, r := range rows[1:] {
		if len(r) != len(rows[0]) {
			t.Fatalf("row %v has %d cells, header %d", r, len(r), len(rows[0]))
		}
		picked := make([]string, len(idx))
		for i, j := range idx {
			picked[i] = r[j]
		}
		out = append(out, picked)
	}
	return out
}

// call is one Revoked call the listener received.
type call struct {
	Reason string
	Tokens []string
}

// recordingListener records the revoked holders the admin API hands to it.
type recordingListener struct {
	mu    sync.Mutex
	calls []call
}

func (l *recordingListener) Revoked(_ context.Context, reason string, holders []lease.Holder) {
	l.mu.Lock()
	defer l.mu.Unlock()
	c := call{Reason: reason, Tokens: []string{}}
	for _, h := range holders {
		c.Tokens = append(c.Tokens, h.Token)
	}
	l.calls = append(l.calls, c)
}

func (l *recordingListener) got() []call {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]call(nil), l.calls...)
}

// fakeSweeper returns a fixed result and counts its rounds.
type fakeSweeper struct {
	mu     sync.Mutex
	res    sweeper.Result
	rounds int
}

func (f *fakeSweeper) Sweep(context.Context) (sweeper.Result, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.rounds++
	return f.res, nil
}

func (f *fakeSweeper) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.rounds
}

type switchReviewer struct {
	mu sync.Mutex
	r  liveapi.Reviewer
}

func (s *switchReviewer) Review(ctx context.Context, req leasing.Request) (leasing.Lease, error) {
	s.mu.Lock()
	r := s.r
	s.mu.Unlock()
	return r.Review(ctx, req)
}

// reviewDefinitions are the built-in definitions the suite's reviews resolve: render has two
// slots in all, one per user (the README's tour).
var reviewDefinitions = fstest.MapFS{
	"render.yaml": {Data: []byte("name: render\nlevels: {global: 2, user: 1}\nwaitMs: 0\n")},
}

// manager is the live API over a store, with a recording listener, a fake sweeper and the
// admission service's dry run over reviewDefinitions, reached through the test control plane.
type manager struct {
	listener *recordingListener
	sweeper  *fakeSweeper
	svc      *leasing.Service
}

// newManager points the suite's live API at s for this test.
func newManager(t testing.TB, s *leasestore.Store) *manager {
	t.Helper()
	builtins, err := definition.LoadBuiltins(reviewDefinitions)
	if err != nil {
		t.Fatal(err)
	}
	m := &manager{listener: &recordingListener{}, sweeper: &fakeSweeper{},
		svc: leasing.NewService(s, definition.NewResolver(builtins, nil), leasing.NewStaticTypes("tex"))}
	liveStore.set(s)
	liveReviewer.mu.Lock()
	liveReviewer.r = m.svc
	liveReviewer.mu.Unlock()
	liveListener.mu.Lock()
	liveListener.l = m.listener
	liveListener.mu.Unlock()
	liveSweeper.mu.Lock()
	liveSweeper.s = m.sweeper
	liveSweeper.mu.Unlock()
	return m
}

// env returns the environment of a cluster operator: a kubeconfig, nothing else.
func (m *manager) env() map[string]string { return operatorEnv() }

func operatorEnv() map[string]string {
	return map[string]string{"KUBECONFIG": operatorFile, "LEASE_SYSTEM_NAMESPACE": systemNS}
}
