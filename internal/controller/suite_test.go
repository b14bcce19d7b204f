package controller_test

import (
	"context"
	"path/filepath"
	"testing"
	"testing/fstest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/controller"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/envtestbin"
)

// suiteBuiltin is a built-in definition only this suite knows (as if from --defaults-dir).
const suiteBuiltin = `name: suitebuiltin
resource: pool-a
levels:
  global: 10
  tenant: 4
  project: 2
ttlSeconds: 60
`

// systemNS is the suite's system namespace: the only one whose system-layer documents count.
const systemNS = "lease-system"

var (
	tenants   *tenancy.Informed
	assetsDir string
	testEnv   *envtest.Environment
	k8sClient client.Client
	resolver  *definition.Resolver
	stopMgr   context.CancelFunc
	mgrDone   chan struct{}
)

func TestControllers(t *testing.T) {
	dir, err := envtestbin.AssetsDir()
	if err != nil {
		t.Skip(err.Error())
	}
	assetsDir = dir
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	SetDefaultEventuallyTimeout(15 * time.Second)
	SetDefaultEventuallyPollingInterval(50 * time.Millisecond)

	testEnv = &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("..", "..", "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assetsDir,
	}
	cfg, err := testEnv.Start()
	Expect(err).NotTo(HaveOccurred())

	scheme := runtime.NewScheme()
	Expect(clientgoscheme.AddToScheme(scheme)).To(Succeed())
	Expect(leasev1alpha1.AddToScheme(scheme)).To(Succeed())

	k8sClient, err = client.New(cfg, client.Options{Scheme: scheme})
	Expect(err).NotTo(HaveOccurred())

	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	})
	Expect(err).NotTo(HaveOccurred())

	Expect(k8sClient.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS}})).To(Succeed())

	builtins, err := definition.LoadBuiltins(fstest.MapFS{"suitebuiltin.yaml": {Data: []byte(suiteBuiltin)}})
	Expect(err).NotTo(HaveOccurred())
	Expect(builtins.Problems()).To(BeEmpty())
	// The same wiring as cmd/manager.
	ctx, cancel := context.WithCancel(context.Background())
	stopMgr = cancel
	tenants, err = tenancy.NewInformed(ctx, mgr.GetCache(), systemNS)
	Expect(err).NotTo(HaveOccurred())
	resolver = definition.NewResolver(builtins, k8ssource.New(mgr.GetCache(), tenants))
	Expect(controller.SetupLeaseDefinitions(ctx, mgr, resolver, tenants)).To(Succeed())

	mgrDone = make(chan struct{})
	go func() {
		defer GinkgoRecover()
		defer close(mgrDone)
		Expect(mgr.Start(ctx)).To(Succeed())
	}()
})

var _ = AfterSuite(func() {
	if stopMgr != nil {
		stopMgr()
		Eventually(mgrDone).WithTimeout(30 * time.Second).Should(BeClosed())
	}
	if testEnv != nil {
		Expect(testEnv.Stop()).To(Succeed())
	}
})

// freshNamespace creates a namespace for one spec and deletes it afterwards.
func freshNamespace(ctx context.Context) string {
	return tenantNamespace(ctx, "")
}

// tenantNamespace creates a namespace of tenant (labelled tenancy.TenantLabel; none for "")
// for one spec and deletes it afterwards.
func tenantNamespace(ctx context.Context, tenant string) string {
	GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "ldef-"}}
	if tenant != "" {
		ns.Labels = map[string]string{tenancy.TenantLabel: tenant}
	}
	Expect(k8sClient.Create(ctx, ns)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ns))).To(Succeed())
	})
	return ns.Name
}
