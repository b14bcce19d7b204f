package podadmit_test

import (
	"context"
	"errors"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/podadmit"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
	"github.com/vancetope/lease-operator/internal/waitq"
)

// systemNS holds the suite's system layer.
const systemNS = "lease-system"

var (
	assetsDir  string
	env        *testenv.Env
	k8sClient  client.Client
	store      *leasestore.Store
	stopMgr    func()
	closeStore func()
)

func TestPodAdmission(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	RegisterFailHandler(Fail)
	RunSpecs(t, "Pod admission suite")
}

// The suite wires what cmd/manager wires for pod admission: the gating webhook, the
// admitter on a real acquisition service and store, and the pod watcher with the sweeper,
// whose pod reap releases the lease of a pod that ended.
var _ = BeforeSuite(func(ctx SpecContext) {
	testenv.ConfigureGomega(20 * time.Second)
	var err error
	env, err = testenv.Start(assetsDir, testenv.Options{Webhooks: true})
	Expect(err).NotTo(HaveOccurred())
	k8sClient = env.Client
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS}})).To(Succeed())

	queue := waitq.New()
	granted := func(gs []leasestore.Grant) {
		for _, g := range gs {
			queue.Granted(g.ID, g.Key)
		}
	}
	store, _, _, closeStore, err = storetest.OpenShared(context.Background(), "podadmit", leasestore.WithGrantHook(granted))
	Expect(err).NotTo(HaveOccurred())

	Expect(env.RebindWebhooks(ctx)).To(Succeed())
	wio := &env.WebhookInstallOptions
	opts := env.ManagerOptions()
	opts.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host: wio.LocalServingHost, Port: wio.LocalServingPort, CertDir: wio.LocalServingCertDir,
	})
	mgr, err := ctrl.NewManager(env.Config, opts)
	Expect(err).NotTo(HaveOccurred())
	Expect(k8ssource.SetupIndexes(ctx, mgr.GetFieldIndexer())).To(Succeed())
	tenants, err := k8stenancy.NewInformed(ctx, mgr.GetCache(), systemNS)
	Expect(err).NotTo(HaveOccurred())
	builtins, err := definition.LoadBuiltins(nil)
	Expect(err).NotTo(HaveOccurred())
	resolver := definition.NewResolver(builtins, k8ssource.New(mgr.GetCache(), tenants))
	resolver.OnChange(func() { queue.WakeAll() })
	svc := leasing.NewService(store, resolver, leasing.NewStaticTypes(handlers.TypeNotify, handlers.TypeTex), leasing.WithWaitQueue(queue))

	watcher, err := podwatch.New(env.Config)
	Expect(err).NotTo(HaveOccurred())
	registry := handlers.NewDefaultRegistry(nil, nil, nil)
	dispatcher := revocation.NewDispatcher(watcher, lease.PodRef{}, registry)
	sweep := sweeper.New(store, watcher, dispatcher, sweeper.WithInterval(time.Hour))
	watcher.OnPodGone(sweep.PodGone)
	for _, r := range []interface {
		Start(context.Context) error
	}{watcher, dispatcher, sweep} {
		Expect(mgr.Add(r)).To(Succeed())
	}

	Expect(podadmit.SetupWebhookWithManager(mgr)).To(Succeed())
	Expect(podadmit.NewAdmitter(mgr.GetClient(), storeDownFor{Acquirer: svc, lease: storeDownLease}, tenants, mgr.GetEventRecorder("lease-operator"),
		podadmit.WithRetry(300*time.Millisecond), podadmit.WithDefinitions(resolver), podadmit.WithHolders(store)).SetupWithManager(mgr)).To(Succeed())
	stopMgr = testenv.RunManager(mgr)
	Eventually(func() error { return mgr.GetWebhookServer().StartedChecker()(nil) }).Should(Succeed())
})

// storeDownLease is the lease whose acquisitions fail as a store that is down fails: with the
// driver's text, which names hosts and topology (docs/security.md, "Errors without internal
// detail").
const storeDownLease = "storedown"

// storeDownDriverText is that text.
const storeDownDriverText = "server selection error: context deadline exceeded, current topology: { Type: ReplicaSetNoPrimary, Servers: [{ Addr: mongo-0.mongo.lease-store.svc:27017, Type: Unknown }] }"

// storeDownFor fails the acquisitions of one lease with a store outage.
type storeDownFor struct {
	podadmit.Acquirer
	lease string
}

func (s storeDownFor) Acquire(ctx context.Context, req leasing.Request) (leasing.Lease, error) {
	if req.Lease == s.lease {
		return leasing.Lease{}, lease.Unavailable("acquiring "+req.Lease, errors.New(storeDownDriverText))
	}
	return s.Acquirer.Acquire(ctx, req)
}

var _ = AfterSuite(func() {
	if stopMgr != nil {
		stopMgr()
	}
	if closeStore != nil {
		closeStore()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})
