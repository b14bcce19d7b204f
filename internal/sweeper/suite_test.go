package sweeper_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"testing"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/events"
	"k8s.io/utils/clock"
	testingclock "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/revocation/handlers/k8ssecret"
	"github.com/vancetope/lease-operator/internal/revocation/podevents"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// sharedSecret protects the stand-in agents' receivers, as in production.
const sharedSecret = "suite-secret"

var (
	suiteT    *testing.T
	assetsDir string
	env       *testenv.Env
	cfg       *rest.Config
	k8sClient client.Client
	mongoURI  string
	recorder  events.EventRecorder
	stopBcast context.CancelFunc
)

func TestMain(m *testing.M) {
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

func TestSweeper(t *testing.T) {
	assetsDir = testenv.AssetsOrSkip(t)
	suiteT = t
	RegisterFailHandler(Fail)
	RunSpecs(t, "Sweeper and Revocation Suite")
}

var _ = BeforeSuite(func() {
	testenv.ConfigureGomega(15 * time.Second)

	var err error
	mongoURI, err = mongotest.URI()
	Expect(err).NotTo(HaveOccurred(), "test MongoDB")

	env, err = testenv.Start(assetsDir, testenv.Options{})
	Expect(err).NotTo(HaveOccurred())
	cfg, k8sClient = env.Config, env.Client
	scheme := env.Scheme

	// The manager's event recorder is the same thing: an events/v1 broadcaster.
	cs, err := kubernetes.NewForConfig(cfg)
	Expect(err).NotTo(HaveOccurred())
	bcast := events.NewBroadcaster(&events.EventSinkImpl{Interface: cs.EventsV1()})
	ctx, cancel := context.WithCancel(context.Background())
	stopBcast = cancel
	Expect(bcast.StartRecordingToSinkWithContext(ctx)).To(Succeed())
	recorder = bcast.NewRecorder(scheme, "lease-operator")
})

var _ = AfterSuite(func() {
	if stopBcast != nil {
		stopBcast()
	}
	if env != nil {
		Expect(env.Stop()).To(Succeed())
	}
})

// fixture is one spec's world: a namespace, a store, this process's pod ("the manager"),
// the pod watcher, the dispatcher and the sweeper, all running; plus a stand-in agent.
type fixture struct {
	ns       string
	database string
	store    *leasestore.Store
	self     lease.PodRef
	selfHub  *notify.Hub
	watcher  *podwatch.Watcher
	disp     *revocation.Dispatcher
	sweeper  *sweeper.Sweeper
	clock    *testingclock.FakeClock
	interval time.Duration
	metrics  *metrics.Metrics
	registry *prometheus.Registry
	agent    *agent
}

type fixtureOptions struct {
	// agentDown: the stand-in agent's port is closed (forwards fail).
	agentDown bool
	// interval of the sweeper (default one hour: only PodGone or a test's Step reaps).
	interval time.Duration
	// storeOpts for the store (e.g. a short reconcile safety margin).
	storeOpts []leasestore.Option
	// mcpEndpoints are the operator's MCP endpoints (--mcp-endpoints) the reaper may contact.
	mcpEndpoints []string
}

// agent stands in for the lease agent of holder pods: the real receiver with its own hub.
type agent struct {
	hub  *notify.Hub
	port int
	srv  *httptest.Server
}

func newFixture(ctx context.Context, o fixtureOptions) *fixture {
	f := &fixture{interval: o.interval, registry: prometheus.NewRegistry()}
	if f.interval == 0 {
		f.interval = time.Hour
	}
	f.ns = freshNamespace(ctx)

	f.database = mongotest.DatabaseName(suiteT)
	s, err := leasestore.Connect(mongoURI, f.database, o.storeOpts...)
	Expect(err).NotTo(HaveOccurred())
	Expect(s.EnsureIndexes(ctx)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		_ = s.Drop(ctx)
		_ = s.Close(ctx)
	})
	f.store = s

	// This process runs in a pod of its own.
	f.self = f.createPod(ctx, "manager-0", "10.9.0.1")

	// The stand-in agent listens on 127.0.0.1; holder pods that "run an agent" get that IP.
	f.agent = &agent{hub: notify.NewHub(time.Minute, clock.RealClock{})}
	f.agent.srv = httptest.NewUnstartedServer(nil)
	DeferCleanup(f.agent.srv.Close)
	f.agent.port = f.agent.srv.Listener.Addr().(*net.TCPAddr).Port
	if o.agentDown {
		Expect(f.agent.srv.Listener.Close()).To(Succeed())
	}

	f.selfHub = notify.NewHub(time.Minute, clock.RealClock{})
	f.metrics = metrics.New(f.registry)
	f.clock = testingclock.NewFakeClock(time.Now())

	f.watcher, err = podwatch.New(cfg, podwatch.WithSelf(f.self), podwatch.WithNamespaces(f.ns), podwatch.WithLogger(GinkgoLogr))
	Expect(err).NotTo(HaveOccurred())
	registry := handlers.NewDefaultRegistry(f.selfHub,
		k8ssecret.Reader{Reader: k8sClient}, nil, o.mcpEndpoints...)
	f.disp = revocation.NewDispatcher(f.watcher, f.self, registry,
		revocation.WithForwarder(agentlink.NewHTTPForwarder(nil, f.agent.port, sharedSecret)),
		revocation.WithRecorder(podevents.New(recorder)),
		revocation.WithMetrics(f.metrics),
		revocation.WithRegisterer(f.registry),
		revocation.WithLogger(GinkgoLogr.WithName("dispatcher")),
		revocation.WithTimeout(10*time.Second))
	f.sweeper = sweeper.New(f.store, f.watcher, f.disp,
		sweeper.WithInterval(f.interval), sweeper.WithClock(f.clock), sweeper.WithMetrics(f.metrics),
		sweeper.WithLogger(GinkgoLogr.WithName("sweeper")))
	f.watcher.OnPodGone(f.sweeper.PodGone)

	runCtx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for _, r := range []interface{ Start(context.Context) error }{f.watcher, f.disp, f.sweeper} {
		wg.Go(func() {
			defer GinkgoRecover()
			Expect(r.Start(runCtx)).To(Succeed())
		})
	}
	DeferCleanup(func() {
		cancel()
		wg.Wait()
	})
	Expect(f.watcher.WaitForSync(ctx)).To(BeTrue())
	return f
}

// serveAgent starts the stand-in agent as the agent of pod (the receiver checks the pod).
func (f *fixture) serveAgent(pod lease.PodRef) {
	mux := http.NewServeMux()
	mux.Handle("POST "+agentlink.ReceiverPath, agentlink.NewReceiver(pod,
		handlers.NewDefaultRegistry(f.agent.hub, nil, nil),
		agentlink.WithAgentKey(agentlink.AgentKey(sharedSecret, pod.Namespace)), agentlink.WithReceiverLogger(GinkgoLogr.WithName("agent"))))
	f.agent.srv.Config.Handler = mux
	f.agent.srv.Start()
}

// freshNamespace creates a namespace (with its default ServiceAccount: envtest runs no
// controller-manager) for one spec and deletes it afterwards.
func freshNamespace(ctx context.Context) string {
	ns := testenv.FreshNamespace(ctx, k8sClient, "sweep", nil)
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "default"}}
	Expect(k8sClient.Create(ctx, sa)).To(Succeed())
	return ns
}

// createPod creates a running pod with ip (no kubelet: the test sets the status) and waits
// until the watcher sees it alive.
func (f *fixture) createPod(ctx context.Context, name, ip string) lease.PodRef {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: f.ns, Name: name, Labels: map[string]string{"app": name}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
	ref := podwatch.RefOf(pod)
	if f.watcher != nil {
		// Running with its address, as the informer sees it (a pod not started yet is alive
		// already, without one).
		Eventually(func() bool {
			_, ok := f.watcher.Endpoint(ref)
			return ok
		}).Should(BeTrue())
	}
	return ref
}

// setPhase sets a pod's phase through the status subresource.
func setPhase(ctx context.Context, ref lease.PodRef, phase corev1.PodPhase) {
	pod := &corev1.Pod{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ref.Namespace, Name: ref.Name}, pod)).To(Succeed())
	pod.Status.Phase = phase
	Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
}

func deletePod(ctx context.Context, ref lease.PodRef) {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ref.Namespace, Name: ref.Name}}
	Expect(k8sClient.Delete(ctx, pod, client.GracePeriodSeconds(0))).To(Succeed())
}

// acquire books one slot of resource for pod (tenant t, project p, user u; caps 1/1/2/10).
func (f *fixture) acquire(ctx context.Context, typ, resource string, pod lease.PodRef, podBound bool, ttl time.Duration, payload map[string]string) lease.Holder {
	h, err := f.store.Acquire(ctx, leasestore.AcquireRequest{
		LeaseName: resource, Resource: resource, Type: typ,
		Caps: []lease.LevelCap{
			{Level: lease.LevelUser, Cap: 1}, {Level: lease.LevelProject, Cap: 1},
			{Level: lease.LevelTenant, Cap: 2}, {Level: lease.LevelGlobal, Cap: 10},
		},
		Tenant: "acme", Project: "p-" + pod.Name, User: "u-" + pod.Name, HolderRef: "job",
		Pod: pod, PodBound: podBound, Payload: payload, TTL: ttl,
	})
	Expect(err).NotTo(HaveOccurred())
	return h
}

// held reports whether the holder still exists.
func (f *fixture) held(ctx context.Context, token string) bool {
	_, err := f.store.GetHolder(ctx, token)
	if err != nil {
		Expect(err).To(MatchError(lease.ErrLost))
		return false
	}
	return true
}

// counts returns count per counter key of resource.
func (f *fixture) counts(ctx context.Context, resource string) map[string]int {
	cs, err := f.store.ListCounters(ctx, leasestore.CounterFilter{Resource: resource})
	Expect(err).NotTo(HaveOccurred())
	out := map[string]int{}
	for _, c := range cs {
		out[string(c.Level)] = c.Count
	}
	return out
}

// published returns the event a hub holds for token (a long-poll arriving now gets it)
// (the zero Event when there is none).
func published(hub *notify.Hub, token string) func() notify.Event {
	return func() notify.Event {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		defer cancel()
		ev, _ := hub.Wait(ctx, token)
		return ev
	}
}

// podEvents returns "reason/action" of the events regarding pod name in ns.
func podEvents(ctx context.Context, ns, name string) func() []string {
	return func() []string {
		var list eventsv1.EventList
		Expect(k8sClient.List(ctx, &list, client.InNamespace(ns))).To(Succeed())
		var out []string
		for _, e := range list.Items {
			if e.Regarding.Kind == "Pod" && e.Regarding.Name == name {
				out = append(out, e.Reason+"/"+e.Action+": "+e.Note)
			}
		}
		return out
	}
}
