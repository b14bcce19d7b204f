package kwoktest_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/testutil/kwoktest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

var (
	assetsDir string
	kwokBin   string
	env       *testenv.Env
	k8sClient client.Client
	kwok      *kwoktest.Cluster
)

func TestKwok(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	kwokBin = kwoktest.BinaryOrSkip(t)
	RegisterFailHandler(Fail)
	RunSpecs(t, "kwoktest Suite")
}

var _ = BeforeSuite(func(ctx context.Context) {
	testenv.ConfigureGomega(10 * time.Second)
	var err error
	env, err = testenv.Start(assetsDir, testenv.Options{})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(env.Stop)
	k8sClient = env.Client

	kwok, err = kwoktest.Start(ctx, env.Config, kwoktest.Options{Bin: kwokBin})
	Expect(err).NotTo(HaveOccurred())
	DeferCleanup(kwok.Stop)
	GinkgoWriter.Printf("kwoktest: kwok started, node %s Ready in %v\n", kwok.NodeName, kwok.Startup.Round(time.Millisecond))
	AddReportEntry("kwok start to node Ready", kwok.Startup.Round(time.Millisecond).String())
})
