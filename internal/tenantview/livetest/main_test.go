package livetest

import (
	"context"
	"fmt"
	"net"
	"net/http/httptest"
	"os"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
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

var (
	env        *aggregatortest.Env
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
		leasestore.WithSafetyMargin(margin), leasestore.WithReconcileConfirm(0))
	if err != nil {
		return 1, err
	}
	defer closeStore()

	// The admission API, as the manager serves it, with the compiled-in tex definition
	// (global 6, tenant 3, project 1, TTL 120s).
	builtins, err := definition.LoadBuiltins(nil)
	if err != nil {
		return 1, err
	}
	svc := leasing.NewService(store, definition.NewResolver(builtins, nil), leasing.NewStaticTypes("tex"), nil, nil, nil)
	adm := httptest.NewServer(httpapi.NewHandler(svc))
	defer adm.Close()
	admission = adm.URL

	if env, err = aggregatortest.Start(); err != nil {
		return 1, err
	}
	defer func() { _ = env.Stop() }()
	err = env.Serve(ctx, livev1alpha1.GroupVersion, systemNS, func(l net.Listener) error {
		srv, err := liveapi.New(liveapi.Options{Listener: l, Kubeconfig: env.AdminKubeconfig}, liveapi.Deps{
			Store:   store,
			Tenants: tenancy.Static{System: systemNS, Tenants: map[string]string{nsAcme: "acme", nsGlobex: "globex"}},
		})
		if err != nil {
			return err
		}
		go func() { _ = srv.Run(ctx) }()
		return nil
	})
	if err != nil {
		return 1, err
	}
	if err := setupRBAC(ctx); err != nil {
		return 1, err
	}
	return m.Run(), nil
}

// setupRBAC binds the shipped live-viewer and live-revoker roles: alice both in acme, vic
// only live-viewer in acme, bob both in globex.
func setupRBAC(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	for _, ns := range []string{systemNS, nsAcme, nsGlobex} {
		_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	if err := env.InstallClusterRoles(ctx, "live_viewer_role.yaml", "live_revoker_role.yaml"); err != nil {
		return err
	}
	if err := env.BindInNamespace(ctx, "alice", nsAcme, "live-viewer", "live-revoker"); err != nil {
		return err
	}
	if err := env.BindInNamespace(ctx, "vic", nsAcme, "live-viewer"); err != nil {
		return err
	}
	if err := env.BindInNamespace(ctx, "bob", nsGlobex, "live-viewer", "live-revoker"); err != nil {
		return err
	}
	if alice, aliceFile, err = env.User("alice"); err != nil {
		return err
	}
	if vic, _, err = env.User("vic"); err != nil {
		return err
	}
	bob, _, err = env.User("bob")
	return err
}
