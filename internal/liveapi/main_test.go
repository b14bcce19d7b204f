package liveapi_test

import (
	"context"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/livefeed"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/livetest"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// The feed reads often and bookmarks come soon, so that watches answer within a test's patience.
const (
	feedInterval     = 50 * time.Millisecond
	bookmarkInterval = 200 * time.Millisecond
)

// The suite's world: one control plane with aggregation, one live API server on one store,
// tenants acme and globex with a namespace each, tenant orphan without one.
const (
	systemNS = "lease-system"
	nsAcme   = "acme"
	nsGlobex = "globex"
	nsBench  = "bench"
)

var (
	// storeCommands counts the store's round trips (benchmarks).
	storeCommands atomic.Int64
	// feedCommands counts the change feed's round trips (benchmarks).
	feedCommands atomic.Int64
	// storeDocs counts the documents the store's replies carried (tests of what a list reads).
	storeDocs atomic.Int64
	env       *livetest.Env
	store     *leasestore.Store
	reaps     *metrics.Metrics
	handled   = &handledTokens{seen: map[string]bool{}}
	// feed is the live API's change feed, reading the store every feedInterval, through a
	// client of its own, feedStore.
	feed      *livefeed.Feed
	feedStore *leasestore.Store
	// suiteDeps are the live API's collaborators, suiteCtx how long it runs (a restart
	// serves them again with a new feed).
	suiteDeps liveapi.Deps
	suiteCtx  context.Context
	// self is the manager's pod: holders of this pod are revoked here, so the registered
	// handler runs in the test process.
	self = lease.PodRef{Namespace: systemNS, Name: "manager-0", UID: "uid-manager-0"}

	holders   = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceHolders}
	counters  = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceCounters}
	sweepsGVR = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceSweeps}
	podRevGVR = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourcePodRevocations}
	reconGVR  = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceReconciles}
	reviewGVR = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceAcquisitionReviews}
)

type handledTokens struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (h *handledTokens) OnRevoked(_ context.Context, r revocation.Revocation) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.seen[r.Token] = true
	return nil
}

func (h *handledTokens) has(token string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.seen[token]
}

func TestMain(m *testing.M) {
	code, err := run(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	mongotest.Stop()
	os.Exit(code)
}

func run(m *testing.M) (int, error) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	uri, err := mongotest.URI()
	if err != nil {
		return 1, fmt.Errorf("test MongoDB: %w", err)
	}
	database := fmt.Sprintf("liveapi-%d", time.Now().UnixNano())
	store, err = leasestore.Connect(uri, database,
		leasestore.WithCommandObserver(func(string) { storeCommands.Add(1) }),
		leasestore.WithReplyObserver(func(_ string, n int) { storeDocs.Add(int64(n)) }))
	if err != nil {
		return 1, err
	}
	defer func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = store.Drop(c)
		_ = store.Close(c)
	}()
	if err := store.EnsureIndexes(ctx); err != nil {
		return 1, err
	}
	reg := prometheus.NewRegistry()
	reaps = metrics.New(reg)
	registry := revocation.NewRegistry()
	if err := registry.Register("tex", handled); err != nil {
		return 1, err
	}
	disp := revocation.NewDispatcher(selfOnly{}, self, registry,
		revocation.WithMetrics(reaps), revocation.WithRegisterer(reg))
	go func() { _ = disp.Start(ctx) }()

	if err := setupDefinitions(); err != nil {
		return 1, err
	}
	// The feed reads through a client of its own, as the manager's does through the same
	// store: the tests that count a list's store commands count the list's only.
	feedStore0, err := leasestore.Connect(uri, database,
		leasestore.WithCommandObserver(func(string) { feedCommands.Add(1) }))
	if err != nil {
		return 1, err
	}
	defer func() { _ = feedStore0.Close(context.Background()) }()
	feed = livefeed.New(feedStore0, livefeed.Options{Interval: feedInterval})
	go func() { _ = feed.Run(ctx) }()
	suiteCtx, feedStore = ctx, feedStore0
	suiteDeps = liveapi.Deps{
		Feed:             feed,
		BookmarkInterval: bookmarkInterval,
		Store:            store,
		Caps:             countedCaps{resolver},
		Tenants:          tenancy.Static{System: systemNS, Tenants: map[string]string{nsAcme: "acme", nsGlobex: "globex", nsBench: "bench"}},
		Listener:         disp,
		Reviewer:         svc,
		Pods:             selfOnly{},
		Metrics:          reaps,
	}
	env, err = livetest.Start(ctx, suiteDeps, nsAcme, nsGlobex, nsBench)
	if err != nil {
		return 1, err
	}
	defer func() { _ = env.Stop() }()
	if err := setupUsers(ctx); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// The definitions of the suite, as a defaults directory of the built-in layer: capped caps
// every level; share-a and share-b book one resource and disagree on the project cap (the
// tenant cap they disagree on too is the lowest for both: docs/tenancy.md, "Caps belong to
// the resource"). Leases other tests book directly in the store (named after their
// resource) have no definition.
var suiteDefinitions = fstest.MapFS{
	"capped.yaml":  {Data: []byte("name: capped\nlevels: {global: 9, tenant: 5, project: 3, user: 2}\nwaitMs: 0\n")},
	"share-a.yaml": {Data: []byte("name: share-a\nresource: shared\nlevels: {tenant: 3, project: 2}\nwaitMs: 0\n")},
	"share-b.yaml": {Data: []byte("name: share-b\nresource: shared\nlevels: {tenant: 5, project: 3}\nwaitMs: 0\n")},
}

var (
	// resolver is the definitions resolver the live API publishes caps from.
	resolver *definition.Resolver
	// svc acquires as the admission API does, under the suite's definitions.
	svc *leasing.Service
)

// resolutions counts the definitions the live API resolves (benchmarks).
var resolutions atomic.Int64

// countedCaps is the suite's resolver, counted.
type countedCaps struct{ r *definition.Resolver }

func (c countedCaps) Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error) {
	resolutions.Add(1)
	return c.r.Resolve(ctx, tenant, project, name)
}

func setupDefinitions() error {
	builtins, err := definition.LoadBuiltins(suiteDefinitions)
	if err != nil {
		return err
	}
	if errs := builtins.Problems(); len(errs) > 0 {
		return fmt.Errorf("suite definitions: %v", errs)
	}
	resolver = definition.NewResolver(builtins, nil)
	svc = leasing.NewService(store, resolver, leasing.NewStaticTypes("tex"))
	return nil
}

// selfOnly is a pod view that knows only that nothing but the manager's own pod runs.
type selfOnly struct{}

func (selfOnly) WaitForSync(context.Context) bool     { return true }
func (selfOnly) Alive(p lease.PodRef) bool            { return p == self }
func (selfOnly) Endpoint(lease.PodRef) (string, bool) { return "", false }
func (selfOnly) Confirm(_ context.Context, p lease.PodRef) (liveness.Verdict, error) {
	if p == self {
		return liveness.Verdict{Alive: true}, nil
	}
	return liveness.Verdict{Reason: "PodNotFound"}, nil
}
func (selfOnly) Status(p lease.PodRef) (string, bool) {
	if p == self {
		return "", true
	}
	return "PodNotFound", false
}

// Users of the suite and their kubeconfig files.
var (
	alice, bob, operator             *rest.Config
	aliceFile, bobFile, operatorFile string
)

// setupUsers binds the shipped roles: alice views and revokes in acme, bob in globex,
// operator everywhere.
func setupUsers(ctx context.Context) (err error) {
	if err := env.Bind(ctx, "alice", nsAcme, livetest.RoleViewer, livetest.RoleRevoker); err != nil {
		return err
	}
	if err := env.Bind(ctx, "bob", nsGlobex, livetest.RoleViewer, livetest.RoleRevoker); err != nil {
		return err
	}
	if err := env.BindCluster(ctx, "operator", livetest.RoleOperator); err != nil {
		return err
	}
	if alice, aliceFile, err = env.User("alice"); err != nil {
		return err
	}
	if bob, bobFile, err = env.User("bob"); err != nil {
		return err
	}
	operator, operatorFile, err = env.User("operator")
	return err
}
