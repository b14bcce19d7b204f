package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// kubectl runs the real kubectl binary against the suite's control plane as a cluster
// administrator and returns its combined output.
func kubectl(ctx context.Context, args ...string) (string, error) {
	path, err := exec.LookPath("kubectl")
	if err != nil {
		Skip("the kubectl binary is needed: " + err.Error())
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, path, append([]string{"--kubeconfig", kubeconfigPath}, args...)...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// effective acquires req on api and returns the answer without its token: the effective
// definition as that process resolved it, byte for byte. The lease is released at once.
func effective(g Gomega, api *apiClient, req acquireRequest) string {
	r := api.acquire(g, req)
	g.Expect(r.Status).To(Equal(http.StatusOK), "%s: %s", api.name, r)
	var body map[string]any
	g.Expect(json.Unmarshal(r.Body, &body)).To(Succeed())
	if token, ok := body["token"].(string); ok {
		g.Expect(api.release(g, token).Status).To(Equal(http.StatusOK))
	}
	// The token and the fence are the grant's own; the rest is the effective definition.
	delete(body, "token")
	delete(body, "fence")
	out, err := json.Marshal(body)
	g.Expect(err).NotTo(HaveOccurred())
	return string(out)
}

var _ = Describe("Tenancy", func() {
	It("gives agents exactly the manager's definitions, the built-in ConfigMap's included, and fails closed without the manager", func(ctx SpecContext) {
		// Each process is asked for its own pod's tenant: app-0's (acme) on the manager from
		// 127.0.0.1 and on its agent, the other pod's (globex) on the manager from its address
		// and on its agent.
		type asked struct {
			req            acquireRequest
			manager, agent *apiClient
		}
		cases := []asked{
			{acquireRequest{Type: "tex", Lease: "tex", Tenant: tenant, Project: "website", User: "ann"}, managerAPI, agentAPI},
			{acquireRequest{Type: "tex", Lease: "tex", Tenant: otherTenant, Project: "web", User: "ann"}, otherManagerAPI, otherAgentAPI},
			{acquireRequest{Type: "tex", Lease: "browser", Tenant: otherTenant, Project: "web", User: "ann"}, otherManagerAPI, otherAgentAPI},
			{acquireRequest{Type: "tex", Lease: builtinOnlyLease, Tenant: otherTenant, Project: "web", User: "ann"}, otherManagerAPI, otherAgentAPI},
		}
		for _, c := range cases {
			Eventually(func(g Gomega) {
				fromManager := effective(g, c.manager, c.req)
				g.Expect(effective(g, c.agent, c.req)).To(Equal(fromManager), "lease %s in %s/%s", c.req.Lease, c.req.Tenant, c.req.Project)
			}).Should(Succeed())
		}

		By("the lease defined only in the ConfigMap taking a slot on the agent, not NOOP")
		l := otherAgentAPI.mustAcquire(cases[3].req)
		Expect(l.NoOp).To(BeFalse())
		Expect(l.Resource).To(Equal("e2e-pool"))
		Expect(l.Levels).To(Equal([]leaseLevel{
			{Level: "user", Scope: otherTenant + "/ann", Cap: 1}, {Level: "tenant", Scope: otherTenant, Cap: 2}, {Level: "global", Scope: "*", Cap: 4},
		}))
		Expect(otherAgentAPI.release(Default, l.Token).Status).To(Equal(http.StatusOK))

		By("an agent that cannot reach its manager: not ready, and 503 for every lease")
		Eventually(func(g Gomega) {
			g.Expect(bareAgentProc.exited()).To(BeFalse(), bareAgentProc.describe())
			resp, err := boundedHTTP.Get(bareAgentReadyURL)
			g.Expect(err).NotTo(HaveOccurred())
			_ = resp.Body.Close()
			g.Expect(resp.StatusCode).To(Equal(http.StatusServiceUnavailable))
		}).Should(Succeed())
		for _, c := range cases {
			req := c.req
			req.Tenant = tenant // the bare agent runs in app-0, acme's
			r := bareAgentAPI.acquireRefused(Default, req)
			Expect(r.Status).To(Equal(http.StatusServiceUnavailable), "%s", r)
			Expect(decode[apiError](Default, r).Error).To(Equal("LEASE_UNAVAILABLE"))
		}
		expectAtRest(otherTenant)
		expectAtRest(tenant)
	})

	It("refuses the team-a attack at kubectl apply and, without the policy, lets it change nothing", func(ctx SpecContext) {
		root, err := mongotest.RepoRoot()
		Expect(err).NotTo(HaveOccurred())
		scopes := []acquireRequest{
			{Type: "tex", Lease: "tex", Tenant: tenant, Project: "website", User: "ann"},
			{Type: "tex", Lease: "tex", Tenant: otherTenant, Project: "web", User: "ann"},
		}
		// Each tenant's scope is asked of the manager and of the agent as that tenant's pod.
		apis := map[string][]*apiClient{tenant: {managerAPI, agentAPI}, otherTenant: {otherManagerAPI, otherAgentAPI}}
		before := map[string]string{}
		for _, req := range scopes {
			before[req.Tenant] = effective(Default, apis[req.Tenant][0], req)
		}

		attack := filepath.Join(workDir, "team-a-attack.yaml")
		// team-a: an unrelated namespace, no tenant's.
		if err := k8sClient.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}); !apierrors.IsAlreadyExists(err) {
			Expect(err).NotTo(HaveOccurred())
		}
		Expect(os.WriteFile(attack, []byte(`apiVersion: lease.vancetope.io/v1alpha1
kind: LeaseDefinition
metadata:
  name: tex-system
  namespace: team-a
spec:
  leaseName: tex
  tenant: _vance
  project: _tenant
  levels:
    global: 1
`), 0o600)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			ld := &leasev1alpha1.LeaseDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tex-system"}}
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ld))).To(Succeed())
		})

		By("installing the shipped policy (its parameter in lease-system, as make run has it)")
		out, err := kubectl(ctx, "apply", "-k", filepath.Join(root, "config", "policy"))
		Expect(err).NotTo(HaveOccurred(), out)
		DeferCleanup(func(ctx SpecContext) {
			out, err := kubectl(ctx, "delete", "--ignore-not-found", "-k", filepath.Join(root, "config", "policy"))
			Expect(err).NotTo(HaveOccurred(), out)
		})

		By("kubectl apply of a system-layer document in team-a being refused, naming the right namespace")
		refusal := `the system layer (tenant _vance) belongs in the system namespace "` + systemNamespace + `", not in "team-a"`
		// The API server applies a new policy asynchronously: wait with a server-side dry run,
		// which runs admission but stores nothing.
		Eventually(func(g Gomega) {
			out, err := kubectl(ctx, "create", "--dry-run=server", "-f", attack)
			g.Expect(err).To(HaveOccurred(), out)
			g.Expect(out).To(ContainSubstring(refusal))
		}).Should(Succeed())
		out, err = kubectl(ctx, "apply", "-f", attack)
		Expect(err).To(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(refusal))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: "team-a", Name: "tex-system"}, &leasev1alpha1.LeaseDefinition{})).
			To(MatchError(ContainSubstring("not found")))

		By("without the policy, the document is stored but counts for nothing")
		out, err = kubectl(ctx, "delete", "validatingadmissionpolicybinding", "leasedefinition-tenancy")
		Expect(err).NotTo(HaveOccurred(), out)
		Eventually(func(g Gomega) {
			out, err := kubectl(ctx, "apply", "-f", attack)
			g.Expect(err).NotTo(HaveOccurred(), out)
		}).Should(Succeed())
		stored := &leasev1alpha1.LeaseDefinition{ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Name: "tex-system"}}
		expectCondition(ctx, stored, metav1.ConditionFalse, leasev1alpha1.ReasonNamespaceNotPermitted)
		out, err = kubectl(ctx, "get", "leasedefinition", "-n", "team-a", "tex-system", "-o", "wide")
		Expect(err).NotTo(HaveOccurred(), out)
		Expect(out).To(ContainSubstring(leasev1alpha1.ReasonNamespaceNotPermitted))

		for _, req := range scopes {
			for _, api := range apis[req.Tenant] {
				Consistently(func(g Gomega) {
					g.Expect(effective(g, api, req)).To(Equal(before[req.Tenant]), "%s: tenant %s", api.name, req.Tenant)
				}).Should(Succeed())
			}
		}
		Expect(strings.Contains(before["acme"], `"cap":6`)).To(BeTrue(), "the global cap stays the system layer's: %s", before["acme"])
		expectAtRest(tenant)
		expectAtRest(otherTenant)
	})
})
