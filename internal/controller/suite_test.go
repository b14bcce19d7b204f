package controller_test

import (
	"context"
	"testing"
	"testing/fstest"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/controller"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
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

var (
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

	builtins, err := definition.LoadBuiltins(fstest.MapFS{"suitebuiltin.yaml": {Data: []byte(suiteBuiltin)}})
	Expect(err).NotTo(HaveOccurred())
	Expect(builtins.Problems()).To(BeEmpty())
	// The same wiring as cmd/manager.
	resolver = definition.NewResolver(builtins, k8ssource.New(mgr.GetCache()))
	Expect(controller.SetupLeaseDefinitions(context.Background(), mgr, resolver)).To(Succeed())
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
	return testenv.FreshNamespace(ctx, k8sClient, "ldef", nil)
}
