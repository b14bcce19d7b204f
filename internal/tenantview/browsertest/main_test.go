package browsertest

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"testing"
	"testing/fstest"
	"time"

	"k8s.io/client-go/rest"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/livefeed"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/livetest"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// The suite's world: tenants acme and globex with a namespace each; alice administers acme
// (views and revokes), vic only views acme, bob administers globex.
const (
	systemNS = "lease-system"
	nsAcme   = "acme"
	nsGlobex = "globex"
	// margin is the reconcile safety margin of the suite's store: drift is repaired once a
	// counter has been unchanged this long.
	margin = 300 * time.Millisecond
)

// pdfDefinition is the suite's borrowing definition.
const pdfDefinition = `name: pdf
levels:
  global: 4
  tenant: 1
ttlSeconds: 120
maxPriority: 5
borrowing:
  enabled: true
  maxBorrowed: 1
`

var (
	env        *livetest.Env
	store      *leasestore.Store
	dbURI      string
	dbName     string
	admission  string // base URL of the admission API
	alice, vic *rest.Config
	bob        *rest.Config
	// aliceFile is alice's kubeconfig file, for kubectl lease ui itself.
	aliceFile string
)

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
	var closeStore func()
	var err error
	store, dbURI, dbName, closeStore, err = storetest.OpenShared(ctx, "tenantview",
		leasestore.WithSafetyMargin(margin))
	if err != nil {
		return 1, err
	}
	defer closeStore()

	// The admission API, as the manager serves it, with the compiled-in tex definition
	// (global 6, tenant 3, project 1, TTL 120s) and, in the built-in layer's defaults
	// directory as an operator would ship it, pdf: tenant 1 that may borrow one slot more
	// while the global level (4) has room, and priorities up to 5 (docs/borrowing.md,
	// docs/waiting.md "Priority"; both are owned by the built-in and system layers).
	builtins, err := definition.LoadBuiltins(fstest.MapFS{"pdf.yaml": {Data: []byte(pdfDefinition)}})
	if err != nil {
		return 1, err
	}
	resolver := definition.NewResolver(builtins, nil)
	svc := leasing.NewService(store, resolver, leasing.NewStaticTypes("tex"))
	adm := httptest.NewServer(httpapi.NewHandler(svc))
	defer adm.Close()
	admission = adm.URL

	tenants := tenancy.Static{System: systemNS, Tenants: map[string]string{nsAcme: "acme", nsGlobex: "globex"}}
	// The live API's change feed, which the view's live updates follow (its watches).
	feed := livefeed.New(store, livefeed.Options{Interval: 50 * time.Millisecond})
	go func() { _ = feed.Run(ctx) }()
	if env, err = livetest.Start(ctx, liveapi.Deps{Store: store, Tenants: tenants, Caps: resolver, Feed: feed}, systemNS, nsAcme, nsGlobex); err != nil {
		return 1, err
	}
	defer func() { _ = env.Stop() }()
	if err := bindUsers(ctx); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// bindUsers binds the shipped roles: alice may view and revoke in acme, vic only view, bob
// view and revoke in globex.
func bindUsers(ctx context.Context) error {
	for _, b := range []struct {
		user, ns string
		roles    []string
	}{
		{"alice", nsAcme, []string{livetest.RoleViewer, livetest.RoleRevoker}},
		{"vic", nsAcme, []string{livetest.RoleViewer}},
		{"bob", nsGlobex, []string{livetest.RoleViewer, livetest.RoleRevoker}},
	} {
		if err := env.Bind(ctx, b.user, b.ns, b.roles...); err != nil {
			return err
		}
	}
	var err error
	if alice, aliceFile, err = env.User("alice"); err != nil {
		return err
	}
	if vic, _, err = env.User("vic"); err != nil {
		return err
	}
	bob, _, err = env.User("bob")
	return err
}
