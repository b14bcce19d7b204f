package e2e

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/yaml"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

const (
	// namespace holds the samples, the app pod and the definitions the specs create.
	namespace = "default"
	// appPodName is the pod the agent runs in; it carries podIP 127.0.0.1, so the manager
	// attributes the suite's own calls (source 127.0.0.1) to it as well.
	appPodName = "app-0"
	appPodIP   = "127.0.0.1"
	// adminSecret is the bearer secret of the manager's operator API.
	adminSecret = "s3cret"
	// internalSecret protects the agent's revocation endpoint, shared by manager and agent as
	// in a real installation.
	internalSecret = "e2e-internal-secret"
)

var (
	suiteT    *testing.T
	assetsDir string
	workDir   string // the binary, the kubeconfig and the process logs

	env       *testenv.Env
	k8sClient client.Client
	store     *leasestore.Store

	managerProc *process
	agentProc   *process

	// managerAddr is the manager's admission and operator API (host:port).
	managerAddr string
	// managerAPI and agentAPI call from 127.0.0.1: as pod app-0.
	managerAPI *apiClient
	agentAPI   *apiClient
	metricsURL string
	// agentMetricsURL is the agent's metrics endpoint on its internal port.
	agentMetricsURL string
	// sampleNames are the LeaseDefinitions applied from config/samples.
	sampleNames []string
	// appPod is the agent's identity (and the pod the manager sees at 127.0.0.1).
	appPod lease.PodRef
)

func TestE2E(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	suiteT = t
	RegisterFailHandler(Fail)
	RunSpecs(t, "End-to-End Suite")
}

var _ = BeforeSuite(func(ctx SpecContext) {
	logf.SetLogger(zap.New(zap.WriteTo(GinkgoWriter), zap.UseDevMode(true)))
	SetDefaultEventuallyTimeout(20 * time.Second)
	SetDefaultEventuallyPollingInterval(100 * time.Millisecond)
	SetDefaultConsistentlyDuration(300 * time.Millisecond)
	SetDefaultConsistentlyPollingInterval(50 * time.Millisecond)

	root, err := mongotest.RepoRoot()
	Expect(err).NotTo(HaveOccurred())
	workDir, err = os.MkdirTemp("", "lease-e2e-")
	Expect(err).NotTo(HaveOccurred())
	GinkgoWriter.Printf("e2e: binary, kubeconfig and process logs in %s\n", workDir)

	// The three slow steps run side by side: the build, the store and the control plane.
	type result struct {
		value string
		err   error
	}
	built, started := make(chan result, 1), make(chan result, 1)
	begin := time.Now()
	go func() {
		bin, err := buildManager(root, workDir)
		GinkgoWriter.Printf("e2e: built the manager in %v\n", time.Since(begin).Round(time.Millisecond))
		built <- result{bin, err}
	}()
	go func() {
		uri, err := mongotest.URI()
		GinkgoWriter.Printf("e2e: store ready in %v\n", time.Since(begin).Round(time.Millisecond))
		started <- result{uri, err}
	}()

	env, err = testenv.Start(assetsDir, testenv.Options{})
	Expect(err).NotTo(HaveOccurred(), "starting the control plane")
	cfg := env.Config
	GinkgoWriter.Printf("e2e: control plane ready in %v\n", time.Since(begin).Round(time.Millisecond))

	// The processes get a cluster admin's kubeconfig.
	admin, err := env.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, cfg)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := admin.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	kubeconfigPath := filepath.Join(workDir, "kubeconfig")
	Expect(os.WriteFile(kubeconfigPath, kubeconfig, 0o600)).To(Succeed())

	k8sClient = env.Client

	applySamples(ctx, filepath.Join(root, "config", "samples"))
	appPod = createRunningPod(ctx, appPodName, appPodIP)

	mongo := <-started
	Expect(mongo.err).NotTo(HaveOccurred(), "test MongoDB")
	database := mongotest.DatabaseName(suiteT)
	store, err = leasestore.Connect(mongo.value, database)
	Expect(err).NotTo(HaveOccurred())

	bin := <-built
	Expect(bin.err).NotTo(HaveOccurred(), "building the manager")

	ports, err := freePorts(5)
	Expect(err).NotTo(HaveOccurred())
	local := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	managerAddr = local(ports[0])
	probeAddr, metricsAddr, agentAPIAddr := local(ports[1]), local(ports[2]), local(ports[3])
	agentInternalPort := ports[4]
	agentInternalAddr := local(agentInternalPort)

	managerProc, err = startProcess("manager", workDir, bin.value, []string{
		"--api-bind-address", managerAddr,
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", probeAddr,
		"--reap-interval", "1h",
		"--admin-secret", adminSecret,
		"--agent-internal-port", strconv.Itoa(agentInternalPort),
		"--mongodb-uri", mongo.value,
		"--mongodb-database", database,
	}, childEnv("KUBECONFIG="+kubeconfigPath, "LEASE_INTERNAL_SECRET="+internalSecret))
	Expect(err).NotTo(HaveOccurred())

	// The agent as the webhook injects it: store, identity and the manager's URL (for its
	// lazy idle sweeps) from the environment.
	agentProc, err = startProcess("agent", workDir, bin.value, []string{
		"agent",
		"--api-bind-address", agentAPIAddr,
		"--internal-bind-address", agentInternalAddr,
	}, childEnv("KUBECONFIG="+kubeconfigPath,
		"MONGODB_URI="+mongo.value, "MONGODB_DATABASE="+database,
		"POD_NAMESPACE="+appPod.Namespace, "POD_NAME="+appPod.Name, "POD_UID="+appPod.UID,
		"LEASE_MANAGER_URL=http://"+managerAddr, "LEASE_INTERNAL_SECRET="+internalSecret))
	Expect(err).NotTo(HaveOccurred())

	launched := time.Now()
	waitReady(managerProc, "http://"+probeAddr+"/readyz")
	waitReady(agentProc, "http://"+agentInternalAddr+"/readyz")
	GinkgoWriter.Printf("e2e: manager and agent ready %v after their start\n", time.Since(launched).Round(time.Millisecond))

	managerAPI = newAPIClient("manager", managerAddr, "")
	agentAPI = newAPIClient("agent", agentAPIAddr, "")
	metricsURL = "http://" + metricsAddr + "/metrics"
	agentMetricsURL = "http://" + agentInternalAddr + "/metrics"
}, NodeTimeout(8*time.Minute))

var _ = AfterSuite(func(ctx SpecContext) {
	// Everything is stopped before anything is asserted. The processes go first: they would
	// log errors once the store and the API server are gone.
	agentErr := agentProc.stop()
	managerErr := managerProc.stop()
	if store != nil {
		_ = store.Drop(ctx)
		_ = store.Close(ctx)
	}
	var envErr error
	if env != nil {
		envErr = env.Stop()
	}
	mongotest.Stop()
	Expect(agentErr).NotTo(HaveOccurred(), "the agent should run until the end of the suite")
	Expect(managerErr).NotTo(HaveOccurred(), "the manager should run until the end of the suite")
	Expect(envErr).NotTo(HaveOccurred(), "stopping the control plane")
}, NodeTimeout(2*time.Minute))

// On a failure the processes' logs are the first thing to read.
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() {
		return
	}
	for _, p := range []*process{managerProc, agentProc} {
		if p != nil {
			GinkgoWriter.Printf("\n---- %s\n", p.describe())
		}
	}
	dumpStore()
})

// dumpStore writes every holder and counter of the store to the GinkgoWriter.
func dumpStore() {
	if store == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	GinkgoWriter.Printf("\n---- store\n")
	hs, err := store.ListHolders(ctx, leasestore.HolderFilter{})
	if err != nil {
		GinkgoWriter.Printf("holders: %v\n", err)
	}
	for _, h := range hs {
		GinkgoWriter.Printf("holder %s %s %s/%s user=%s pod=%s uid=%s levels=%v acquired=%s lastSeen=%s\n",
			h.Token, h.State, h.Tenant, h.Project, h.User, h.Pod, h.Pod.UID, h.Levels,
			h.AcquiredAt.Format(time.RFC3339Nano), h.LastSeenAt.Format(time.RFC3339Nano))
	}
	cs, err := store.ListCounters(ctx, leasestore.CounterFilter{})
	if err != nil {
		GinkgoWriter.Printf("counters: %v\n", err)
	}
	for _, c := range cs {
		GinkgoWriter.Printf("counter %s count=%d booked=%d updated=%s\n", c.Key, c.Count, c.Booked, c.UpdatedAt.Format(time.RFC3339Nano))
	}
}

// The work directory goes away after a successful run, unless E2E_KEEP is set.
var _ = ReportAfterSuite("work directory", func(r Report) {
	if workDir == "" {
		return
	}
	switch {
	case !r.SuiteSucceeded:
		_, _ = fmt.Fprintf(os.Stderr, "e2e: the suite failed; binary, kubeconfig and process logs kept in %s\n", workDir)
	case os.Getenv("E2E_KEEP") != "":
		_, _ = fmt.Fprintf(os.Stderr, "e2e: E2E_KEEP is set; binary, kubeconfig and process logs kept in %s\n", workDir)
	default:
		_ = os.RemoveAll(workDir)
	}
})

// waitReady waits until url answers 200, failing early with the log when p exits.
func waitReady(p *process, url string) {
	GinkgoHelper()
	c := &http.Client{Timeout: 2 * time.Second}
	Eventually(func(g Gomega) {
		if p.exited() {
			StopTrying(p.name + " exited before it was ready").Now()
		}
		resp, err := c.Get(url)
		g.Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		g.Expect(resp.StatusCode).To(Equal(http.StatusOK))
	}).WithTimeout(90*time.Second).Should(Succeed(), func() string { return p.describe() })
}

// applySamples creates the LeaseDefinitions of config/samples in namespace, as
// `kubectl apply -k config/samples -n default` does.
func applySamples(ctx context.Context, dir string) {
	GinkgoHelper()
	entries, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	for _, e := range entries {
		if e.IsDir() || e.Name() == "kustomization.yaml" || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		var ld leasev1alpha1.LeaseDefinition
		Expect(yaml.UnmarshalStrict(data, &ld)).To(Succeed(), e.Name())
		Expect(ld.Kind).To(Equal("LeaseDefinition"), e.Name())
		ld.Namespace = namespace
		Expect(k8sClient.Create(ctx, &ld)).To(Succeed(), e.Name())
		sampleNames = append(sampleNames, ld.Name)
	}
	Expect(sampleNames).NotTo(BeEmpty(), "no samples in %s", dir)
}

// createRunningPod creates a pod and reports it Running at ip through the status
// subresource, as a kubelet would (envtest runs none). Without a node the pod is deleted at
// once, with no grace period.
func createRunningPod(ctx context.Context, name, ip string) lease.PodRef {
	GinkgoHelper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: name, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
	return lease.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
}
