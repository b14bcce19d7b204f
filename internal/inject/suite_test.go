package inject_test

import (
	"context"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlwebhook "sigs.k8s.io/controller-runtime/pkg/webhook"

	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// agentImage is the image the suite's webhook injects.
const agentImage = "registry.example/lease-operator:suite"

var (
	assetsDir string
	env       *testenv.Env
	k8sClient client.Client
	stopMgr   func()
)

func TestWebhook(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	RegisterFailHandler(Fail)
	RunSpecs(t, "Webhook Suite")
}

var _ = BeforeSuite(func() {
	testenv.ConfigureGomega(15 * time.Second)
	// The webhook configuration is the one controller-gen generates into config/webhook;
	// envtest points its clientConfig at the local webhook server with a generated CA.
	var err error
	env, err = testenv.Start(assetsDir, testenv.Options{Webhooks: true})
	Expect(err).NotTo(HaveOccurred())
	// config/webhook holds the injection webhook and pod admission's gate; this suite serves
	// the injection only (no spec creates a pod asking for admission).
	Expect(env.WebhookInstallOptions.MutatingWebhooks).To(HaveLen(1), "config/webhook: one configuration")
	Expect(env.WebhookInstallOptions.MutatingWebhooks[0].Webhooks).To(ContainElement(HaveField("Name", "inject.lease.vancetope.io")))
	k8sClient = env.Client

	// The same wiring as cmd/manager, on the host and certificates envtest provides and a
	// port chosen now (envtest's, chosen when the control plane started, may be taken since).
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	Expect(env.RebindWebhooks(ctx)).To(Succeed())
	wio := &env.WebhookInstallOptions
	opts := env.ManagerOptions()
	opts.WebhookServer = ctrlwebhook.NewServer(ctrlwebhook.Options{
		Host:    wio.LocalServingHost,
		Port:    wio.LocalServingPort,
		CertDir: wio.LocalServingCertDir,
	})
	mgr, err := ctrl.NewManager(env.Config, opts)
	Expect(err).NotTo(HaveOccurred())
	Expect(inject.SetupWebhookWithManager(mgr, inject.Config{Image: agentImage,
		AgentKey:   func(ns string) string { return "key-of-" + ns },
		ManagerURL: "http://lease-operator-admission.lease-operator-system.svc:8082"})).To(Succeed())
	stopMgr = testenv.RunManager(mgr)
	Eventually(func() error { return mgr.GetWebhookServer().StartedChecker()(nil) }).Should(Succeed())
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
	return testenv.FreshNamespace(ctx, k8sClient, "inject", nil)
}
