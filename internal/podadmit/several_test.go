package podadmit_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/podadmit"
)

// Pods admitted by several leases at once (docs/pod-admission.md, "Several leases"): the
// annotation lists them, and they are granted together or the pod stays gated.

// defineTenantLease creates a tenant-layer LeaseDefinition of tenant in ns (a namespace of
// that tenant): lease name with a tenant cap, which only that tenant's acquisitions see.
func defineTenantLease(ctx context.Context, ns, tenant, name string, tenantCap int32) {
	GinkgoHelper()
	d := &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec: leasev1alpha1.LeaseDefinitionSpec{LeaseName: name, Tenant: tenant, Project: "_tenant",
			Levels: &leasev1alpha1.LeaseLevels{Tenant: ptr.To(tenantCap)}},
	}
	Expect(k8sClient.Create(ctx, d)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, d))).To(Succeed()) })
}

// holdersOf lists the granted holders f selects.
func holdersOf(ctx context.Context, f leasestore.HolderFilter) []lease.Holder {
	GinkgoHelper()
	hs, err := store.ListHolders(ctx, f)
	Expect(err).NotTo(HaveOccurred())
	return hs
}

// waitingOn is the resource the pod's acquisition waits on, "" when it waits nowhere.
func waitingOn(ctx context.Context, p *corev1.Pod) string {
	GinkgoHelper()
	ws, err := store.ListWaiters(ctx, leasestore.HolderFilter{Pod: p.Namespace + "/" + p.Name})
	Expect(err).NotTo(HaveOccurred())
	if len(ws) == 0 {
		return ""
	}
	return ws[0].Resource
}

// fencesOf reads the admitted-fences annotation: name to fence.
func fencesOf(p *corev1.Pod) map[string]int64 {
	GinkgoHelper()
	out := map[string]int64{}
	for _, pair := range strings.Split(p.Annotations[podadmit.AnnotationFences], ",") {
		name, fence, ok := strings.Cut(pair, "=")
		Expect(ok).To(BeTrue(), "pair %q of %s", pair, podadmit.AnnotationFences)
		f, err := strconv.ParseInt(fence, 10, 64)
		Expect(err).NotTo(HaveOccurred())
		out[name] = f
	}
	return out
}

func admittedFence(p *corev1.Pod) int64 {
	GinkgoHelper()
	f, err := strconv.ParseInt(p.Annotations[podadmit.AnnotationFence], 10, 64)
	Expect(err).NotTo(HaveOccurred())
	return f
}

// The specs' tenants are their own: the other specs count acme's and globex's holders and
// waiters.

var _ = Describe("The gating webhook, for several leases", func() {
	It("gates a pod that lists several leases", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "hooli")
		p := newPod(ns, "pair", map[string]string{podadmit.AnnotationLease: "unknown-a, unknown-b"})
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Expect(p.Spec.SchedulingGates).To(Equal([]corev1.PodSchedulingGate{{Name: podadmit.Gate}}))
		Expect(k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
	})

	DescribeTable("refuses a bad list with the annotation's name, and creates nothing",
		func(ctx SpecContext, value, detail string) {
			ns := tenantNamespace(ctx, "hooli")
			err := k8sClient.Create(ctx, newPod(ns, "bad", map[string]string{podadmit.AnnotationLease: value}))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "%v", err)
			Expect(err).To(MatchError(SatisfyAll(ContainSubstring("metadata.annotations["+podadmit.AnnotationLease+"]"), ContainSubstring(detail))))
			Expect(apierrors.IsNotFound(k8sClient.Get(ctx, client.ObjectKey{Namespace: ns, Name: "bad"}, &corev1.Pod{}))).To(BeTrue())
		},
		Entry("a name twice", "gpu,licence,gpu", "names gpu twice"),
		Entry("an invalid name", "gpu,licence!", `"licence!" is not a valid lease name`),
		Entry("more than eight", "a,b,c,d,e,f,g,h,i", "names 9 leases, at most 8"),
		Entry("an empty name", "gpu,,licence", "has an empty lease name"),
		Entry("none in a list", "gpu,none", `lists "none", which names no lease`),
	)
})

var _ = Describe("Admission by several leases", func() {
	It("admits a pod only once every lease it lists is free, and releases them all when it ends", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "hooli")
		// Resources mgpu before mlic: the store books them in that order whatever the pod lists.
		defineLease(ctx, "mgpu-system", "mgpu", 1)
		defineLease(ctx, "mlic-system", "mlic", 1)
		onGPU := newPod(ns, "on-gpu", map[string]string{podadmit.AnnotationLease: "mgpu"})
		onLic := newPod(ns, "on-lic", map[string]string{podadmit.AnnotationLease: "mlic"})
		for _, p := range []*corev1.Pod{onGPU, onLic} {
			Expect(k8sClient.Create(ctx, p)).To(Succeed())
			Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, p.Name)) }).Should(BeFalse())
		}
		both := newPod(ns, "both", map[string]string{podadmit.AnnotationLease: "mlic,mgpu"})
		Expect(k8sClient.Create(ctx, both)).To(Succeed())
		Eventually(func() string { return waitingOn(ctx, both) }).Should(Equal("mgpu"), "in the line of the first resource")

		By("one lease freed: the pod still waits for the other")
		finish(ctx, onGPU)
		Eventually(func() string { return waitingOn(ctx, both) }).Should(Equal("mlic"), "past mgpu, in the line of mlic")
		cur := getPod(ctx, ns, both.Name)
		Expect(podadmit.Gated(cur)).To(BeTrue())
		Expect(cur.Annotations).NotTo(HaveKey(podadmit.AnnotationHolder))
		Expect(cur.Annotations).NotTo(HaveKey(podadmit.AnnotationFences))
		Expect(holdersOf(ctx, leasestore.HolderFilter{Pod: ns + "/" + both.Name})).To(BeEmpty(), "nothing granted to the pod")

		By("both free: admitted with both")
		finish(ctx, onLic)
		Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, both.Name)) }).Should(BeFalse())
		cur = getPod(ctx, ns, both.Name)
		Expect(cur.Annotations[podadmit.AnnotationFences]).To(MatchRegexp(`^mlic=\d+,mgpu=\d+$`), "in the pod's order")
		Expect(cur.Annotations).NotTo(HaveKey(podadmit.AnnotationFence), "one fence would not say which resource's")
		fences := fencesOf(cur)
		Expect(fences["mgpu"]).To(BeNumerically(">", admittedFence(getPod(ctx, ns, onGPU.Name))))
		Expect(fences["mlic"]).To(BeNumerically(">", admittedFence(getPod(ctx, ns, onLic.Name))))
		hs := holdersOf(ctx, leasestore.HolderFilter{Pod: ns + "/" + both.Name})
		Expect(hs).To(HaveLen(1), "one holder books both")
		Expect(cur.Annotations).To(HaveKeyWithValue(podadmit.AnnotationHolder, hs[0].ID))
		Expect(hs[0].LeaseNames()).To(Equal("mgpu+mlic"))
		for _, part := range hs[0].Parts {
			Expect(fences).To(HaveKeyWithValue(part.LeaseName, part.Fence))
		}
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, both.Name)) }).Should(And(
			HaveField("Status", corev1.ConditionTrue), HaveField("Reason", podadmit.ReasonGranted),
			HaveField("Message", ContainSubstring("Leases mlic, mgpu granted together"))))

		By("the pod ends: both leases released")
		finish(ctx, cur)
		for _, resource := range []string{"mgpu", "mlic"} {
			Eventually(func() []lease.Holder { return holdersOf(ctx, leasestore.HolderFilter{Resource: resource}) }).Should(BeEmpty(), resource)
			counters, err := store.ListCounters(ctx, leasestore.CounterFilter{Resource: resource})
			Expect(err).NotTo(HaveOccurred())
			for _, c := range counters {
				Expect(c.Count).To(BeZero(), "counter %s", c.Key)
			}
		}
	})

	It("resolves each lease for the pod's tenant: one the tenant cannot use keeps the whole pod gated", func(ctx SpecContext) {
		hooli := tenantNamespace(ctx, "hooli")
		initech := tenantNamespace(ctx, "initech")
		defineLease(ctx, "tshared-system", "tshared", 2)
		// Defined for initech only, by initech's tenant layer.
		defineTenantLease(ctx, initech, "initech", "tinitech", 1)
		annotations := map[string]string{podadmit.AnnotationLease: "tshared,tinitech"}
		theirs := newPod(initech, "theirs", annotations)
		Expect(k8sClient.Create(ctx, theirs)).To(Succeed())
		Eventually(func() bool { return podadmit.Gated(getPod(ctx, initech, theirs.Name)) }).Should(BeFalse(), "initech may use both")
		Expect(fencesOf(getPod(ctx, initech, theirs.Name))).To(HaveKey("tinitech"))

		ours := newPod(hooli, "ours", annotations)
		Expect(k8sClient.Create(ctx, ours)).To(Succeed())
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, hooli, ours.Name)) }).Should(And(
			HaveField("Status", corev1.ConditionFalse), HaveField("Reason", podadmit.ReasonDefinitionError),
			HaveField("Message", ContainSubstring(`no LeaseDefinition defines lease "tinitech" for tenant hooli`))))
		Expect(podadmit.Gated(getPod(ctx, hooli, ours.Name))).To(BeTrue())
		Expect(holdersOf(ctx, leasestore.HolderFilter{Pod: hooli + "/" + ours.Name})).To(BeEmpty())
		Expect(holdersOf(ctx, leasestore.HolderFilter{Resource: "tshared", Tenant: "hooli"})).To(BeEmpty(), "not even the lease hooli may use")
		Expect(waitingOn(ctx, ours)).To(BeEmpty())
		for _, p := range []*corev1.Pod{theirs, ours} {
			Expect(k8sClient.Delete(ctx, p, client.GracePeriodSeconds(0))).To(Succeed())
		}
	})

	It("adopts a holder of several leases already granted for the pod, whatever order the pod lists them in", func(ctx SpecContext) {
		ns := tenantNamespace(ctx, "hooli")
		p := newPod(ns, "adopted-pair", map[string]string{podadmit.AnnotationLease: "pairb,paira"})
		Expect(k8sClient.Create(ctx, p)).To(Succeed())
		Eventually(func() *corev1.PodCondition { return condition(getPod(ctx, ns, p.Name)) }).Should(
			HaveField("Reason", podadmit.ReasonDefinitionError))
		// The earlier manager's grant: one holder of both, bound to this pod, its parts in the
		// order of their resources.
		caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
		h, err := store.Acquire(ctx, leasestore.AcquireRequest{Tenant: "hooli", Project: podadmit.DefaultProject, Type: podadmit.DefaultType,
			Parts: []leasestore.Part{{LeaseName: "paira", Resource: "paira", Caps: caps}, {LeaseName: "pairb", Resource: "pairb", Caps: caps}},
			Pod:   lease.PodRef{Namespace: ns, Name: p.Name, UID: string(p.UID)}, PodBound: true, TTL: time.Hour})
		Expect(err).NotTo(HaveOccurred())
		Expect(h.LeaseNames()).To(Equal("paira+pairb"))
		defineLease(ctx, "paira-system", "paira", 1)
		defineLease(ctx, "pairb-system", "pairb", 1)
		// With caps of one, a second acquisition would wait for ever: adoption admits it.
		Eventually(func() bool { return podadmit.Gated(getPod(ctx, ns, p.Name)) }).Should(BeFalse())
		cur := getPod(ctx, ns, p.Name)
		Expect(cur.Annotations).To(HaveKeyWithValue(podadmit.AnnotationHolder, h.ID))
		Expect(cur.Annotations).To(HaveKeyWithValue(podadmit.AnnotationFences,
			fmt.Sprintf("pairb=%d,paira=%d", h.Parts[1].Fence, h.Parts[0].Fence)))
		for _, resource := range []string{"paira", "pairb"} {
			Expect(holdersOf(ctx, leasestore.HolderFilter{Resource: resource})).To(HaveLen(1), "no second lease of %s", resource)
		}
		Expect(k8sClient.Delete(ctx, cur, client.GracePeriodSeconds(0))).To(Succeed())
	})
})
