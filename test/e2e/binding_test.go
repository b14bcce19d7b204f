package e2e

import (
	"net"
	"net/http"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/lease"
)

// needLoopback skips the spec when ip (another address of 127/8, standing for a pod or a
// host) cannot be sent from.
func needLoopback(ip string) {
	ln, err := net.Listen("tcp", ip+":0")
	if err != nil {
		Skip("the loopback address " + ip + " is needed: " + err.Error())
	}
	_ = ln.Close()
}

// expectForbidden expects r to be 403 TENANT_FORBIDDEN naming the caller's namespace and
// the tenant it speaks for ("" for none).
func expectForbidden(g Gomega, r response, callerNamespace, callerTenant string) {
	g.ExpectWithOffset(1, r.Status).To(Equal(http.StatusForbidden), "%s", r)
	e := decode[apiError](g, r)
	g.ExpectWithOffset(1, e.Error).To(Equal("TENANT_FORBIDDEN"), "%s", r)
	g.ExpectWithOffset(1, e.CallerNamespace).To(Equal(callerNamespace), "%s", r)
	g.ExpectWithOffset(1, e.CallerTenant).To(Equal(callerTenant), "%s", r)
}

// Issue 25: a pod acts only for the tenant of its namespace, on its agent and on the
// manager alike; a caller that is no pod is refused unless the manager runs with the
// development setting --allow-non-pod-callers.
var _ = Describe("The tenant binding", func() {
	// The two tenants' pods, each through its agent and through the manager from its address.
	type side struct {
		namespace, tenant string
		pod               *lease.PodRef
		agent, manager    *apiClient
	}
	sides := func() []side {
		return []side{
			{namespace, tenant, &appPod, agentAPI, managerAPI},
			{otherNamespace, otherTenant, &otherPod, otherAgentAPI, otherManagerAPI},
		}
	}

	It("refuses a pod that names another tenant, on both paths, and writes nothing", func() {
		const project = "spoof"
		all := sides()
		for i, s := range all {
			victim := all[1-i].tenant
			for _, api := range []*apiClient{s.agent, s.manager} {
				r := api.acquireRefused(Default, acquireRequest{Type: "tex", Lease: "tex", Tenant: victim, Project: project, User: "eve"}.withWait(0))
				expectForbidden(Default, r, s.namespace, s.tenant)
				Expect(decode[apiError](Default, r).Message).To(ContainSubstring(`may not act for tenant "`+victim+`"`), api.name)
			}
		}
		By("nothing stored under either tenant: no holder, no counter of the project")
		for _, s := range all {
			expectNothingStored(s.tenant, project)
			Expect(holdersOf(Default, s.tenant)).To(BeEmpty(), "holders of %s", s.tenant)
		}
	})

	It("derives the tenant from the pod's namespace when the request names none", func() {
		const project = "derived"
		for _, s := range sides() {
			for _, api := range []*apiClient{s.agent, s.manager} {
				l := api.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Project: project, User: "ann"}.withWait(0))
				Expect(l.Levels).To(ContainElement(SatisfyAll(HaveField("Level", "tenant"), HaveField("Scope", s.tenant))), api.name)
				Expect(holdersOf(Default, s.tenant)).To(ConsistOf(SatisfyAll(
					HaveField("Token", l.Token), HaveField("Tenant", s.tenant), HaveField("Project", project), HaveField("Pod", *s.pod))), api.name)
				Expect(api.release(Default, l.Token).Status).To(Equal(http.StatusOK))
				expectAtRest(s.tenant)
			}
		}
	})

	It("refuses a pod in a namespace without a tenant label, on both paths", func(ctx SpecContext) {
		const ns, podIP, project = "no-tenant", "127.0.0.5", "no-tenant"
		needLoopback(podIP)
		if err := k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
		pod := createRunningPod(ctx, ns, "app-0", podIP)
		DeferCleanup(func(ctx SpecContext) {
			obj := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name}}
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed())
		})
		ports, err := freePorts(2)
		Expect(err).NotTo(HaveOccurred())
		apiAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[0]))
		internalAddr := net.JoinHostPort("127.0.0.1", strconv.Itoa(ports[1]))
		agent := startAgent("no-tenant-agent", pod, podIP, apiAddr, internalAddr, "http://"+managerAddr)
		DeferCleanup(func() { Expect(agent.stop()).To(Succeed()) })
		waitReady(agent, "http://"+internalAddr+"/readyz")
		apis := []*apiClient{newAPIClient("no-tenant-agent", apiAddr, ""), newAPIClient("manager (from "+ns+"/app-0)", managerAddr, podIP)}

		for _, api := range apis {
			for _, named := range []string{tenant, ""} {
				req := acquireRequest{Type: "tex", Lease: "tex", Tenant: named, Project: project, User: "ann"}.withWait(0)
				// The manager refuses the address as no pod until its informer has the pod:
				// wait for the refusal that names the namespace.
				Eventually(func(g Gomega) { expectForbidden(g, api.acquireRefused(g, req), ns, "") }).Should(Succeed(), api.name)
			}
		}
		expectNothingStored(tenant, project)
	})

	It("refuses a caller that is no pod, unless the manager runs with --allow-non-pod-callers", func() {
		const hostIP, project = "127.0.0.6", "no-pod" // no pod has hostIP
		needLoopback(hostIP)
		req := acquireRequest{Type: "tex", Lease: "tex", Tenant: otherTenant, Project: project, User: "dev"}.withWait(0)
		host := newAPIClient("manager (from "+hostIP+")", managerAddr, hostIP)
		r := host.acquireRefused(Default, req)
		expectForbidden(Default, r, "", "")
		Expect(decode[apiError](Default, r).Message).To(ContainSubstring(hostIP))
		expectNothingStored(otherTenant, project)

		By("a second manager with the development setting, which says so in its log")
		ports, err := freePorts(4)
		Expect(err).NotTo(HaveOccurred())
		local := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
		devAddr, devProbe := local(ports[0]), local(ports[2])
		dev := startManager("dev-manager", devAddr, local(ports[1]), devProbe, "--allow-non-pod-callers",
			"--admin-bind-address", local(ports[3]))
		DeferCleanup(func() { Expect(dev.stop()).To(Succeed()) })
		waitReady(dev, "http://"+devProbe+"/readyz")
		Expect(strings.Contains(dev.tail(400), "DEVELOPMENT SETTING --allow-non-pod-callers")).To(BeTrue(), dev.describe())

		devHost := newAPIClient("dev-manager (from "+hostIP+")", devAddr, hostIP)
		var l granted
		// Until its caches have synced the new manager may answer 503.
		Eventually(func(g Gomega) {
			r := devHost.acquire(g, req)
			g.Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
			l = decode[granted](g, r)
		}).Should(Succeed())
		devHost.releaseOnCleanup(l.Token)
		Expect(holdersOf(Default, otherTenant)).To(ConsistOf(SatisfyAll(
			HaveField("Token", l.Token), HaveField("Project", project), HaveField("Pod", lease.PodRef{}))))
		Expect(devHost.release(Default, l.Token).Status).To(Equal(http.StatusOK))

		By("the development setting freeing no pod: app-0 still acts only for its tenant there")
		devApp := newAPIClient("dev-manager (from app-0)", devAddr, "")
		Eventually(func(g Gomega) { expectForbidden(g, devApp.acquireRefused(g, req), namespace, tenant) }).Should(Succeed())
		expectAtRest(otherTenant)
	})
})
