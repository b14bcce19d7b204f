package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Borrowing and priority through the HTTP API of the built manager (docs/borrowing.md,
// docs/waiting.md "Priority").

// defineSystemLease creates a system-layer LeaseDefinition for one spec.
func defineSystemLease(ctx context.Context, name string, spec leasev1alpha1.LeaseDefinitionSpec) {
	GinkgoHelper()
	spec.LeaseName, spec.Tenant, spec.Project = name, "_vance", "_tenant"
	d := &leasev1alpha1.LeaseDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: systemNamespace, Name: name + "-system"}, Spec: spec}
	Expect(k8sClient.Create(ctx, d)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) { Expect(k8sClient.Delete(ctx, d)).To(Succeed()) })
}

// answer is an acquisition answered on its own goroutine.
type answer struct {
	resp response
	err  error
}

func acquireAsync(api *apiClient, req acquireRequest) <-chan answer {
	ch := make(chan answer, 2) // a failed assertion sends, and so does the end
	go func() {
		defer GinkgoRecover()
		g := NewGomega(func(message string, _ ...int) { ch <- answer{err: errString(message)} })
		ch <- answer{resp: api.acquire(g, req)}
	}()
	return ch
}

type errString string

func (e errString) Error() string { return string(e) }

// acquireOnceDefined acquires req on the manager without waiting, as soon as the new
// definition has reached it.
func acquireOnceDefined(req acquireRequest) granted {
	GinkgoHelper()
	var l granted
	// Until then the name is unknown to it, which an HTTP acquisition answers as NOOP.
	Eventually(func(g Gomega) bool {
		r := managerAPI.acquire(g, req.withWait(0))
		g.Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
		g.Expect(json.Unmarshal(r.Body, &l)).To(Succeed())
		return l.NoOp
	}).Should(BeFalse(), "the definition reaching the manager")
	return l
}

func tokenOf(r response) string {
	var l granted
	Expect(json.Unmarshal(r.Body, &l)).To(Succeed(), "%s", r)
	return l.Token
}

var _ = Describe("Sharing a resource between tenants", func() {
	It("lends an idle slot above the tenant cap and reclaims it for another tenant's waiter", func(ctx SpecContext) {
		defineSystemLease(ctx, "share", leasev1alpha1.LeaseDefinitionSpec{
			Levels:    &leasev1alpha1.LeaseLevels{Tenant: ptr.To(int32(1)), Global: ptr.To(int32(2))},
			Borrowing: &leasev1alpha1.LeaseBorrowing{Enabled: ptr.To(true), GraceSeconds: ptr.To(int32(1))},
		})
		req := acquireRequest{Type: "tex", Lease: "share", Tenant: tenant, Project: "share", User: "u1"}
		first := acquireOnceDefined(req)
		managerAPI.releaseOnCleanup(first.Token)
		By("acme borrowing the idle second slot past its tenant cap of one")
		req.User = "u2"
		borrower := managerAPI.mustAcquire(req.withWait(0))
		h, err := store.GetHolder(ctx, borrower.Token)
		Expect(err).NotTo(HaveOccurred())
		Expect(h.Borrowed).To(BeTrue(), "the second acme holder is borrowed")
		first1, err := store.GetHolder(ctx, first.Token)
		Expect(err).NotTo(HaveOccurred())
		Expect(first1.Borrowed).To(BeFalse())

		By("globex waiting at the full global level: after the grace the borrowed slot is reclaimed for it")
		waiting := acquireAsync(otherManagerAPI, acquireRequest{Type: "tex", Lease: "share", Tenant: otherTenant, Project: "share", User: "g1"}.withWait(15000))
		var got answer
		Eventually(waiting).WithTimeout(10 * time.Second).Should(Receive(&got))
		Expect(got.err).NotTo(HaveOccurred())
		Expect(got.resp.Status).To(Equal(http.StatusOK), "globex's waiter granted: %s", got.resp)
		otherManagerAPI.releaseOnCleanup(tokenOf(got.resp))
		Expect(managerAPI.check(Default, borrower.Token).Status).To(Equal(http.StatusGone), "the borrower's next check: LEASE_LOST")
		Expect(managerAPI.check(Default, first.Token).Status).To(Equal(http.StatusOK), "acme's holder within its cap keeps its lease")
	})

	It("serves a higher-priority waiter first, and refuses a priority above the definition's maximum", func(ctx SpecContext) {
		defineSystemLease(ctx, "urgent", leasev1alpha1.LeaseDefinitionSpec{
			Levels: &leasev1alpha1.LeaseLevels{Global: ptr.To(int32(1))}, MaxPriority: ptr.To(int32(5)),
		})
		req := acquireRequest{Type: "tex", Lease: "urgent", Tenant: tenant, Project: "urgent", User: "u0"}
		holder := acquireOnceDefined(req)

		tooHigh := req
		tooHigh.Priority = 6
		r := managerAPI.acquire(Default, tooHigh.withWait(0))
		Expect(r.Status).To(Equal(http.StatusBadRequest), "%s", r)
		Expect(string(r.Body)).To(SatisfyAll(ContainSubstring(`"field":"priority"`), ContainSubstring("5")))

		inLine := func(n int) {
			GinkgoHelper()
			Eventually(func(g Gomega) int {
				ws, err := store.ListWaiters(ctx, leasestore.HolderFilter{Resource: "urgent"})
				g.Expect(err).NotTo(HaveOccurred())
				return len(ws)
			}).Should(Equal(n))
		}
		low := req
		low.User = "low"
		lowAnswer := acquireAsync(managerAPI, low.withWait(15000))
		inLine(1)
		high := req
		high.User, high.Priority = "high", 5
		highAnswer := acquireAsync(managerAPI, high.withWait(15000))
		inLine(2)

		Expect(managerAPI.release(Default, holder.Token).Status).To(Equal(http.StatusOK))
		var got answer
		Eventually(highAnswer).Should(Receive(&got), "the later, higher-priority waiter served first")
		Expect(got.err).NotTo(HaveOccurred())
		Expect(got.resp.Status).To(Equal(http.StatusOK), "%s", got.resp)
		Consistently(lowAnswer).ShouldNot(Receive(), "the earlier, lower-priority waiter still waits")
		Expect(managerAPI.release(Default, tokenOf(got.resp)).Status).To(Equal(http.StatusOK))
		Eventually(lowAnswer).Should(Receive(&got))
		Expect(got.resp.Status).To(Equal(http.StatusOK), "%s", got.resp)
		Expect(managerAPI.release(Default, tokenOf(got.resp)).Status).To(Equal(http.StatusOK))
	})
})
