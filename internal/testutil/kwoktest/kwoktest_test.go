package kwoktest_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/testutil/kwoktest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// podStartTimeout is "within a few seconds" with room for a loaded 2-core machine; the
// latency itself is reported (a few hundred milliseconds when idle).
const podStartTimeout = 10 * time.Second

var _ = Describe("a control plane with kwok", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = testenv.FreshNamespace(ctx, k8sClient, "kwok", nil)
	})

	newPod := func(name string) *corev1.Pod {
		return &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
			Spec: corev1.PodSpec{
				Containers:    []corev1.Container{{Name: "app", Image: "busybox"}},
				RestartPolicy: corev1.RestartPolicyNever,
			},
		}
	}
	// awaitRunning waits until the pod runs and returns it.
	awaitRunning := func(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
		GinkgoHelper()
		got := &corev1.Pod{}
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodRunning))
			g.Expect(got.Status.Conditions).To(ContainElement(And(
				HaveField("Type", corev1.PodReady), HaveField("Status", corev1.ConditionTrue))))
			g.Expect(got.Status.PodIP).NotTo(BeEmpty())
		}).WithTimeout(podStartTimeout).WithPolling(20 * time.Millisecond).Should(Succeed())
		return got
	}

	It("binds a pod without a node, which becomes Running and Ready with an IP from the node's pod CIDR", func(ctx SpecContext) {
		pod := newPod("app")
		begin := time.Now()
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		got := awaitRunning(ctx, pod)
		latency := time.Since(begin)
		GinkgoWriter.Printf("kwoktest: pod created -> Running and Ready in %v\n", latency.Round(time.Millisecond))
		AddReportEntry("pod create to Running and Ready", latency.Round(time.Millisecond).String())

		Expect(got.Spec.NodeName).To(Equal(kwok.NodeName))
		Expect(got.Status.ContainerStatuses).To(ConsistOf(HaveField("Ready", true)))
		cidr := netip.MustParsePrefix(kwok.PodCIDR)
		Expect(cidr.Contains(netip.MustParseAddr(got.Status.PodIP))).To(BeTrue(), "%s in %s", got.Status.PodIP, cidr)
		Expect(got.Status.PodIPs).To(ConsistOf(corev1.PodIP{IP: got.Status.PodIP}))
		Expect(got.Status.HostIP).To(Equal(kwoktest.NodeIP))
	})

	It("leaves gated pods and other schedulers' pods unbound, and binds a pod once its gate is gone", func(ctx SpecContext) {
		gated := newPod("gated")
		gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/wait"}}
		other := newPod("other")
		other.Spec.SchedulerName = "hand-made"
		Expect(k8sClient.Create(ctx, gated)).To(Succeed())
		Expect(k8sClient.Create(ctx, other)).To(Succeed())
		Consistently(func(g Gomega) {
			for _, p := range []*corev1.Pod{gated, other} {
				got := &corev1.Pod{}
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(p), got)).To(Succeed())
				g.Expect(got.Spec.NodeName).To(BeEmpty(), p.Name)
			}
		}).WithTimeout(time.Second).Should(Succeed())
		got := &corev1.Pod{}
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(gated), got)).To(Succeed())
		got.Spec.SchedulingGates = nil
		Expect(k8sClient.Update(ctx, got)).To(Succeed())
		awaitRunning(ctx, gated)
	})

	It("gives pod IPs this host can send from, so that a server sees the pod as the caller", func(ctx SpecContext) {
		pod := awaitRunning(ctx, createPod(ctx, newPod("caller")))
		remote := make(chan string, 1)
		srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) { remote <- r.RemoteAddr }))
		DeferCleanup(srv.Close)
		// As the manager's tests call: a dialer bound to the pod's IP (curl --interface).
		dialer := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(pod.Status.PodIP)}}
		c := &http.Client{Transport: &http.Transport{DialContext: dialer.DialContext}, Timeout: 5 * time.Second}
		resp, err := c.Get(srv.URL)
		Expect(err).NotTo(HaveOccurred())
		_, _ = io.Copy(io.Discard, resp.Body)
		Expect(resp.Body.Close()).To(Succeed())
		host, _, err := net.SplitHostPort(<-remote)
		Expect(err).NotTo(HaveOccurred())
		Expect(host).To(Equal(pod.Status.PodIP))
	})

	It("completes a running pod given a Job owner: Succeeded, containers terminated with exit code 0", func(ctx SpecContext) {
		pod := awaitRunning(ctx, createPod(ctx, newPod("batch")))
		Expect(kwoktest.Complete(ctx, k8sClient, pod)).To(Succeed())
		Eventually(func(g Gomega) {
			got := &corev1.Pod{}
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), got)).To(Succeed())
			g.Expect(got.Status.Phase).To(Equal(corev1.PodSucceeded))
			g.Expect(got.Status.ContainerStatuses).To(ConsistOf(
				HaveField("State.Terminated", HaveField("ExitCode", BeZero()))))
		}).Should(Succeed())
	})

	It("removes a deleted pod, as a kubelet does once its containers have stopped", func(ctx SpecContext) {
		pod := awaitRunning(ctx, createPod(ctx, newPod("gone")))
		// The default grace period: the API server only marks a pod on a node terminating.
		Expect(k8sClient.Delete(ctx, pod)).To(Succeed())
		Eventually(func() error {
			return k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		}).Should(Satisfy(apierrors.IsNotFound))
	})

	It("keeps a deleted pod with a finalizer until the finalizer is removed, as in a cluster", func(ctx SpecContext) {
		pod := newPod("held")
		pod.Finalizers = []string{"example.com/hold"}
		pod = awaitRunning(ctx, createPod(ctx, pod))
		Expect(k8sClient.Delete(ctx, pod)).To(Succeed())
		key := client.ObjectKeyFromObject(pod)
		Consistently(func(g Gomega) {
			got := &corev1.Pod{}
			g.Expect(k8sClient.Get(ctx, key, got)).To(Succeed())
			g.Expect(got.DeletionTimestamp).NotTo(BeNil())
		}).Should(Succeed())

		got := &corev1.Pod{}
		Expect(k8sClient.Get(ctx, key, got)).To(Succeed())
		got.Finalizers = nil
		Expect(k8sClient.Update(ctx, got)).To(Succeed())
		Eventually(func() error { return k8sClient.Get(ctx, key, &corev1.Pod{}) }).Should(Satisfy(apierrors.IsNotFound))
	})
})

func createPod(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	return pod
}
