// Package testenv is the one home of the envtest bootstrap that the integration suites share:
// a local control plane with the project's CRDs (and, on request, its webhook
// configurations), a scheme with the project's types, a client, a manager options template,
// a manager runner and per-spec namespaces. Suites differ only in what they wire on top.
package testenv

import (
	"context"
	"fmt"
	"net"
	"path/filepath"
	"strings"
	"time"

	"github.com/onsi/ginkgo/v2"
	"github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/testutil/envtestbin"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// Options select what the control plane gets beyond the project's CRDs.
type Options struct {
	// Webhooks installs the webhook configurations generated into config/webhook, pointed at
	// a local serving host, port and certificates (see Env.WebhookInstallOptions).
	Webhooks bool
	// APIServerFlags are set on the test kube-apiserver (e.g. aggregation flags).
	APIServerFlags map[string]string
}

// Env is a running control plane and what a suite needs to talk to it.
type Env struct {
	*envtest.Environment
	// Config is the admin's REST config.
	Config *rest.Config
	// Scheme holds client-go's types and the project's.
	Scheme *runtime.Scheme
	// Client is an uncached admin client.
	Client client.Client
	// Root is the repository root (for config/ paths).
	Root string
}

// AssetsOrSkip returns the control-plane binaries' directory, or skips the test with the
// reason and the command that builds them. Call it from the suite's Test function.
func AssetsOrSkip(t interface{ Skip(args ...any) }) string {
	dir, err := envtestbin.AssetsDir()
	if err != nil {
		t.Skip(err.Error())
	}
	return dir
}

// ConfigureGomega installs a logger writing to Ginkgo and the suites' default timeouts.
func ConfigureGomega(eventually time.Duration) {
	logf.SetLogger(zap.New(zap.WriteTo(ginkgo.GinkgoWriter), zap.UseDevMode(true)))
	gomega.SetDefaultEventuallyTimeout(eventually)
	gomega.SetDefaultEventuallyPollingInterval(50 * time.Millisecond)
	gomega.SetDefaultConsistentlyDuration(500 * time.Millisecond)
}

// Start starts a control plane from the binaries in assetsDir with the project's CRDs.
func Start(assetsDir string, opts Options) (*Env, error) {
	root, err := mongotest.RepoRoot()
	if err != nil {
		return nil, err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join(root, "config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
		BinaryAssetsDirectory: assetsDir,
	}
	if opts.Webhooks {
		env.WebhookInstallOptions = envtest.WebhookInstallOptions{Paths: []string{filepath.Join(root, "config", "webhook")}}
	}
	if len(opts.APIServerFlags) > 0 {
		args := env.ControlPlane.GetAPIServer().Configure()
		for k, v := range opts.APIServerFlags {
			args.Set(k, v)
		}
	}
	cfg, err := env.Start()
	if err != nil {
		return nil, fmt.Errorf("starting the control plane: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := leasev1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &Env{Environment: env, Config: cfg, Scheme: scheme, Client: c, Root: root}, nil
}

// ManagerOptions are the options of a manager in a suite: the suite's scheme, no metrics or
// probe listeners, and controller names that may repeat across specs.
func (e *Env) ManagerOptions() ctrl.Options {
	return ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
}

// RunManager starts mgr in the background and returns the function that stops it and waits
// for it to return.
func RunManager(mgr ctrl.Manager) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer ginkgo.GinkgoRecover()
		defer close(done)
		gomega.Expect(mgr.Start(ctx)).To(gomega.Succeed())
	}()
	return func() {
		cancel()
		gomega.Eventually(done).WithTimeout(30 * time.Second).Should(gomega.BeClosed())
	}
}

// FreshNamespace creates a namespace named prefix-<random> with labels for one spec and
// deletes it when the spec ends.
func FreshNamespace(ctx context.Context, c client.Client, prefix string, labels map[string]string) string {
	ginkgo.GinkgoHelper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: prefix + "-", Labels: labels}}
	gomega.Expect(c.Create(ctx, ns)).To(gomega.Succeed())
	ginkgo.DeferCleanup(func(ctx ginkgo.SpecContext) {
		gomega.Expect(client.IgnoreNotFound(c.Delete(ctx, ns))).To(gomega.Succeed())
	})
	return ns.Name
}

// RebindWebhooks points the installed webhook configurations at a port chosen now, and sets
// WebhookInstallOptions.LocalServingPort to it. envtest chooses the port when the control
// plane starts; a webhook server started seconds or minutes later may find it taken by any
// connection's ephemeral port meanwhile. Call it just before starting the webhook server.
func (e *Env) RebindWebhooks(ctx context.Context) error {
	wio := &e.WebhookInstallOptions
	l, err := net.Listen("tcp", net.JoinHostPort(wio.LocalServingHost, "0"))
	if err != nil {
		return fmt.Errorf("choosing the webhook server's port: %w", err)
	}
	port := l.Addr().(*net.TCPAddr).Port
	if err := l.Close(); err != nil {
		return err
	}
	from, to := fmt.Sprintf(":%d/", wio.LocalServingPort), fmt.Sprintf(":%d/", port)
	var list admissionregistrationv1.MutatingWebhookConfigurationList
	if err := e.Client.List(ctx, &list); err != nil {
		return fmt.Errorf("listing the webhook configurations: %w", err)
	}
	for i := range list.Items {
		cfg := &list.Items[i]
		for j := range cfg.Webhooks {
			if u := cfg.Webhooks[j].ClientConfig.URL; u != nil {
				moved := strings.Replace(*u, from, to, 1)
				cfg.Webhooks[j].ClientConfig.URL = &moved
			}
		}
		if err := e.Client.Update(ctx, cfg); err != nil {
			return fmt.Errorf("pointing webhook configuration %s at port %d: %w", cfg.Name, port, err)
		}
	}
	wio.LocalServingPort = port
	return nil
}
