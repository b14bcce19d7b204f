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
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
	"github.com/vancetope/lease-operator/internal/testutil/kwoktest"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

const (
	// namespace holds the app pod app-0; it is tenant's (labelled by config/samples), and
	// every spec that acquires through agentAPI or managerAPI does so as tenant, in a project
	// of its own. A pod acts only for its namespace's tenant (docs/tenancy.md).
	namespace = "acme"
	tenant    = "acme"
	// otherNamespace holds the second tenant's pod, otherPodName at otherPodIP, with an agent
	// of its own: the suite's two labelled namespaces.
	otherNamespace = "globex"
	otherTenant    = "globex"
	otherPodName   = "app-0"
	otherPodIP     = "127.0.0.4"
	// systemNamespace is the manager's --system-namespace, as under make run; the samples put
	// the system layer there (config/samples/namespaces.yaml).
	systemNamespace = "lease-system"
	// builtinConfigMap is the built-in layer shared by the manager and the agent; it defines
	// the lease builtinOnlyLease, which no LeaseDefinition mentions.
	builtinConfigMap = "builtin-definitions"
	builtinOnlyLease = "e2ebuiltin"
	// appPodName is the pod the agent runs in; it carries podIP 127.0.0.1, so the manager
	// attributes the suite's own calls (source 127.0.0.1) to it as well: the manager runs
	// without --allow-non-pod-callers, as deployed.
	appPodName = "app-0"
	appPodIP   = "127.0.0.1"
	// adminSecret is the bearer secret of the manager's operator API.
	adminSecret = "s3cret"
	// internalSecret protects the agent's revocation endpoint, shared by manager and agent as
	// in a real installation.
	internalSecret = "e2e-internal-secret"
	// handMadeScheduler is the scheduler the suite's hand-made pods name: no scheduler has
	// that name, so kwok never runs them and their status stays what the suite sets.
	handMadeScheduler = "e2e-hand-made"
)

var (
	suiteT    *testing.T
	assetsDir string
	kwokBin   string
	// kwok runs the pods the suite lets be scheduled (docs/testing.md, "Pods that run").
	kwok    *kwoktest.Cluster
	workDir string // the binary, the kubeconfig and the process logs

	env       *testenv.Env
	k8sClient client.Client
	store     *leasestore.Store

	managerProc *process
	agentProc   *process
	// otherAgentProc is the agent of otherNamespace's pod.
	otherAgentProc *process
	// bareAgentProc is an agent whose manager URL leads nowhere: it never reaches its
	// manager, so it never learns its tenant or a definition.
	bareAgentProc *process

	// managerAddr is the manager's admission API (host:port); adminAddr its operator API, on a
	// listener of its own.
	managerAddr string
	adminAddr   string
	// managerAPI and agentAPI call from 127.0.0.1: as pod app-0.
	managerAPI *apiClient
	agentAPI   *apiClient
	// adminAPI calls the manager's operator API.
	adminAPI *apiClient
	// bareAgentAPI calls bareAgentProc; bareAgentReadyURL is its /readyz.
	bareAgentAPI      *apiClient
	bareAgentReadyURL string
	// otherAgentAPI is the other tenant's agent; otherManagerAPI calls the manager from
	// otherPodIP, as that tenant's pod.
	otherAgentAPI   *apiClient
	otherManagerAPI *apiClient
	// managerBin is the built binary, mongoURI and database the store, for the processes that
	// specs start of their own.
	managerBin string
	mongoURI   string
	database   string
	// managerInternalPort is the managers' --agent-internal-port, app-0's agent's.
	managerInternalPort int
	metricsURL          string
	// kubeconfigPath is a cluster administrator's kubeconfig, for the kubectl binary.
	kubeconfigPath string
	// sampleKeys are the LeaseDefinitions applied from config/samples.
	sampleKeys []client.ObjectKey
	// agentMetricsURL is the agent's metrics, on its internal port.
	agentMetricsURL string
	// appPod is the agent's identity (and the pod the manager sees at 127.0.0.1).
	appPod lease.PodRef
	// otherPod is the other agent's identity (and the pod the manager sees at otherPodIP).
	otherPod lease.PodRef
)

func TestE2E(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	kwokBin = kwoktest.BinaryOrSkip(t)
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

	// The webhook configurations of config/webhook point at the manager's webhook server,
	// which serves pod admission's gate (--pod-admission-webhook, below).
	// With the aggregation layer, for the live API a manager serves (watch_test.go).
	aggregation, err := aggregatortest.FrontProxyFlags(workDir)
	Expect(err).NotTo(HaveOccurred())
	env, err = testenv.Start(assetsDir, testenv.Options{Webhooks: true, APIServerFlags: aggregation})
	Expect(err).NotTo(HaveOccurred(), "starting the control plane")
	cfg := env.Config
	GinkgoWriter.Printf("e2e: control plane ready in %v\n", time.Since(begin).Round(time.Millisecond))
	// Pods run: kwok plays the kubelet of one node, a binder schedules onto it
	// (docs/testing.md). The suite's hand-made pods name another scheduler and stay unbound.
	kwok, err = kwoktest.Start(ctx, cfg, kwoktest.Options{Bin: kwokBin, Dir: filepath.Join(workDir, "kwok")})
	Expect(err).NotTo(HaveOccurred(), "starting kwok")
	GinkgoWriter.Printf("e2e: kwok's node %s Ready in %v\n", kwok.NodeName, kwok.Startup.Round(time.Millisecond))

	// The processes get a cluster admin's kubeconfig.
	admin, err := env.AddUser(envtest.User{Name: "e2e-admin", Groups: []string{"system:masters"}}, cfg)
	Expect(err).NotTo(HaveOccurred())
	kubeconfig, err := admin.KubeConfig()
	Expect(err).NotTo(HaveOccurred())
	kubeconfigPath = filepath.Join(workDir, "kubeconfig")
	Expect(os.WriteFile(kubeconfigPath, kubeconfig, 0o600)).To(Succeed())

	k8sClient = env.Client

	applySamples(ctx, filepath.Join(root, "config", "samples"))
	Expect(k8sClient.Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: builtinConfigMap},
		Data: map[string]string{builtinOnlyLease + ".yaml": "name: " + builtinOnlyLease + "\nresource: e2e-pool\n" +
			"levels: {global: 4, tenant: 2, user: 1}\nttlSeconds: 90\nwaitMs: 0\n"},
	})).To(Succeed())
	appPod = createRunningPod(ctx, namespace, appPodName, appPodIP)
	Expect(k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name: otherNamespace, Labels: map[string]string{tenancy.TenantLabel: otherTenant}}})).To(Succeed())
	otherPod = createRunningPod(ctx, otherNamespace, otherPodName, otherPodIP)

	var mongo result
	Eventually(started).WithTimeout(2*time.Minute).Should(Receive(&mongo), "the test MongoDB to start")
	Expect(mongo.err).NotTo(HaveOccurred(), "test MongoDB")
	mongoURI = mongo.value
	database = mongotest.DatabaseName(suiteT)
	store, err = leasestore.Connect(mongo.value, database)
	Expect(err).NotTo(HaveOccurred())

	var bin result
	Eventually(built).WithTimeout(20*time.Minute).Should(Receive(&bin), "the manager binary to build")
	Expect(bin.err).NotTo(HaveOccurred(), "building the manager")
	managerBin = bin.value

	ports, err := freePorts(11)
	Expect(err).NotTo(HaveOccurred())
	local := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
	managerAddr, adminAddr = local(ports[0]), local(ports[9])
	probeAddr, metricsAddr, agentAPIAddr := local(ports[1]), local(ports[2]), local(ports[3])
	agentInternalPort := ports[4]
	agentInternalAddr := local(agentInternalPort)
	bareAgentAPIAddr, bareAgentInternalAddr := local(ports[5]), local(ports[6])
	otherAgentAPIAddr, otherAgentInternalAddr := local(ports[7]), local(ports[8])

	managerInternalPort = agentInternalPort
	// The port envtest chose minutes ago, before the build, may be taken by now.
	Expect(env.RebindWebhooks(ctx)).To(Succeed())
	wio := &env.WebhookInstallOptions
	managerProc = startManager("manager", managerAddr, metricsAddr, probeAddr, "--admin-bind-address", adminAddr,
		"--pod-admission-webhook", "--webhook-port", strconv.Itoa(wio.LocalServingPort), "--webhook-cert-dir", wio.LocalServingCertDir)

	managerURL := "http://" + managerAddr
	agentProc = startAgent("agent", appPod, appPodIP, agentAPIAddr, agentInternalAddr, managerURL)
	// Nothing listens on ports[10]: the bare agent's manager is unreachable.
	bareAgentProc = startAgent("bare-agent", appPod, appPodIP, bareAgentAPIAddr, bareAgentInternalAddr, "http://"+local(ports[10]))
	otherAgentProc = startAgent("other-agent", otherPod, otherPodIP, otherAgentAPIAddr, otherAgentInternalAddr, managerURL)

	launched := time.Now()
	waitReady(managerProc, "http://"+probeAddr+"/readyz")
	waitReady(agentProc, "http://"+agentInternalAddr+"/readyz")
	waitReady(otherAgentProc, "http://"+otherAgentInternalAddr+"/readyz")
	bareAgentReadyURL = "http://" + bareAgentInternalAddr + "/readyz"
	GinkgoWriter.Printf("e2e: manager and agent ready %v after their start\n", time.Since(launched).Round(time.Millisecond))

	managerAPI = newAPIClient("manager", managerAddr, "")
	adminAPI = newAPIClient("manager's operator API", adminAddr, "")
	agentAPI = newAPIClient("agent", agentAPIAddr, "")
	bareAgentAPI = newAPIClient("bare-agent", bareAgentAPIAddr, "")
	otherAgentAPI = newAPIClient("other-agent", otherAgentAPIAddr, "")
	otherManagerAPI = newAPIClient("manager (from "+otherNamespace+"/"+otherPodName+")", managerAddr, otherPodIP)
	metricsURL = "http://" + metricsAddr + "/metrics"
	agentMetricsURL = "http://" + agentInternalAddr + "/metrics"
}, NodeTimeout(8*time.Minute))

var _ = AfterSuite(func(ctx SpecContext) {
	// Everything is stopped before anything is asserted. The processes go first: they would
	// log errors once the store and the API server are gone.
	bareAgentErr := bareAgentProc.stop()
	otherAgentErr := otherAgentProc.stop()
	agentErr := agentProc.stop()
	managerErr := managerProc.stop()
	if store != nil {
		_ = store.Drop(ctx)
		_ = store.Close(ctx)
	}
	var kwokErr, envErr error
	if kwok != nil {
		kwokErr = kwok.Stop()
	}
	if env != nil {
		envErr = env.Stop()
	}
	mongotest.Stop()
	expectNoTokenInLogs()
	Expect(agentErr).NotTo(HaveOccurred(), "the agent should run until the end of the suite")
	Expect(bareAgentErr).NotTo(HaveOccurred(), "the agent without a manager should run until the end of the suite")
	Expect(otherAgentErr).NotTo(HaveOccurred(), "the other tenant's agent should run until the end of the suite")
	Expect(managerErr).NotTo(HaveOccurred(), "the manager should run until the end of the suite")
	Expect(kwokErr).NotTo(HaveOccurred(), "stopping kwok")
	Expect(envErr).NotTo(HaveOccurred(), "stopping the control plane")
}, NodeTimeout(2*time.Minute))

// expectNoTokenInLogs fails the suite when the log of any process it ran (managers, agents, kwok)
// carries a token the suite was handed, or an admission API path with any token: a token is a
// bearer secret, and logs name a holder by its ID (docs/security.md, "Tokens"). It runs once
// every process has stopped, before the work directory with the logs may go.
func expectNoTokenInLogs() {
	GinkgoHelper()
	tokens, logs := handedOut.List(), logPaths()
	if kwok != nil {
		logs = append(logs, filepath.Join(kwok.Dir, "kwok.log"))
	}
	GinkgoWriter.Printf("e2e: scanning %d process logs for %d tokens handed out\n", len(logs), len(tokens))
	if cfg, _ := GinkgoConfiguration(); agentAPI != nil && len(cfg.FocusStrings) == 0 && len(cfg.SkipStrings) == 0 && cfg.LabelFilter == "" {
		// The whole suite ran (BeforeSuite got through): a scan for no token would pass
		// whatever the logs hold.
		Expect(tokens).NotTo(BeEmpty(), "the suite recorded no token it was handed")
	}
	hits, err := tokenscan.ScanFiles(tokens, logs...)
	Expect(err).NotTo(HaveOccurred(), "scanning the process logs")
	var b strings.Builder
	for i, h := range hits {
		if i == 20 {
			fmt.Fprintf(&b, "… and %d more\n", len(hits)-i)
			break
		}
		b.WriteString(h.String() + "\n")
	}
	if len(hits) > 0 {
		Fail(fmt.Sprintf("%d lines of the process logs carry a token (logs kept in %s):\n%s", len(hits), workDir, b.String()))
	}
}

// On a failure the processes' logs are the first thing to read.
var _ = AfterEach(func() {
	if !CurrentSpecReport().Failed() {
		return
	}
	for _, p := range []*process{managerProc, agentProc, bareAgentProc, otherAgentProc} {
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

// applySamples creates the namespaces and LeaseDefinitions of config/samples where they say,
// as `kubectl apply -k config/samples` does: Namespaces first.
func applySamples(ctx context.Context, dir string) {
	GinkgoHelper()
	entries, err := os.ReadDir(dir)
	Expect(err).NotTo(HaveOccurred())
	var defs []*leasev1alpha1.LeaseDefinition
	for _, e := range entries {
		if e.IsDir() || e.Name() == "kustomization.yaml" || !strings.HasSuffix(e.Name(), ".yaml") {
			continue
		}
		data, err := os.ReadFile(filepath.Join(dir, e.Name()))
		Expect(err).NotTo(HaveOccurred())
		if e.Name() == "namespaces.yaml" {
			for _, doc := range strings.Split(string(data), "\n---\n") {
				var ns corev1.Namespace
				Expect(yaml.UnmarshalStrict([]byte(doc), &ns)).To(Succeed(), e.Name())
				Expect(k8sClient.Create(ctx, &ns)).To(Succeed(), e.Name())
			}
			continue
		}
		var ld leasev1alpha1.LeaseDefinition
		Expect(yaml.UnmarshalStrict(data, &ld)).To(Succeed(), e.Name())
		Expect(ld.Kind).To(Equal("LeaseDefinition"), e.Name())
		defs = append(defs, &ld)
	}
	for _, ld := range defs {
		Expect(k8sClient.Create(ctx, ld)).To(Succeed(), ld.Name)
		sampleKeys = append(sampleKeys, client.ObjectKeyFromObject(ld))
	}
	Expect(sampleKeys).NotTo(BeEmpty(), "no samples in %s", dir)
}

// startManager starts a manager as the suite runs it, with extra flags.
func startManager(name, apiAddr, metricsAddr, probeAddr string, extra ...string) *process {
	GinkgoHelper()
	p, err := startProcess(name, workDir, managerBin, append([]string{
		"--api-bind-address", apiAddr,
		"--metrics-bind-address", metricsAddr,
		"--health-probe-bind-address", probeAddr,
		"--reap-interval", "1h",
		"--admin-secret", adminSecret,
		"--agent-internal-port", strconv.Itoa(managerInternalPort),
		"--mongodb-uri", mongoURI,
		"--mongodb-database", database,
		"--system-namespace", systemNamespace,
		"--builtin-configmap", builtinConfigMap,
	}, extra...), childEnv("KUBECONFIG="+kubeconfigPath, "LEASE_INTERNAL_SECRET="+internalSecret))
	Expect(err).NotTo(HaveOccurred())
	return p
}

// startAgent starts an agent as the webhook injects it into pod: store, identity and the
// manager's URL from the environment, and no kubeconfig: the agent asks the manager for its
// tenant and definitions. Its connections to the manager leave from podIP, so that the
// manager finds pod by their source address, as in a cluster.
func startAgent(name string, pod lease.PodRef, podIP, apiAddr, internalAddr, managerURL string) *process {
	GinkgoHelper()
	p, err := startProcess(name, workDir, agentBinOf(managerBin), []string{
		"--api-bind-address", apiAddr,
		"--internal-bind-address", internalAddr,
		"--manager-source-ip", podIP,
	}, childEnv("MONGODB_URI="+mongoURI, "MONGODB_DATABASE="+database,
		"POD_NAMESPACE="+pod.Namespace, "POD_NAME="+pod.Name, "POD_UID="+pod.UID,
		settings.EnvManagerURL+"="+managerURL, "LEASE_INTERNAL_SECRET="+internalSecret))
	Expect(err).NotTo(HaveOccurred())
	return p
}

// createRunningPod creates a pod in ns and reports it Running at ip through the status
// subresource, as a kubelet would (envtest runs none). Without a node the pod is deleted at
// once, with no grace period.
func createRunningPod(ctx context.Context, ns, name, ip string) lease.PodRef {
	GinkgoHelper()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: map[string]string{"app": name}},
		// Another scheduler's: the binder leaves it alone, so kwok never runs it, and its
		// status is the suite's.
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}, SchedulerName: handMadeScheduler},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
	return lease.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
}

// boundedHTTP is for the suite's plain GETs: a server that stops answering fails the spec
// (or the poll of its Eventually) instead of hanging it.
var boundedHTTP = &http.Client{Timeout: 10 * time.Second}
