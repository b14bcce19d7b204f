package podadmit_test

import (
	"context"
	"fmt"
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
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/admitwatch"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// tenantNamespace creates a namespace of tenant for one spec.
func tenantNamespace(ctx context.Context, tenant string) string {
	return testenv.FreshNamespace(ctx, k8sClient, "adm", map[string]string{tenancy.TenantLabel: tenant})
}

// defineLease creates a system-layer LeaseDefinition of name capped at global, deleted when
// the spec ends.
func defineLease(ctx context.Context, doc, name string, global int32) {
	GinkgoHelper()
	d := &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: doc},
		Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: name, Tenant: "_vance", Project: "_tenant",
			Levels: &leasev1alpha1.LeaseLevels{Global: ptr.To(global)}},
	}
	Expect(k8sClient.Create(ctx, d)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, d))).To(Succeed()) })
}

// newPod is a one-container pod of namespace ns with annotations.
func newPod(ns, name string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Annotations: annotations},
		Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: "work", Image: "registry.example/work:1"}}},
	}
}

func getPod(ctx context.Context, ns, name string) *corev1.Pod {
	GinkgoHelper()
	p := &corev1.Pod{}
	Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: name}, p)).To(Succeed())
	return p
}

// finish marks a pod's work done, as a kubelet would: phase Succeeded.
func finish(ctx context.Context, p *corev1.Pod) {
	GinkgoHelper()
	cur := getPod(ctx, p.Namespace, p.Name)
	cur.Status.Phase = corev1.PodSucceeded
	Expect(k8sClient.Status().Update(ctx, cur)).To(Succeed())
}

func condition(p *corev1.Pod) *corev1.PodCondition {
	for i := range p.Status.Conditions {
		if p.Status.Conditions[i].Type == podadmit.ConditionAdmitted {
			return &p.Status.Conditions[i]
		}
	}
	return nil
}

var _ = Describe("The gating webhook", func() {
	It("gates an annotated pod at creation and leaves other pods alone", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		gated := newPod(ns, "gated", map[string]string{podadmit.AnnotationLease: "unknown-here"})
		gated.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "example.com/other"}}
		Expect(k8sClient.Create(ctx, gated)).To(Succeed())
		Expect(gated.Spec.SchedulingGates).To(Equal([]corev1.PodSchedulingGate{{Name: "example.com/other"}, {Name: podadmit.Gate}}))
		plain := newPod(ns, "plain", nil)
		Expect(k8sClient.Create(ctx, plain)).To(Succeed())
		Expect(plain.Spec.SchedulingGates).To(BeEmpty())
	})

	It("refuses an annotated pod in a namespace that speaks for no tenant, naming the label", func(ctx SpecContext) {
		ns := testenv.FreshNamespace(ctx, k8sClient, "adm-none", nil)
		err := k8sClient.Create(ctx, newPod(ns, "orphan", map[string]string{podadmit.AnnotationLease: "batch"}))
		Expect(err).To(MatchError(ContainSubstring(`has no label lease.vancetope.io/tenant`)))
	})

	It("refuses a bad annotation with the annotation's name", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		err := k8sClient.Create(ctx, newPod(ns, "bad", map[string]string{podadmit.AnnotationLease: "batch", podadmit.AnnotationMaxWait: "soon"}))
		Expect(err).To(MatchError(SatisfyAll(ContainSubstring(podadmit.AnnotationMaxWait), ContainSubstring("soon"))))
	})
})

var _ = Describe("Admission by lease", func() {
	It("admits ten pods on a lease capped at three, oldest first, a slot at a time", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		defineLease(ctx, "batch3-system", "batch3", 3)
		// Watch the pods all along: never more than three ungated and unfinished.
		watch := admitwatch.Start(k8sClient, ns)
		start := time.Now()
		var pods []*corev1.Pod
		for i := range 10 {
			p := newPod(ns, fmt.Sprintf("job-%02d", i), map[string]string{podadmit.AnnotationLease: "batch3"})
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			pods = append(pods, p)
		}
		Eventually(func() int {
			ws, err := store.ListWaiters(ctx, leasestore.HolderFilter{Tenant: "acme"})
			Expect(err).NotTo(HaveOccurred())
			return len(ws)
		}).Should(Equal(7), "seven pods waiting in line")
		ws, err := store.ListWaiters(ctx, leasestore.HolderFilter{Tenant: "acme"})
		Expect(err).NotTo(HaveOccurred())
		for i, w := range ws {
			Expect(w.Holder.Pod.Name).To(Equal(pods[3+i].Name), "the line in creation order")
			Expect(w.Position).To(Equal(i))
		}
		var fences []int64
		for i, p := range pods {
			if i < 3 {
				Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, p.Name)) }).Should(BeFalse())
			}
			if i >= 3 {
				Expect(podadmit.Gated(getPod(ctx, ns, p.Name))).To(BeTrue(), "%s waits", p.Name)
			}
		}
		var handoffs []time.Duration
		for i, p := range pods {
			cur := getPod(ctx, ns, p.Name)
			Expect(podadmit.Gated(cur)).To(BeFalse(), "%s admitted", p.Name)
			f, err := strconv.ParseInt(cur.Annotations[podadmit.AnnotationFence], 10, 64)
			Expect(err).NotTo(HaveOccurred())
			fences = append(fences, f)
			Expect(cur.Annotations).To(HaveKey(podadmit.AnnotationAdmittedAt))
			Expect(lease.ValidHolderID(cur.Annotations[podadmit.AnnotationHolder])).To(BeTrue())
			Expect(condition(cur)).To(HaveField("Status", corev1.ConditionTrue))
			finished := time.Now()
			finish(ctx, cur)
			if next := i + 3; next < len(pods) {
				Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, pods[next].Name)) }).
					WithTimeout(5 * time.Second).WithPolling(10 * time.Millisecond).Should(BeFalse())
				handoffs = append(handoffs, time.Since(finished))
			}
		}
		total := time.Since(start)
		most, admitted := watch.Stop()
		Expect(most).To(BeNumerically("<=", 3), "never more than three pods admitted and running")
		// The first three find room and are admitted side by side; the others in line order.
		Expect(admitted).To(HaveLen(len(pods)))
		Expect(admitted[:3]).To(ConsistOf(names(pods[:3])), "the first three admitted first")
		Expect(admitted[3:]).To(Equal(names(pods[3:])), "the others admitted oldest first")
		Expect(slices.IsSorted(fences)).To(BeTrue(), "fences %v in admission order", fences)
		for _, d := range handoffs {
			Expect(d).To(BeNumerically("<", time.Second), "a completion frees a slot within a second: %v", handoffs)
		}
		AddReportEntry("completion to next admission", handoffs)
		AddReportEntry("ten pods admitted and finished", total)
		Eventually(func() int {
			hs, err := store.ListHolders(ctx, leasestore.HolderFilter{Tenant: "acme", Resource: "batch3"})
			Expect(err).NotTo(HaveOccurred())
			return len(hs)
		}).Should(BeZero(), "every lease released when its pod finished")
	})

	It("lets a pod through at once when no lease applies", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		p := newPod(ns, "free", map[string]string{podadmit.AnnotationLease: "none"})
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, p.Name)) }).Should(And(
			HaveField("Status", corev1.ConditionTrue), HaveField("Reason", podadmit.ReasonNotRequired)))
		Expect(podadmit.Gated(getPod(ctx, ns, p.Name))).To(BeFalse())
	})

	It("keeps a pod gated with the reason while its definition is broken, and admits it once fixed", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		p := newPod(ns, "early", map[string]string{podadmit.AnnotationLease: "later"})
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, p.Name)) }).Should(And(
			HaveField("Status", corev1.ConditionFalse), HaveField("Reason", podadmit.ReasonDefinitionError),
			HaveField("Message", ContainSubstring(`no LeaseDefinition defines lease "later"`))))
		Expect(podadmit.Gated(getPod(ctx, ns, p.Name))).To(BeTrue())
		// Two system documents of one lease disagree: still a definition error, now that one.
		defineLease(ctx, "later-a", "later", 1)
		defineLease(ctx, "later-b", "later", 2)
		Eventually(func() string { return condition(getPod(ctx, ns, p.Name)).Message }).ShouldNot(ContainSubstring("no LeaseDefinition"))
		Expect(podadmit.Gated(getPod(ctx, ns, p.Name))).To(BeTrue())
		var events corev1.EventList
		Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
		Expect(events.Items).To(ContainElement(HaveField("Reason", podadmit.ReasonDefinitionError)))
		// Fixed: one document left.
		Expect(k8sClient.Delete(ctx, &leasev1alpha1.LeaseDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: systemNS, Name: "later-b"}})).To(Succeed())
		Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, p.Name)) }).Should(BeFalse())
		// The gate goes first, then the condition is written (Admitter.granted).
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, p.Name)) }).Should(HaveField("Reason", podadmit.ReasonGranted))
	})

	It("keeps a pod gated while the store is down, telling its tenant so without the driver's text", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		defineLease(ctx, "storedown", storeDownLease, 1)
		p := newPod(ns, "down", map[string]string{podadmit.AnnotationLease: storeDownLease})
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, p.Name)) }).Should(And(
			HaveField("Status", corev1.ConditionFalse), HaveField("Reason", podadmit.ReasonStoreUnavailable),
			HaveField("Message", MatchRegexp(`^the lease store is unavailable \(correlation id [0-9a-f]{16} in the manager's log\)$`))))
		Expect(podadmit.Gated(getPod(ctx, ns, p.Name))).To(BeTrue())
		var events corev1.EventList
		Eventually(func() []corev1.Event {
			Expect(k8sClient.List(ctx, &events, client.InNamespace(ns))).To(Succeed())
			return events.Items
		}).Should(ContainElement(HaveField("Reason", podadmit.ReasonStoreUnavailable)))
		for _, e := range events.Items {
			Expect(e.Message).NotTo(ContainSubstring("mongo-0"), "Event %s", e.Name)
			Expect(e.Message).NotTo(ContainSubstring("topology"), "Event %s", e.Name)
		}
	})

	It("adopts a lease already granted for the pod (a manager that stopped before removing the gate)", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "acme")
		p := newPod(ns, "adopted", map[string]string{podadmit.AnnotationLease: "adopt"})
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		// Not defined yet: the pod waits, and no acquisition runs.
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, p.Name)) }).Should(
			HaveField("Reason", podadmit.ReasonDefinitionError))
		// The earlier manager's grant: a holder of the lease bound to this pod.
		h, err := store.Acquire(ctx, leasestore.AcquireRequest{LeaseName: "adopt", Resource: "adopt", Tenant: "acme", Project: podadmit.DefaultProject,
			Type: podadmit.DefaultType, Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}},
			Pod: lease.PodRef{Namespace: ns, Name: p.Name, UID: string(p.UID)}, PodBound: true, TTL: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		defineLease(ctx, "adopt-system", "adopt", 1)
		// With a cap of one, a second acquisition would wait for ever: adoption admits it.
		Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, p.Name)) }).Should(BeFalse())
		cur := getPod(ctx, ns, p.Name)
		Expect(cur.Annotations).To(HaveKeyWithValue(podadmit.AnnotationHolder, h.ID))
		Expect(cur.Annotations).To(HaveKeyWithValue(podadmit.AnnotationFence, strconv.FormatInt(h.Fence, 10)))
		hs, err := store.ListHolders(ctx, leasestore.HolderFilter{Resource: "adopt"})
		Expect(err).NotTo(HaveOccurred())
		Expect(hs).To(HaveLen(1), "no second lease")
		Expect(k8sClient.Delete(ctx, cur, client.GracePeriodSeconds(0))).To(Succeed())
	})

	It("leaves nothing behind when a waiting pod is deleted", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "globex")
		defineLease(ctx, "solo-system", "solo", 1)
		first := newPod(ns, "first", map[string]string{podadmit.AnnotationLease: "solo"})
		Expect(k8sClient.Create(ctx, first)).To(Succeed())
		Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, first.Name)) }).Should(BeFalse())
		second := newPod(ns, "second", map[string]string{podadmit.AnnotationLease: "solo"})
		Expect(k8sClient.Create(ctx, second)).To(Succeed())
		Eventually(func() int {
			ws, _ := store.ListWaiters(ctx, leasestore.HolderFilter{Tenant: "globex"})
			return len(ws)
		}).Should(Equal(1))
		Expect(k8sClient.Delete(ctx, second, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() int {
			ws, _ := store.ListWaiters(ctx, leasestore.HolderFilter{Tenant: "globex"})
			return len(ws)
		}).Should(BeZero(), "the deleted pod's place is given up")
		Expect(k8sClient.Delete(ctx, first, client.GracePeriodSeconds(0))).To(Succeed())
		Eventually(func() int {
			hs, _ := store.ListHolders(ctx, leasestore.HolderFilter{Tenant: "globex"})
			return len(hs)
		}).Should(BeZero(), "the admitted pod's lease released when it was deleted")
	})
})

func names(pods []*corev1.Pod) []string {
	var out []string
	for _, p := range pods {
		out = append(out, p.Name)
	}
	return out
}
