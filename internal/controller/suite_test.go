package controller_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/controller"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
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

// suiteBrokenBuiltin is a built-in definition that does not load (a cap that is no number): a
// tenant's lease on its resource must be refused (docs/tenancy.md, "Caps belong to the
// resource").
const suiteBrokenBuiltin = `name: suitebroken
levels:
  global: ten
`

// systemNS is the suite's system namespace: the only one whose system-layer documents count.
const systemNS = "lease-system"

var (
	tenants   *k8stenancy.Informed
	assetsDir string
	env       *testenv.Env
	k8sClient client.Client
	resolver  *definition.Resolver
	stopMgr   func()
)

func TestControllers(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	RegisterFailHandler(Fail)
	RunSpecs(t, "Controller Suite")
}

var _ = BeforeSuite(func() {
	testenv.ConfigureGomega(15 * time.Second)
	var err error
	env, err = testenv.Start(assetsDir, testenv.Options{})
	Expect(err).NotTo(HaveOccurred())
	k8sClient = env.Client

	mgr, err := ctrl.NewManager(env.Config, env.ManagerOptions())
	Expect(err).NotTo(HaveOccurred())

	Expect(k8sClient.Create(context.Background(), &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: systemNS}})).To(Succeed())

	builtins, err := definition.LoadBuiltins(fstest.MapFS{"suitebuiltin.yaml": {Data: []byte(suiteBuiltin)},
		"suitebroken.yaml": {Data: []byte(suiteBrokenBuiltin)}})
	Expect(err).NotTo(HaveOccurred())
	Expect(builtins.Problems()).To(HaveLen(1))
	// The same wiring as cmd/manager.
	tenants, err = k8stenancy.NewInformed(context.Background(), mgr.GetCache(), systemNS)
	Expect(err).NotTo(HaveOccurred())
	resolver = definition.NewResolver(builtins, k8ssource.New(mgr.GetCache(), tenants))
	Expect(controller.SetupLeaseDefinitions(context.Background(), mgr, resolver, tenants)).To(Succeed())
	stopMgr = testenv.RunManager(mgr)
})

var _ = AfterSuite(func() {
	if stopMgr != nil {
		stopMgr()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
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
	var labels map[string]string
	if tenant != "" {
		labels = map[string]string{tenancy.TenantLabel: tenant}
	}
	return testenv.FreshNamespace(ctx, k8sClient, "ldef", labels)
}
