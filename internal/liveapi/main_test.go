package liveapi_test

import (
	"context"
	"fmt"
	"net"
	"os"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/liveapi"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// The suite's world: one control plane with aggregation, one live API server on one store,
// tenants acme and globex with a namespace each, tenant orphan without one.
const (
	systemNS = "lease-system"
	nsAcme   = "acme"
	nsGlobex = "globex"
)

var (
	env     *aggregatortest.Env
	store   *leasestore.Store
	reaps   *metrics.Metrics
	handled = &handledTokens{seen: map[string]bool{}}
	// self is the manager's pod: holders of this pod are revoked here, so the registered
	// handler runs in the test process.
	self = lease.PodRef{Namespace: systemNS, Name: "manager-0", UID: "uid-manager-0"}

	holders   = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceHolders}
	counters  = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceCounters}
	sweepsGVR = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceSweeps}
	podRevGVR = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourcePodRevocations}
	reconGVR  = schema.GroupVersionResource{Group: livev1alpha1.GroupName, Version: "v1alpha1", Resource: livev1alpha1.ResourceReconciles}
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
	var closeStore func()
	var err error
	if store, _, _, closeStore, err = storetest.OpenShared(ctx, "liveapi"); err != nil {
		return 1, err
	}
	defer closeStore()
	if env, err = aggregatortest.Start(); err != nil {
		return 1, err
	}
	defer func() { _ = env.Stop() }()

	reg := prometheus.NewRegistry()
	reaps = metrics.New(reg)
	registry := revocation.NewRegistry()
	if err := registry.Register("tex", handled); err != nil {
		return 1, err
	}
	disp := revocation.NewDispatcher(selfOnly{}, self, registry,
		revocation.WithMetrics(reaps), revocation.WithRegisterer(reg))
	go func() { _ = disp.Start(ctx) }()

	err = env.Serve(ctx, livev1alpha1.GroupVersion, systemNS, func(l net.Listener) error {
		srv, err := liveapi.New(liveapi.Options{Listener: l, Kubeconfig: env.AdminKubeconfig}, liveapi.Deps{
			Store:    store,
			Tenants:  tenancy.Static{System: systemNS, Tenants: map[string]string{nsAcme: "acme", nsGlobex: "globex"}},
			Listener: disp,
			Pods:     selfOnly{},
			Metrics:  reaps,
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

// selfOnly is a pod view that knows only that nothing but the manager's own pod runs.
type selfOnly struct{}

func (selfOnly) WaitForSync(context.Context) bool     { return true }
func (selfOnly) Alive(p lease.PodRef) bool            { return p == self }
func (selfOnly) Endpoint(lease.PodRef) (string, bool) { return "", false }
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

// setupRBAC creates the tenant namespaces and binds the shipped roles: alice views and
// revokes in acme, bob in globex, operator everywhere.
func setupRBAC(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		return err
	}
	for _, ns := range []string{nsAcme, nsGlobex} {
		if err := createNamespace(ctx, cs, ns); err != nil {
			return err
		}
	}
	if err := env.InstallClusterRoles(ctx, "live_viewer_role.yaml", "live_revoker_role.yaml", "live_operator_role.yaml"); err != nil {
		return err
	}
	if err := env.BindInNamespace(ctx, "alice", nsAcme, "live-viewer", "live-revoker"); err != nil {
		return err
	}
	if err := env.BindInNamespace(ctx, "bob", nsGlobex, "live-viewer", "live-revoker"); err != nil {
		return err
	}
	crb := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "operator-live"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "live-operator"},
		Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: rbacv1.UserKind, Name: "operator"}},
	}
	if _, err := cs.RbacV1().ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{}); err != nil {
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

func createNamespace(ctx context.Context, cs kubernetes.Interface, ns string) error {
	_, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{})
	return err
}
