package sweeper_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/revocation/handlers/k8ssecret"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// mcpServer stands in for a remote MCP server and records the requests it gets.
type mcpServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string
}

func newMCPServer() *mcpServer {
	m := &mcpServer{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.requests = append(m.requests, r.Method+" "+r.URL.Path+" session="+r.Header.Get("Mcp-Session-Id")+" auth="+r.Header.Get("Authorization"))
		m.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	DeferCleanup(m.Close)
	return m
}

// createMCPConfig creates the namespace's mcp configuration Secret for endpoint (token ""
// for an unauthenticated server).
func createMCPConfig(ctx context.Context, ns, name, endpoint, token string) {
	data := map[string][]byte{handlers.MCPSecretEndpointKey: []byte(endpoint)}
	if token != "" {
		data[handlers.DefaultAuthSecretKey] = []byte(token)
	}
	Expect(k8sClient.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name,
			Labels: map[string]string{handlers.MCPAuthSecretLabel: "true"}},
		Data: data,
	})).To(Succeed())
}

func (m *mcpServer) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string{}, m.requests...)
}

// revoke is the operator's revoke: delete the holder, then dispatch it.
func (f *fixture) revoke(ctx context.Context, hs ...lease.Holder) {
	var revoked []lease.Holder
	for _, h := range hs {
		r, ok, err := f.store.Revoke(ctx, h.Token, "")
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		revoked = append(revoked, r)
	}
	f.disp.Revoked(ctx, "revoke", revoked)
}

func (f *fixture) reaps(reason string) float64 {
	return promtestutil.ToFloat64(f.metrics.Reap.WithLabelValues(reason))
}

var noEvent = BeZero()

var _ = Describe("Revocation dispatch on real pods", func() {
	It("runs the handler locally when the holder pod is this process's pod", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		h := f.acquire(ctx, "tex", "tex2pdf", f.self, true, time.Hour, map[string]string{"jobId": "j1"})

		f.revoke(ctx, h)

		Eventually(published(f.selfHub, h.Token)).Should(HaveField("Reason", "revoke"))
		Expect(published(f.agent.hub, h.Token)()).To(noEvent)
		Eventually(podEvents(ctx, f.ns, f.self.Name)).Should(ContainElement(
			MatchRegexp(`^LeaseRevoked/RunHandler: Lease lh-[0-9a-f]{24} \(type tex, resource tex2pdf\) revoked \(revoke\): handler ran in this pod$`)))
		Expect(f.reaps("revoke")).To(Equal(1.0))
	})

	It("forwards to the agent of a holder pod alive elsewhere, even when not pod-bound", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		mcp := newMCPServer()
		pod := f.createPod(ctx, "brain-1", "127.0.0.1")
		f.serveAgent(pod)
		h := f.acquire(ctx, "mcp", "browser", pod, false, time.Hour,
			map[string]string{"endpoint": mcp.URL + "/mcp", "sessionId": "s1"})

		f.revoke(ctx, h)

		Eventually(published(f.agent.hub, h.Token)).Should(And(HaveField("Reason", "revoke"), HaveField("Type", "mcp")))
		Eventually(podEvents(ctx, f.ns, pod.Name)).Should(ContainElement(HavePrefix("LeaseRevoked/Forward:")))
		Expect(published(f.selfHub, h.Token)()).To(noEvent)
		Consistently(mcp.got).Should(BeEmpty(), "the session lives on in a live pod; only its app closes it")
	})

	It("only releases when a pod-bound holder's pod is dead", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		pod := f.createPod(ctx, "tex-1", "127.0.0.1")
		f.serveAgent(pod) // still answering: nothing may be sent to it once the pod is dead
		h := f.acquire(ctx, "tex", "tex2pdf", pod, true, time.Hour, nil)

		deletePod(ctx, pod)

		Eventually(func() bool { return f.held(ctx, h.Token) }).Should(BeFalse())
		// The reaper deletes the holder first and decrements second: wait for both.
		Eventually(func() map[string]int { return f.counts(ctx, "tex2pdf") }).Should(HaveEach(0))
		Eventually(podEvents(ctx, f.ns, pod.Name)).Should(ContainElement(
			HaveSuffix("revoked (pod): slot released; the pod-bound resource died with the pod")))
		Consistently(published(f.agent.hub, h.Token)).Should(noEvent)
		Expect(published(f.selfHub, h.Token)()).To(noEvent)
		Expect(f.reaps("pod")).To(Equal(1.0))
	})

	It("deletes the remote session on the reaper when a non-pod-bound holder's pod is dead", func(ctx SpecContext) {
		mcp := newMCPServer()
		f := newFixture(ctx, fixtureOptions{mcpEndpoints: []string{mcp.URL + "/mcp"}})
		createMCPConfig(ctx, f.ns, "mcp-auth", mcp.URL+"/mcp", "s3cret")
		pod := f.createPod(ctx, "brain-2", "10.9.0.2")
		h := f.acquire(ctx, "mcp", "browser", pod, false, time.Hour,
			map[string]string{"endpoint": mcp.URL + "/mcp", "sessionId": "sess-9", "authSecret": "mcp-auth"})

		setPhase(ctx, pod, corev1.PodFailed) // the pod finished: dead, though its object remains

		Eventually(mcp.got).Should(Equal([]string{"DELETE /mcp session=sess-9 auth=Bearer s3cret"}))
		Expect(f.held(ctx, h.Token)).To(BeFalse())
		Eventually(podEvents(ctx, f.ns, pod.Name)).Should(ContainElement(
			HaveSuffix("revoked (pod): handler ran on the reaper with the holder's payload")))
		Expect(published(f.selfHub, h.Token)()).To(noEvent)
	})

	It("does not contact an endpoint that only the payload names", func(ctx SpecContext) {
		configured, elsewhere := newMCPServer(), newMCPServer()
		// Both are the operator's: the tenant's Secret still narrows to the one it names.
		f := newFixture(ctx, fixtureOptions{mcpEndpoints: []string{configured.URL + "/mcp", elsewhere.URL + "/mcp"}})
		createMCPConfig(ctx, f.ns, "mcp-auth", configured.URL+"/mcp", "s3cret")
		pod := f.createPod(ctx, "brain-4", "10.9.0.4")
		h := f.acquire(ctx, "mcp", "browser", pod, false, time.Hour,
			map[string]string{"endpoint": elsewhere.URL + "/mcp", "sessionId": "sess-4", "authSecret": "mcp-auth"})

		deletePod(ctx, pod)

		Eventually(podEvents(ctx, f.ns, pod.Name)).Should(ContainElement(
			MatchRegexp(`^LeaseRevocationFailed/Cleanup: .* revoked \(pod\): .*MCP endpoint .* not contacted: secret .* does not name it`)))
		Expect(f.held(ctx, h.Token)).To(BeFalse())
		Expect(elsewhere.got()).To(BeEmpty())
		Expect(configured.got()).To(BeEmpty())
	})

	It("confirms with the API server before taking the dead path for a pod its cache does not know", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		mcp := newMCPServer()
		createMCPConfig(ctx, f.ns, "mcp-auth", mcp.URL+"/mcp", "s3cret")
		pod := f.createPod(ctx, "brain-5", "127.0.0.1")
		f.serveAgent(pod)
		// A replica whose informer does not have the pod (here: outside its selector; in
		// production: a pod created a moment ago, or in a namespace it does not watch).
		blind, err := podwatch.New(cfg, podwatch.WithSelf(f.self), podwatch.WithNamespaces(f.ns),
			podwatch.WithLabelSelector(labels.SelectorFromSet(labels.Set{"app": "none"})))
		Expect(err).NotTo(HaveOccurred())
		disp := revocation.NewDispatcher(blind, f.self, handlers.NewDefaultRegistry(nil, k8ssecret.Reader{Reader: k8sClient}, nil, mcp.URL+"/mcp"),
			revocation.WithForwarder(agentlink.NewHTTPForwarder(nil, f.agent.port, sharedSecret)),
			revocation.WithMetrics(metrics.New(nil)), revocation.WithLogger(GinkgoLogr.WithName("blind")))
		runCtx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { _ = blind.Start(runCtx) })
		wg.Go(func() { _ = disp.Start(runCtx) })
		DeferCleanup(func() { cancel(); wg.Wait() })
		Expect(blind.WaitForSync(ctx)).To(BeTrue())
		Expect(blind.Alive(pod)).To(BeFalse(), "the blind replica's cache must not know the pod")

		h := f.acquire(ctx, "mcp", "browser", pod, false, time.Hour,
			map[string]string{"endpoint": mcp.URL + "/mcp", "sessionId": "sess-5", "authSecret": "mcp-auth"})
		_, ok, err := f.store.Revoke(ctx, h.Token, "")
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		disp.Revoked(ctx, "revoke", []lease.Holder{h})

		// The pod is alive: the revocation reaches its agent, its session is left alone.
		Eventually(published(f.agent.hub, h.Token)).ShouldNot(noEvent)
		Consistently(mcp.got).Should(BeEmpty())
	})

	It("takes the dead path when the forward to a live pod fails", func(ctx SpecContext) {
		mcp := newMCPServer()
		f := newFixture(ctx, fixtureOptions{agentDown: true, mcpEndpoints: []string{mcp.URL + "/mcp"}})
		createMCPConfig(ctx, f.ns, "mcp-anon", mcp.URL+"/mcp", "")
		pod := f.createPod(ctx, "brain-3", "127.0.0.1") // alive, but nothing listens
		session := f.acquire(ctx, "mcp", "browser", pod, false, time.Hour,
			map[string]string{"endpoint": mcp.URL + "/mcp", "sessionId": "s-3", "authSecret": "mcp-anon"})
		compile := f.acquire(ctx, "tex", "tex2pdf", pod, true, time.Hour, nil)

		f.revoke(ctx, session, compile)

		Eventually(mcp.got).Should(Equal([]string{"DELETE /mcp session=s-3 auth="}))
		Eventually(podEvents(ctx, f.ns, pod.Name)).Should(ContainElements(
			HaveSuffix("agent unreachable; handler ran on the reaper with the holder's payload"),
			HaveSuffix("agent unreachable; slot released; the pod-bound resource died with the pod")))
		Expect(metricDispatch(f, "reaper", "ok")).To(Equal(1.0))
		Expect(metricDispatch(f, "release-only", "ok")).To(Equal(1.0))
		Expect(f.reaps("revoke")).To(Equal(2.0))
	})

	It("is harmless when the revocation arrives after the holder released", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		pod := f.createPod(ctx, "app-late", "127.0.0.1")
		f.serveAgent(pod)
		old := f.acquire(ctx, "tex", "tex2pdf", pod, true, time.Hour, nil)
		released, err := f.store.Release(ctx, old.Token)
		Expect(err).NotTo(HaveOccurred())
		Expect(released).To(BeTrue())
		fresh := f.acquire(ctx, "tex", "tex2pdf", pod, true, time.Hour, nil) // the same slot again

		// The operator's revoke of the released token finds nothing to dispatch.
		_, ok, err := f.store.Revoke(ctx, old.Token, "")
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeFalse())
		// A late revocation of the old token (in flight from another reaper) still reaches the
		// agent: it is delivered to nobody and touches neither the new lease nor the counters.
		f.disp.Revoked(ctx, "idle", []lease.Holder{old})
		Eventually(published(f.agent.hub, old.Token)).ShouldNot(noEvent)

		Expect(f.store.Touch(ctx, fresh.Token)).To(Succeed())
		Expect(published(f.agent.hub, fresh.Token)()).To(noEvent)
		cs, err := f.store.ListCounters(ctx, leasestore.CounterFilter{Resource: "tex2pdf"})
		Expect(err).NotTo(HaveOccurred())
		Expect(cs).To(HaveLen(4))
		for _, c := range cs {
			Expect(c.Count).To(Equal(1), c.Key)
			Expect(c.Drift()).To(BeFalse(), c.Key)
		}
	})
})

var _ = Describe("Sweeps", func() {
	It("frees a deleted pod's slots at once, without waiting for the reap interval", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{interval: time.Hour})
		a := f.createPod(ctx, "worker-a", "10.9.0.11")
		b := f.createPod(ctx, "worker-b", "10.9.0.12")
		req := func(pod lease.PodRef) leasestore.AcquireRequest {
			return leasestore.AcquireRequest{
				Resource: "tex2pdf", Type: "tex", Tenant: "acme", Project: "shared", User: "u",
				Caps: []lease.LevelCap{{Level: lease.LevelProject, Cap: 1}},
				Pod:  pod, PodBound: true, TTL: time.Hour,
			}
		}
		held, err := f.store.Acquire(ctx, req(a))
		Expect(err).NotTo(HaveOccurred())
		_, err = f.store.Acquire(ctx, req(b))
		Expect(err).To(MatchError(lease.ErrBusy))

		start := time.Now()
		deletePod(ctx, a)

		Eventually(func() error { _, err := f.store.Acquire(ctx, req(b)); return err }).
			WithTimeout(10 * time.Second).Should(Succeed())
		Expect(time.Since(start)).To(BeNumerically("<", 10*time.Second)) // the interval is an hour
		Expect(f.held(ctx, held.Token)).To(BeFalse())
		// The reaped holders reach the dispatcher (which counts them) just after the slot is free.
		Eventually(func() float64 { return f.reaps("pod") }).Should(Equal(1.0))
	})

	It("reaps a holder idle past its TTL on the scheduled round, and not before", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{interval: 30 * time.Second})
		pod := f.createPod(ctx, "app-idle", "127.0.0.1")
		f.serveAgent(pod)
		const ttl = 4 * time.Second
		idle := f.acquire(ctx, "notify", "pool", pod, true, ttl, nil)
		acquired := time.Now()
		kept := f.acquire(ctx, "notify", "other-pool", pod, true, time.Hour, nil)

		// A round right away and rounds on every tick reap nothing while the TTL runs. The
		// window is what is left of the TTL (less a margin for the server's clock), so that a
		// slow machine shortens the check instead of running it past the TTL.
		res, err := f.sweeper.Sweep(ctx)
		Expect(err).NotTo(HaveOccurred())
		Expect(res.Idle).To(BeZero())
		window := ttl - time.Since(acquired) - time.Second
		Expect(window).To(BeNumerically(">", 0), "the first round took longer than the TTL")
		Consistently(func() bool {
			f.clock.Step(f.interval)
			return f.held(ctx, idle.Token)
		}).WithTimeout(window).WithPolling(100 * time.Millisecond).Should(BeTrue())

		// Past the TTL (server time), the next scheduled round reaps it.
		Eventually(func() bool {
			f.clock.Step(f.interval)
			return f.held(ctx, idle.Token)
		}).WithTimeout(10 * time.Second).WithPolling(200 * time.Millisecond).Should(BeFalse())
		Expect(time.Since(acquired)).To(BeNumerically(">=", ttl-200*time.Millisecond))
		Expect(f.held(ctx, kept.Token)).To(BeTrue())
		// The app's long-poll on its agent ends with the idle revocation.
		Eventually(published(f.agent.hub, idle.Token)).Should(HaveField("Reason", "idle"))
		Expect(f.reaps("idle")).To(Equal(1.0))
	})

	It("counts reaps by reason and corrected counters", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{storeOpts: []leasestore.Option{leasestore.WithSafetyMargin(time.Millisecond)}})
		pod := f.createPod(ctx, "app-m", "10.9.0.21")
		other := f.createPod(ctx, "app-n", "10.9.0.22")
		idle := f.acquire(ctx, "tex", "r-idle", f.self, true, 500*time.Millisecond, nil)
		f.acquire(ctx, "tex", "r-pod", pod, true, time.Hour, nil)
		f.acquire(ctx, "tex", "r-pod2", pod, true, time.Hour, nil)
		revoked := f.acquire(ctx, "tex", "r-revoke", other, true, time.Hour, nil)
		f.revoke(ctx, revoked)

		// Drift: an entry whose holder is gone (a booking that arrived after its holder's
		// release).
		Expect(storetest.LateEntry(ctx, mongoURI, f.database, lease.CounterKey("r-drift", lease.LevelTenant, "acme"), "lh-000000000000000000000001")).To(Succeed())

		deletePod(ctx, pod)
		Eventually(func() float64 { return f.reaps("pod") }).Should(Equal(2.0))
		Eventually(func(g Gomega) {
			_, err := f.sweeper.Sweep(ctx)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(f.held(ctx, idle.Token)).To(BeFalse())
			g.Expect(promtestutil.ToFloat64(f.metrics.Reconcile.WithLabelValues("corrected"))).To(Equal(1.0))
		}).Should(Succeed())
		Expect(f.reaps("idle")).To(Equal(1.0))
		Expect(f.reaps("revoke")).To(Equal(1.0))
		Expect(f.reaps("pod")).To(Equal(2.0))
	})
})

var _ = Describe("Pod watch", func() {
	It("identifies a caller the informer has not seen yet from the API server, and never guesses", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		// A watcher whose informer lags: it was never started, so every cache read misses.
		lagging, err := podwatch.New(cfg)
		Expect(err).NotTo(HaveOccurred())
		fresh := f.createPod(ctx, "fresh", "10.9.2.1")

		Expect(lagging.Identify(ctx, "10.9.2.1")).To(Equal(fresh))
		Expect(lagging.Identify(ctx, "::ffff:10.9.2.1")).To(Equal(fresh))
		// No pod has the address (a developer's curl): a holder without a pod, as before.
		Expect(lagging.Identify(ctx, "10.9.2.9")).To(Equal(lease.PodRef{}))
		// Two running pods claim one address: the caller cannot be determined.
		f.createPod(ctx, "twin-a", "10.9.2.5")
		f.createPod(ctx, "twin-b", "10.9.2.5")
		for _, w := range []*podwatch.Watcher{lagging, f.watcher} {
			_, err = w.Identify(ctx, "10.9.2.5")
			Expect(err).To(MatchError(lease.ErrUnavailable))
		}
		// The running watcher answers from its cache.
		Expect(f.watcher.Identify(ctx, "10.9.2.1")).To(Equal(fresh))
	})

	It("identifies pods by IP, gives endpoints and tells incarnations apart", func(ctx SpecContext) {
		f := newFixture(ctx, fixtureOptions{})
		a := f.createPod(ctx, "ip-a", "10.9.1.1")
		b := f.createPod(ctx, "ip-b", "10.9.1.2")

		byIP := func(ip string) lease.PodRef {
			ref, ok := f.watcher.PodByIP(ip)
			Expect(ok).To(BeTrue(), ip)
			return ref
		}
		Expect(byIP("10.9.1.1")).To(Equal(a))
		Expect(byIP("::ffff:10.9.1.2")).To(Equal(b))
		_, ok := f.watcher.PodByIP("10.9.1.3")
		Expect(ok).To(BeFalse())
		ip, ok := f.watcher.Endpoint(a)
		Expect(ok).To(BeTrue())
		Expect(ip).To(Equal("10.9.1.1"))

		// A pod not started yet (Pending, no IP) is alive, but has no endpoint.
		pending := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: a.Namespace, Name: "ip-pending"},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
		}
		Expect(k8sClient.Create(ctx, pending)).To(Succeed())
		pendingRef := podwatch.RefOf(pending)
		Eventually(func() bool { return f.watcher.Alive(pendingRef) }).Should(BeTrue())
		_, ok = f.watcher.Endpoint(pendingRef)
		Expect(ok).To(BeFalse())

		// A finished pod keeps its IP in the object; the address goes to a new pod.
		setPhase(ctx, a, corev1.PodSucceeded)
		Eventually(func() bool { return f.watcher.Alive(a) }).Should(BeFalse())
		_, ok = f.watcher.PodByIP("10.9.1.1")
		Expect(ok).To(BeFalse())
		_, ok = f.watcher.Endpoint(a)
		Expect(ok).To(BeFalse())
		c := f.createPod(ctx, "ip-c", "10.9.1.1")
		Expect(byIP("10.9.1.1")).To(Equal(c))

		// A pod recreated under the same name is another holder pod.
		deletePod(ctx, b)
		Eventually(func() bool { return f.watcher.Alive(b) }).Should(BeFalse())
		b2 := f.createPod(ctx, "ip-b", "10.9.1.2")
		Expect(b2.UID).NotTo(Equal(b.UID))
		Expect(f.watcher.Alive(b)).To(BeFalse())
		dead, reason, err := f.watcher.ConfirmDead(ctx, b)
		Expect(err).NotTo(HaveOccurred())
		Expect(dead).To(BeTrue())
		Expect(reason).To(Equal("UIDMismatch"))

		// This process's own pod is alive whatever the cluster says.
		deletePod(ctx, f.self)
		Consistently(func() bool { return f.watcher.Alive(f.self) }).Should(BeTrue())
	})
})

// metricDispatch reads vance_lease_revocation_dispatch_total{action,outcome} from the
// spec's registry.
func metricDispatch(f *fixture, action, outcome string) float64 {
	mfs, err := f.registry.Gather()
	Expect(err).NotTo(HaveOccurred())
	for _, mf := range mfs {
		if mf.GetName() != "vance_lease_revocation_dispatch_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["action"] == action && labels["outcome"] == outcome {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
