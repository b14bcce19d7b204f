package e2e

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/podadmit"
	"github.com/vancetope/lease-operator/internal/testutil/admitwatch"
	"github.com/vancetope/lease-operator/internal/testutil/kwoktest"
)

// Pods that kwok runs (docs/testing.md, "Pods that run"): scheduled by the binder, Running
// with an IP this host can send from, Succeeded when they complete, gone when deleted.

// runPod creates a pod of ns that kwok runs and returns it Running with its IP.
func runPod(ctx context.Context, ns, name string, annotations map[string]string) *corev1.Pod {
	GinkgoHelper()
	pod := kwokPod(ns, name, annotations)
	Expect(k8sClient.Create(ctx, pod)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		_ = client.IgnoreNotFound(k8sClient.Delete(ctx, pod, client.GracePeriodSeconds(0)))
	})
	return awaitRunning(ctx, pod)
}

func kwokPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "work", Image: "registry.example/work:1"}}},
	}
}

func awaitRunning(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	GinkgoHelper()
	got := &corev1.Pod{}
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), got)).To(Succeed())
		g.Expect(got.Status.Phase).To(Equal(corev1.PodRunning))
		g.Expect(got.Status.PodIP).NotTo(BeEmpty())
	}).WithPolling(20 * time.Millisecond).Should(Succeed())
	return got
}

var _ = Describe("Pods that run", func() {
	It("identifies a running pod by its IP and frees its lease when it completes, or is deleted", func(ctx SpecContext) {
		for _, end := range []string{"completes", "is deleted"} {
			By("a pod kwok runs acquiring from its own address: the pod " + end)
			pod := runPod(ctx, namespace, "runner-"+strconv.Itoa(len(end)), nil)
			api := newAPIClient("pod "+pod.Name, managerAddr, pod.Status.PodIP)
			l := api.mustAcquire(acquireRequest{Type: "tex", Lease: "tex", Project: "kwok", User: pod.Name, PodBound: true})
			h, err := store.GetHolder(ctx, l.Token)
			Expect(err).NotTo(HaveOccurred())
			Expect(h.Pod).To(Equal(lease.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}),
				"the manager identified the pod by its address %s", pod.Status.PodIP)
			began := time.Now()
			if end == "completes" {
				Expect(kwoktest.Complete(ctx, k8sClient, pod)).To(Succeed())
			} else {
				Expect(k8sClient.Delete(ctx, pod)).To(Succeed())
			}
			Eventually(func(g Gomega) int { return managerAPI.check(g, l.Token).Status }).
				WithPolling(10 * time.Millisecond).Should(Equal(http.StatusGone))
			AddReportEntry("pod "+end+" to lease freed", time.Since(began).Round(time.Millisecond).String())
		}
	})

	It("admits ten pods on a lease capped at three, oldest first; each completion admits the next", func(ctx SpecContext) {
		def := &leasev1alpha1.LeaseDefinition{
			ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: "batch3-system"},
			Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: "batch3", Tenant: "_vance", Project: "_tenant",
				Levels: &leasev1alpha1.LeaseLevels{Global: ptr.To(int32(3))}},
		}
		Expect(k8sClient.Create(ctx, def)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, def)).To(Succeed()) })

		// Sample the pods all along: never more than three admitted and unfinished.
		watch := admitwatch.Start(k8sClient, namespace, client.HasLabels{"batch3"})

		start := time.Now()
		var pods []*corev1.Pod
		for i := range 10 {
			p := kwokPod(namespace, fmt.Sprintf("batch-%02d", i), map[string]string{podadmit.AnnotationLease: "batch3"})
			p.Labels = map[string]string{"batch3": "yes"}
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Expect(p.Spec.SchedulingGates).To(ContainElement(HaveField("Name", podadmit.Gate)), "the webhook gated %s", p.Name)
			DeferCleanup(func(ctx SpecContext) {
				_ = client.IgnoreNotFound(k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0)))
			})
			pods = append(pods, p)
		}
		Eventually(func(g Gomega) []string {
			ws, err := store.ListWaiters(ctx, leasestore.HolderFilter{Resource: "batch3"})
			g.Expect(err).NotTo(HaveOccurred())
			var names []string
			for _, w := range ws {
				names = append(names, w.Holder.Pod.Name)
			}
			return names
		}).Should(Equal(podNames(pods[3:])), "seven pods waiting in line, in the order they were created")

		var handoffs []time.Duration
		var fences []int64
		for i, p := range pods {
			running := awaitRunning(ctx, p)
			Expect(podadmit.Gated(running)).To(BeFalse())
			f, err := strconv.ParseInt(running.Annotations[podadmit.AnnotationFence], 10, 64)
			Expect(err).NotTo(HaveOccurred(), "the fence on %s", p.Name)
			fences = append(fences, f)
			done := time.Now()
			Expect(kwoktest.Complete(ctx, k8sClient, running)).To(Succeed())
			if next := i + 3; next < len(pods) {
				Eventually(func(g Gomega) bool {
					cur := &corev1.Pod{}
					g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pods[next]), cur)).To(Succeed())
					return podadmit.Gated(cur)
				}).WithPolling(10*time.Millisecond).Should(BeFalse(), "%s admitted after %s completed", pods[next].Name, p.Name)
				handoffs = append(handoffs, time.Since(done))
			}
		}
		total := time.Since(start)
		most, admitted := watch.Stop()
		Expect(most).To(BeNumerically("<=", 3), "pods admitted and not finished at once")
		// The first three find room and are admitted side by side; the others in line order.
		Expect(admitted).To(HaveLen(len(pods)))
		Expect(admitted[:3]).To(ConsistOf(podNames(pods[:3])), "the first three admitted first")
		Expect(admitted[3:]).To(Equal(podNames(pods[3:])), "the others admitted oldest first")
		Expect(slices.IsSorted(fences)).To(BeTrue(), "fences %v", fences)
		for _, d := range handoffs {
			Expect(d).To(BeNumerically("<", time.Second), "completion to the next admission: %v", handoffs)
		}
		AddReportEntry("completion to the next admission", fmt.Sprint(handoffs))
		AddReportEntry("ten pods admitted, run and completed", total.Round(time.Millisecond).String())
		Eventually(func(g Gomega) []lease.Holder {
			hs, err := store.ListHolders(ctx, leasestore.HolderFilter{Resource: "batch3"})
			g.Expect(err).NotTo(HaveOccurred())
			return hs
		}).Should(BeEmpty(), "every lease released when its pod completed")
	})
})

func podNames(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
