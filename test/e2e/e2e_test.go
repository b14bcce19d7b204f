package e2e

import (
	"context"
	"io"
	"net"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// The specs are independent of each other and of their order: each works in a tenant (or a
// project) of its own and leaves no holder behind. They share the manager, the agent and
// the app pod, which no spec changes.
var _ = Describe("The lease system", func() {
	It("merges the sample definitions and reports them Ready", func(ctx SpecContext) {
		By("the manager's status controller writing every sample's status")
		Expect(sampleKeys).To(ContainElements(client.ObjectKey{Namespace: systemNamespace, Name: "tex-system"},
			client.ObjectKey{Namespace: "acme", Name: "tex-acme"}, client.ObjectKey{Namespace: "acme", Name: "tex-acme-website"}))
		Eventually(func(g Gomega) {
			for _, key := range sampleKeys {
				ld := &leasev1alpha1.LeaseDefinition{}
				g.Expect(k8sClient.Get(ctx, key, ld)).To(Succeed())
				ready := meta.FindStatusCondition(ld.Status.Conditions, leasev1alpha1.ConditionReady)
				g.Expect(ready).NotTo(BeNil(), "Ready of %s", ld.Name)
				g.Expect(ready.Status).To(Equal(metav1.ConditionTrue), "Ready of %s: %s", ld.Name, ready.Message)
				g.Expect(ld.Status.ObservedGeneration).To(Equal(ld.Generation), ld.Name)
			}
		}).Should(Succeed())

		By("the project layer acme/website merging as the README says")
		website := &leasev1alpha1.LeaseDefinition{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: "acme", Name: "tex-acme-website"}, website)).To(Succeed())
		Expect(website.Status.Effective).To(Equal(&leasev1alpha1.EffectiveDefinition{
			Resource:   "tex",
			Levels:     &leasev1alpha1.LeaseLevels{Global: ptr.To[int32](6), Tenant: ptr.To[int32](2), Project: ptr.To[int32](2)},
			TTLSeconds: 300,
			WaitMs:     ptr.To[int32](30000),
			Fairness:   leasev1alpha1.FairnessGlobal, // the system layer's (config/samples)
		}))

		By("an acquisition in acme/website getting those caps from the agent")
		l := agentAPI.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Tenant: "acme", Project: "website", User: "ann"})
		Expect(l.Levels).To(Equal([]leaseLevel{
			{Level: "project", Scope: "acme/website", Cap: 2},
			{Level: "tenant", Scope: "acme", Cap: 2},
			{Level: "global", Scope: "*", Cap: 6},
		}))
		Expect(l.TTLSeconds).To(BeEquivalentTo(300))
		Expect(agentAPI.release(Default, l.Token).Status).To(Equal(http.StatusOK))
		expectAtRest("acme")
	})

	It("serves a lease's life cycle through the agent", func(ctx SpecContext) {
		req := acquireRequest{
			Type: "tex", Lease: "tex", Tenant: "acme", Project: "thesis", User: "ann",
			HolderRef: "compile-1", PodBound: true, Payload: map[string]string{"jobId": "j-1"},
		}

		By("acquiring: the samples give project 1 (system), tenant 2 (tenant layer), global 6")
		l := agentAPI.mustAcquire(req)
		Expect(l.NoOp).To(BeFalse())
		Expect(l.Lease).To(Equal("tex"))
		Expect(l.Resource).To(Equal("tex"))
		Expect(l.TTLSeconds).To(BeEquivalentTo(120))
		Expect(l.Levels).To(Equal([]leaseLevel{
			{Level: "project", Scope: "acme/thesis", Cap: 1},
			{Level: "tenant", Scope: "acme", Cap: 2},
			{Level: "global", Scope: "*", Cap: 6},
		}))

		By("the store holding it for the agent's pod, with the booked counters")
		hs := holdersOf(Default, "acme")
		Expect(hs).To(HaveLen(1))
		Expect(hs[0].Token).To(Equal(l.Token))
		Expect(hs[0].State).To(Equal(lease.StateHeld))
		Expect(hs[0].Pod).To(Equal(appPod))
		Expect(hs[0].Project).To(Equal("thesis"))
		Expect(hs[0].User).To(Equal("ann"))
		Expect(hs[0].HolderRef).To(Equal("compile-1"))
		Expect(hs[0].PodBound).To(BeTrue())
		Expect(hs[0].Payload).To(Equal(map[string]string{"jobId": "j-1"}))
		Expect(hs[0].Levels).To(ConsistOf("tex|project|acme/thesis", "tex|tenant|acme", "tex|global|*"))
		Expect(countersOf(Default, "acme")).To(ContainElement(SatisfyAll(
			HaveField("Key", "tex|project|acme/thesis"), HaveField("Count", 1), HaveField("Booked", 1))))

		By("a second acquisition in the project waiting 200 ms and finding it busy")
		r := agentAPI.acquireRefused(Default, acquireRequest{Type: "tex", Lease: "tex", Tenant: "acme", Project: "thesis", User: "bob"}.withWait(200))
		Expect(r.Status).To(Equal(http.StatusConflict), "%s", r)
		busy := decode[apiError](Default, r)
		Expect(busy.Error).To(Equal("LEASE_BUSY"))
		Expect(busy.Resource).To(Equal("tex"))
		Expect(busy.Level).To(Equal("project"))
		Expect(busy.Scope).To(Equal("acme/thesis"))
		Expect(busy.Count).To(HaveValue(Equal(1)))
		Expect(busy.Cap).To(HaveValue(Equal(1)))
		// It waited its own 200 ms, not the definition's 30 s.
		Expect(busy.WaitedMs).To(HaveValue(And(BeNumerically(">=", 200), BeNumerically("<", 10000))))

		By("checking and replacing the payload")
		r = agentAPI.check(Default, l.Token)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		Expect(decode[map[string]any](Default, r)).To(Equal(map[string]any{"outcome": "ok", "fence": float64(l.Fence)}))
		r = agentAPI.putPayload(Default, l.Token, map[string]string{"jobId": "j-42"})
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		Expect(holdersOf(Default, "acme")).To(ConsistOf(HaveField("Payload", map[string]string{"jobId": "j-42"})))

		By("releasing, twice")
		r = agentAPI.release(Default, l.Token)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		Expect(decode[map[string]string](Default, r)).To(Equal(map[string]string{"outcome": "ok"}))
		r = agentAPI.release(Default, l.Token)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		Expect(decode[map[string]string](Default, r)).To(Equal(map[string]string{"outcome": "already-released"}))

		By("the released lease being lost and its slots free")
		r = agentAPI.check(Default, l.Token)
		Expect(r.Status).To(Equal(http.StatusGone), "%s", r)
		Expect(decode[apiError](Default, r).Error).To(Equal("LEASE_LOST"))
		expectAtRest("acme")
	})

	It("answers NOOP for the lease none and stores nothing", func() {
		for _, api := range []*apiClient{agentAPI, managerAPI} {
			r := api.acquire(Default, acquireRequest{Type: "tex", Lease: "none", Tenant: tenant, Project: "noop", User: "ann"})
			Expect(r.Status).To(Equal(http.StatusOK), "%s: %s", api.name, r)
			Expect(decode[map[string]any](Default, r)).To(Equal(map[string]any{"noop": true}), api.name)
		}
		expectNothingStored(tenant, "noop")
	})

	It("brings an operator's revocation to the app's long-poll on its agent", func(ctx SpecContext) {
		l := agentAPI.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: "revoke", User: "ann", PodBound: true})
		Expect(holdersOf(Default, tenant)).To(ConsistOf(SatisfyAll(
			HaveField("Token", l.Token), HaveField("Pod", appPod))))

		By("the app waiting for events on its agent")
		type pollResult struct {
			resp response
			err  error
		}
		polled := make(chan pollResult, 1)
		pollCtx, cancelPoll := context.WithTimeout(context.Background(), 45*time.Second)
		DeferCleanup(cancelPoll)
		go func() {
			r, err := agentAPI.call(pollCtx, http.MethodGet, "/v1/leases/"+l.Token+"/events?timeout=30s", nil)
			polled <- pollResult{r, err}
		}()
		Consistently(polled).ShouldNot(Receive(), "the long-poll answered before anything happened")

		By("the admission port not serving the operator API, even with the secret (issue 26)")
		r := managerAPI.do(Default, http.MethodPost, "/internal/lease/admin/revoke",
			map[string]string{"token": l.Token, "tenant": tenant}, "Authorization: Bearer "+adminSecret)
		Expect(r.Status).To(Equal(http.StatusNotFound), "%s", r)
		Expect(agentAPI.check(Default, l.Token).Status).To(Equal(http.StatusOK), "the admission port revoked nothing")

		By("the operator API refusing a caller without the secret")
		admin := func(body any, headers ...string) response {
			return adminAPI.do(Default, http.MethodPost, "/internal/lease/admin/revoke", body, headers...)
		}
		r = admin(map[string]string{"token": l.Token})
		Expect(r.Status).To(Equal(http.StatusUnauthorized), "%s", r)
		Expect(decode[apiError](Default, r).Error).To(Equal("UNAUTHORIZED"))
		r = admin(map[string]string{"token": l.Token}, "Authorization: Bearer wrong")
		Expect(r.Status).To(Equal(http.StatusUnauthorized), "%s", r)
		Expect(agentAPI.check(Default, l.Token).Status).To(Equal(http.StatusOK), "a refused revoke changed nothing")

		By("revoking through the manager's operator API")
		r = admin(map[string]string{"token": l.Token, "tenant": tenant}, "Authorization: Bearer "+adminSecret)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		revoked := decode[struct {
			Revoked bool `json:"revoked"`
			Holder  struct {
				ID     string `json:"id"`
				Pod    string `json:"pod"`
				PodUID string `json:"podUID"`
			} `json:"holder"`
		}](Default, r)
		Expect(revoked.Revoked).To(BeTrue())
		Expect(revoked.Holder.ID).To(Equal(lease.HolderID(l.Token)))
		Expect(string(r.Body)).NotTo(ContainSubstring(l.Token), "the admin API shows no token")
		Expect(revoked.Holder.Pod).To(Equal(namespace + "/" + appPodName))
		Expect(revoked.Holder.PodUID).To(Equal(appPod.UID))

		By("the long-poll ending with the revocation: the manager forwarded it to the agent")
		var got pollResult
		Eventually(polled).WithTimeout(20 * time.Second).Should(Receive(&got))
		Expect(got.err).NotTo(HaveOccurred())
		Expect(got.resp.Status).To(Equal(http.StatusOK), "%s", got.resp)
		Expect(decode[map[string]any](Default, got.resp)).To(SatisfyAll(
			HaveKeyWithValue("token", l.Token),
			HaveKeyWithValue("reason", "revoke"),
			HaveKeyWithValue("type", "tex"),
			HaveKeyWithValue("resource", "tex"),
		))

		By("the lease being lost, and the revocation on record on the pod")
		r = agentAPI.check(Default, l.Token)
		Expect(r.Status).To(Equal(http.StatusGone), "%s", r)
		Expect(decode[apiError](Default, r).Error).To(Equal("LEASE_LOST"))
		// Not the token, nor the reason: Events of one pod with the same action form one series
		// (events/v1), which keeps the note of its first revocation, and other specs revoke
		// app-0's leases, for other reasons too (a borrowing reclaim, forwarded alike).
		Eventually(func(g Gomega) []corev1.Event { return revocationEvents(g, appPodName) }).
			Should(ContainElement(SatisfyAll(
				HaveField("Type", corev1.EventTypeNormal),
				HaveField("Action", "Forward"),
				HaveField("Message", ContainSubstring("forwarded to the pod's lease agent")),
			)))
		r = admin(map[string]string{"token": l.Token}, "Authorization: Bearer "+adminSecret)
		Expect(r.Status).To(Equal(http.StatusNotFound), "%s", r)
		expectAtRest(tenant)
	})

	It("keeps definitions live: a new project layer, a conflict and its removal", func(ctx SpecContext) {
		const project = "e2e"
		req := acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: project, User: "ann"}.withWait(0)
		apis := []*apiClient{agentAPI, managerAPI}

		// projectCap acquires in acme/e2e on api and releases at once; 0 when not 200.
		projectCap := func(g Gomega, api *apiClient) (int, response) {
			r := api.acquire(g, req)
			if r.Status != http.StatusOK {
				return 0, r
			}
			l := decode[granted](g, r)
			g.Expect(api.release(g, l.Token).Status).To(Equal(http.StatusOK))
			return l.capAt("project"), r
		}
		expectProjectCap := func(want int) {
			GinkgoHelper()
			for _, api := range apis {
				Eventually(func(g Gomega) {
					got, r := projectCap(g, api)
					g.Expect(got).To(Equal(want), "%s: %s", api.name, r)
				}).Should(Succeed())
			}
		}
		expectProjectCap(1)

		By("a project layer raising the project cap to 2, seen by the manager and the agent")
		raise := newDefinition("tex-acme-e2e", tenant, project, 2)
		Expect(k8sClient.Create(ctx, raise)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, raise))).To(Succeed()) })
		expectProjectCap(2)
		expectCondition(ctx, raise, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)

		By("two holders in the project, a third one busy")
		first := agentAPI.mustAcquire(req)
		second := agentAPI.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: project, User: "bob"})
		r := managerAPI.acquireRefused(Default, acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: project, User: "eve"}.withWait(0))
		Expect(r.Status).To(Equal(http.StatusConflict), "%s", r)
		Expect(decode[apiError](Default, r)).To(SatisfyAll(HaveField("Level", "project"), HaveField("Cap", HaveValue(Equal(2)))))
		for _, l := range []granted{first, second} {
			Expect(agentAPI.release(Default, l.Token).Status).To(Equal(http.StatusOK))
		}

		By("a second object for the same scope: that scope fails closed, others do not")
		dup := newDefinition("tex-acme-e2e-dup", tenant, project, 3)
		Expect(k8sClient.Create(ctx, dup)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, dup))).To(Succeed()) })
		for _, api := range apis {
			Eventually(func(g Gomega) {
				r := api.acquireRefused(g, req)
				g.Expect(r.Status).To(Equal(http.StatusServiceUnavailable), "%s: %s", api.name, r)
				g.Expect(decode[apiError](g, r).Error).To(Equal("LEASE_UNAVAILABLE"))
			}).Should(Succeed())
			l := api.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: "thesis", User: "ann"}.withWait(0))
			Expect(api.release(Default, l.Token).Status).To(Equal(http.StatusOK))
		}
		expectCondition(ctx, dup, metav1.ConditionFalse, leasev1alpha1.ReasonConflict)
		expectCondition(ctx, raise, metav1.ConditionFalse, leasev1alpha1.ReasonConflict)

		By("deleting the duplicate: the raised cap is back")
		Expect(k8sClient.Delete(ctx, dup)).To(Succeed())
		expectProjectCap(2)
		expectCondition(ctx, raise, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)

		By("deleting the project layer: the system layer's cap 1 is back")
		Expect(k8sClient.Delete(ctx, raise)).To(Succeed())
		expectProjectCap(1)
		expectAtRest(tenant)
	})

	DescribeTable("frees a pod's slots at once when the pod is",
		func(ctx SpecContext, podName, podIP string, end func(context.Context, *corev1.Pod)) {
			// Another pod of the app, at a loopback address of its own (Linux routes all of
			// 127/8 to the loopback): the manager attributes calls from that source address to
			// it, and app-0 stays intact.
			ln, err := net.Listen("tcp", podIP+":0")
			if err != nil {
				Skip("a second loopback address is needed to stand for another pod: " + err.Error())
			}
			_ = ln.Close()
			project := podName
			req := acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: project, User: "ann", PodBound: true}.withWait(0)

			worker := createRunningPod(ctx, namespace, podName, podIP)
			workerPod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: worker.Namespace, Name: worker.Name}}
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, workerPod))).To(Succeed()) })
			workerAPI := newAPIClient("manager (from "+podName+")", managerAddr, podIP)

			By("the pod acquiring through the manager's API, identified by its IP")
			var held granted
			Eventually(func(g Gomega) {
				r := workerAPI.acquire(g, req)
				g.Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
				l := decode[granted](g, r)
				hs := holdersOf(g, tenant)
				if len(hs) != 1 || hs[0].Pod != worker {
					// The manager's pod informer has not seen the new pod yet: try again.
					workerAPI.release(g, l.Token)
				}
				g.Expect(hs).To(ConsistOf(SatisfyAll(HaveField("Token", l.Token), HaveField("Pod", worker))))
				held = l
			}).Should(Succeed())
			workerAPI.releaseOnCleanup(held.Token)
			Expect(held.capAt("project")).To(Equal(1))
			r := agentAPI.acquireRefused(Default, req)
			Expect(r.Status).To(Equal(http.StatusConflict), "%s", r)
			Expect(decode[apiError](Default, r).Level).To(Equal("project"))

			By("the pod ending: its holder is reaped at once (the sweep runs once an hour)")
			ended := time.Now()
			end(ctx, workerPod)
			Eventually(func(g Gomega) { g.Expect(holdersOf(g, tenant)).To(BeEmpty()) }).
				WithTimeout(10 * time.Second).Should(Succeed())
			AddReportEntry("pod end to reaped holder", time.Since(ended).Round(time.Millisecond).String())

			By("the slot being free for another pod, and the old lease lost")
			l := agentAPI.mustAcquire(req)
			Expect(agentAPI.release(Default, l.Token).Status).To(Equal(http.StatusOK))
			r = managerAPI.check(Default, held.Token)
			Expect(r.Status).To(Equal(http.StatusGone), "%s", r)
			// podBound and dead: the slot is released, no handler runs.
			Eventually(func(g Gomega) []corev1.Event { return revocationEvents(g, podName) }).
				Should(ContainElement(SatisfyAll(
					HaveField("Action", "Release"),
					HaveField("Message", ContainSubstring(lease.HolderID(held.Token))),
					HaveField("Message", Not(ContainSubstring(held.Token[:8]))),
					HaveField("Message", ContainSubstring("(pod)")),
				)))
			expectAtRest(tenant)
		},
		Entry("deleted", "worker-0", "127.0.0.2", func(ctx context.Context, pod *corev1.Pod) {
			// As kubectl delete pod; a pod on no node goes at once.
			Expect(k8sClient.Delete(ctx, pod)).To(Succeed())
		}),
		Entry("finished (phase Succeeded)", "worker-1", "127.0.0.3", func(ctx context.Context, pod *corev1.Pod) {
			// As the kubelet reports a completed Job pod; the object stays.
			Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), pod)).To(Succeed())
			pod.Status.Phase = corev1.PodSucceeded
			Expect(k8sClient.Status().Update(ctx, pod)).To(Succeed())
		}),
	)

	It("reaps an idle holder when a waiting acquisition on the agent finds its level full", func(ctx SpecContext) {
		// An inline definition (no layers): one slot per project, idle after one second.
		inline := map[string]any{"name": "idle-e2e", "levels": map[string]int{"project": 1}, "ttlSeconds": 1}
		acquire := func(user string, waitMs int64) response {
			return agentAPI.do(Default, http.MethodPost, "/v1/leases", map[string]any{
				"type": "notify", "inline": inline, "tenant": tenant, "project": "idle", "user": user, "waitMs": waitMs,
			})
		}
		r := acquire("ann", 0)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		idle := decode[granted](Default, r)
		agentAPI.releaseOnCleanup(idle.Token)
		Expect(idle.Resource).To(Equal("mcp-inline:" + tenant + "/idle/idle-e2e"))
		Expect(idle.TTLSeconds).To(BeEquivalentTo(1))

		polled := make(chan response, 1)
		pollCtx, cancelPoll := context.WithTimeout(context.Background(), 45*time.Second)
		DeferCleanup(cancelPoll)
		go func() {
			r, _ := agentAPI.call(pollCtx, http.MethodGet, "/v1/leases/"+idle.Token+"/events?timeout=30s", nil)
			polled <- r
		}()
		idleReaps := func(s string) float64 {
			v, _ := metric(s, "vance_lease_reap_total", map[string]string{"reason": "idle"})
			return v
		}
		before := idleReaps(scrape(Default))

		By("a second holder waiting until the first one has been idle for its TTL")
		started := time.Now()
		r = acquire("bob", 10000)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		next := decode[granted](Default, r)
		agentAPI.releaseOnCleanup(next.Token)
		AddReportEntry("wait for the idle holder", time.Since(started).Round(time.Millisecond).String())

		By("the idle holder being gone, and its app told through the agent's long-poll")
		r = agentAPI.check(Default, idle.Token)
		Expect(r.Status).To(Equal(http.StatusGone), "%s", r)
		// The agent relayed its lazy sweep to the manager (LEASE_MANAGER_URL): the manager
		// reaped the holder (only the manager's reaps reach its metrics) and, app-0 being
		// alive, forwarded the revocation to app-0's agent, which ended the poll.
		Eventually(func(g Gomega) float64 { return idleReaps(scrape(g)) }).Should(BeNumerically(">=", before+1))
		var ev response
		Eventually(polled).WithTimeout(10 * time.Second).Should(Receive(&ev))
		Expect(ev.Status).To(Equal(http.StatusOK), "%s", ev)
		Expect(decode[map[string]any](Default, ev)).To(SatisfyAll(
			HaveKeyWithValue("token", idle.Token), HaveKeyWithValue("reason", "idle"), HaveKeyWithValue("type", "notify")))
		Expect(agentAPI.release(Default, next.Token).Status).To(Equal(http.StatusOK))
		expectAtRest(tenant)
	})

	It("exports the lease metrics on the manager's metrics endpoint", func() {
		before := scrape(Default)
		acquired := func(s string) float64 {
			v, _ := metric(s, "vance_lease_acquire_total", map[string]string{"resource": "tex", "outcome": "success"})
			return v
		}
		revokes := func(s string) float64 {
			v, _ := metric(s, "vance_lease_reap_total", map[string]string{"reason": "revoke"})
			return v
		}

		By("an acquire and release, and an acquire and revoke, on the manager")
		req := acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: "metrics", User: "ann"}.withWait(0)
		l := managerAPI.mustAcquire(req)
		Expect(managerAPI.release(Default, l.Token).Status).To(Equal(http.StatusOK))
		l = managerAPI.mustAcquire(req)
		r := adminAPI.do(Default, http.MethodPost, "/internal/lease/admin/revoke", map[string]string{"token": l.Token},
			"Authorization: Bearer "+adminSecret)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)

		By("the counters having moved")
		Eventually(func(g Gomega) {
			s := scrape(g)
			g.Expect(acquired(s)).To(BeNumerically(">=", acquired(before)+2))
			g.Expect(revokes(s)).To(BeNumerically(">=", revokes(before)+1))
			v, ok := metric(s, "vance_lease_release_total", map[string]string{"resource": "tex", "outcome": "ok"})
			g.Expect(ok).To(BeTrue(), "vance_lease_release_total{outcome=ok,resource=tex}")
			g.Expect(v).To(BeNumerically(">", 0))
			_, ok = metric(s, "vance_lease_acquire_wait_seconds_count", map[string]string{"resource": "tex"})
			g.Expect(ok).To(BeTrue(), "vance_lease_acquire_wait_seconds")
		}).Should(Succeed())
		expectAtRest(tenant)
	})

	// Failed before the agent served /metrics: the consumer path (acquire, check, release on
	// the agent) was invisible.
	It("exports the consumer path's metrics on the agent's internal port, with the manager's names", func() {
		sample := func(s, name string, labels map[string]string) float64 {
			v, _ := metric(s, name, labels)
			return v
		}
		tex := func(outcome string) map[string]string {
			return map[string]string{"resource": "tex", "outcome": outcome}
		}
		before := scrapeURL(Default, agentMetricsURL)

		l := agentAPI.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: "agent-metrics", User: "ann"}.withWait(0))
		Expect(agentAPI.check(Default, l.Token).Status).To(Equal(http.StatusOK))
		Expect(agentAPI.release(Default, l.Token).Status).To(Equal(http.StatusOK))

		s := scrapeURL(Default, agentMetricsURL)
		Expect(sample(s, "vance_lease_acquire_total", tex("success"))).To(Equal(sample(before, "vance_lease_acquire_total", tex("success")) + 1))
		Expect(sample(s, "vance_lease_check_total", tex("ok"))).To(Equal(sample(before, "vance_lease_check_total", tex("ok")) + 1))
		Expect(sample(s, "vance_lease_release_total", tex("ok"))).To(Equal(sample(before, "vance_lease_release_total", tex("ok")) + 1))
		for _, name := range []string{"vance_lease_revocation_dropped_total", "vance_lease_acquire_wait_seconds_count"} {
			Expect(s).To(ContainSubstring(name))
		}
		expectAtRest(tenant)
	})

	// Failed before cmd/manager registered the dispatcher's collectors with the metrics
	// registry.
	It("exports the revocation dispatch metrics on the manager's metrics endpoint", func() {
		l := managerAPI.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: "dispatch", User: "ann"}.withWait(0))
		r := adminAPI.do(Default, http.MethodPost, "/internal/lease/admin/revoke", map[string]string{"token": l.Token},
			"Authorization: Bearer "+adminSecret)
		Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		Eventually(func(g Gomega) {
			s := scrape(g)
			// The holder's pod app-0 is alive and its agent answers: the matrix forwards.
			v, ok := metric(s, "vance_lease_revocation_dispatch_total", map[string]string{"action": "forward", "outcome": "ok"})
			g.Expect(ok).To(BeTrue(), "vance_lease_revocation_dispatch_total{action=forward,outcome=ok}")
			g.Expect(v).To(BeNumerically(">", 0))
			_, ok = metric(s, "vance_lease_revocation_dropped_total", nil)
			g.Expect(ok).To(BeTrue(), "vance_lease_revocation_dropped_total")
		}).Should(Succeed())
		expectAtRest(tenant)
	})
})

// newDefinition returns a project layer of tex that sets the project cap, in the namespace
// named after the tenant (the samples create acme's, labelled as acme's).
func newDefinition(name, tenant, project string, projectCap int32) *leasev1alpha1.LeaseDefinition {
	return &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: tenant, Name: name},
		Spec: leasev1alpha1.LeaseDefinitionSpec{
			LeaseName: "tex", Tenant: tenant, Project: project,
			Levels: &leasev1alpha1.LeaseLevels{Project: ptr.To(projectCap)},
		},
	}
}

// expectCondition waits until the object's Ready condition has status and reason for its
// current generation.
func expectCondition(ctx context.Context, obj *leasev1alpha1.LeaseDefinition, status metav1.ConditionStatus, reason string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		cur := &leasev1alpha1.LeaseDefinition{}
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(obj), cur)).To(Succeed())
		ready := meta.FindStatusCondition(cur.Status.Conditions, leasev1alpha1.ConditionReady)
		g.Expect(ready).NotTo(BeNil())
		g.Expect(ready.Status).To(Equal(status), "Ready of %s: %s", obj.Name, ready.Message)
		g.Expect(ready.Reason).To(Equal(reason), "Ready of %s: %s", obj.Name, ready.Message)
	}).Should(Succeed())
}

// holdersOf reads the holders of tenant from the store. Their tokens join those the suite
// was handed: among them are the holders of pods the manager admitted, whose tokens no
// answer shows.
func holdersOf(g Gomega, tenant string) []lease.Holder {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hs, err := store.ListHolders(ctx, leasestore.HolderFilter{Tenant: tenant})
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	for _, h := range hs {
		handedOut.Add(h.Token)
	}
	return hs
}

// expectNothingStored asserts that the store has no holder of tenant in project and no
// counter of that project or of its users' holders there: nothing was written for it.
func expectNothingStored(tenant, project string) {
	GinkgoHelper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hs, err := store.ListHolders(ctx, leasestore.HolderFilter{Tenant: tenant, Project: project})
	Expect(err).NotTo(HaveOccurred())
	Expect(hs).To(BeEmpty(), "holders of %s/%s", tenant, project)
	for _, c := range countersOf(Default, tenant) {
		Expect(c.Key).NotTo(HaveSuffix("|project|"+tenant+"/"+project), "a counter of %s/%s", tenant, project)
	}
}

// countersOf reads the tenant, project and user counters of tenant from the store.
func countersOf(g Gomega, tenant string) []lease.Counter {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, err := store.ListCounters(ctx, leasestore.CounterFilter{Tenant: tenant})
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return cs
}

// expectAtRest asserts that tenant holds nothing: no holder, every counter of the tenant at
// zero, and the global counters equal to the holders that book them (no drift).
func expectAtRest(tenant string) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(holdersOf(g, tenant)).To(BeEmpty())
		for _, c := range countersOf(g, tenant) {
			g.Expect(c.Count).To(BeZero(), "counter %s", c.Key)
			g.Expect(c.Booked).To(BeZero(), "counter %s", c.Key)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		global, err := store.ListCounters(ctx, leasestore.CounterFilter{Level: lease.LevelGlobal})
		g.Expect(err).NotTo(HaveOccurred())
		for _, c := range global {
			g.Expect(c.Drift()).To(BeFalse(), "counter %s: count %d, booked %d", c.Key, c.Count, c.Booked)
		}
	}).Should(Succeed())
}

// revocationEvents lists the LeaseRevoked Events of a pod in namespace.
func revocationEvents(g Gomega, pod string) []corev1.Event {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	var list corev1.EventList
	g.ExpectWithOffset(1, k8sClient.List(ctx, &list, client.InNamespace(namespace))).To(Succeed())
	var out []corev1.Event
	for _, e := range list.Items {
		if e.Reason == "LeaseRevoked" && e.InvolvedObject.Kind == "Pod" && e.InvolvedObject.Name == pod {
			out = append(out, e)
		}
	}
	return out
}

// scrape reads the manager's metrics endpoint.
func scrape(g Gomega) string { return scrapeURL(g, metricsURL) }

func scrapeURL(g Gomega, url string) string {
	c := &http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get(url)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	defer func() { _ = resp.Body.Close() }()
	g.ExpectWithOffset(1, resp.StatusCode).To(Equal(http.StatusOK))
	data, err := io.ReadAll(resp.Body)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return string(data)
}
