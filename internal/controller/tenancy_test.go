package controller_test

import (
	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// These specs run without the admission policy (envtest installs only the CRDs): the resolver
// alone must keep documents in the wrong namespace out (docs/tenancy.md).
var _ = Describe("LeaseDefinitions and tenant namespaces", func() {
	notPermitted := func(fragments ...string) func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
		return func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonNamespaceNotPermitted)(g, st)
			msg := meta.FindStatusCondition(st.Conditions, leasev1alpha1.ConditionReady).Message
			for _, f := range fragments {
				g.Expect(msg).To(ContainSubstring(f))
			}
			g.Expect(st.Effective).To(BeNil())
		}
	}
	relabel := func(ctx SpecContext, namespace, tenant string) {
		GinkgoHelper()
		Eventually(func(g Gomega) {
			var ns corev1.Namespace
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Name: namespace}, &ns)).To(Succeed())
			if tenant == "" {
				delete(ns.Labels, tenancy.TenantLabel)
			} else {
				ns.Labels[tenancy.TenantLabel] = tenant
			}
			g.Expect(k8sClient.Update(ctx, &ns)).To(Succeed())
		}).Should(Succeed())
	}

	It("leaves documents in the wrong namespace out of every merge and conflict, says why, and follows relabels", func(ctx SpecContext) {
		teamA := freshNamespace(ctx) // the attacker's unlabelled namespace
		lease := teamA
		acmeNS := tenantNamespace(ctx, "acme")
		globexNS := tenantNamespace(ctx, "globex")
		def := func(global, tenant int) definition.Definition {
			return definition.Definition{Name: lease, Resource: lease, Caps: definition.Caps{Global: global, Tenant: tenant},
				TTL: definition.DefaultTTL, Wait: definition.DefaultWait, Fairness: definition.FairProcess}
		}

		create(ctx, newDef(systemNS, lease+"-system", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(5, 0, 0, 0)
		}))
		// The attack: a system-layer document outside the system namespace neither conflicts
		// with the real one nor sets anything.
		attack := create(ctx, newDef(teamA, "system", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(1, 0, 0, 0)
		}))
		// acme's tenant layer in globex's namespace and in an unlabelled one.
		inGlobex := create(ctx, newDef(globexNS, "acme-tenant", lease, "acme", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 1, 0, 0)
		}))
		unlabelled := create(ctx, newDef(teamA, "acme-project", lease, "acme", "web", func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 0, 1, 0)
		}))
		// acme's own tenant layer, and a peer at the same key in the wrong namespace: no conflict.
		own := create(ctx, newDef(acmeNS, "acme-tenant", lease, "acme", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 2, 0, 0)
		}))

		expectResolves(ctx, "acme", "web", lease, def(5, 2))
		expectResolves(ctx, "globex", "web", lease, def(5, 0))
		expectStatus(ctx, attack, notPermitted(`"`+teamA+`"`, `only the system namespace "`+systemNS+`"`))
		expectStatus(ctx, inGlobex, notPermitted(`"`+globexNS+`"`, tenancy.TenantLabel+"=globex", tenancy.TenantLabel+"=acme", acmeNS))
		expectStatus(ctx, unlabelled, notPermitted(`"`+teamA+`"`, "is not labelled "+tenancy.TenantLabel, tenancy.TenantLabel+"=acme"))
		expectStatus(ctx, own, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved))

		// Relabelling globex's namespace to acme brings its document in: now acme has two
		// tenant layers, a conflict among permitted documents.
		relabel(ctx, globexNS, "acme")
		expectUnavailable(ctx, "acme", "web", lease, definition.ErrConflict)
		expectStatus(ctx, inGlobex, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonConflict))
		expectStatus(ctx, own, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonConflict))

		// Unlabelling acme's first namespace leaves the relabelled one's document alone.
		relabel(ctx, acmeNS, "")
		expectResolves(ctx, "acme", "web", lease, def(5, 1))
		expectStatus(ctx, own, notPermitted(`"`+acmeNS+`"`, "is not labelled"))
		expectStatus(ctx, inGlobex, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved))

		// Labelling the attacker's namespace acme brings in its project layer, never its
		// system layer.
		relabel(ctx, teamA, "acme")
		expectResolves(ctx, "acme", "web", lease, definition.Definition{Name: lease, Resource: lease,
			Caps: definition.Caps{Global: 5, Tenant: 1, Project: 1}, TTL: definition.DefaultTTL, Wait: definition.DefaultWait, Fairness: definition.FairProcess})
		expectStatus(ctx, unlabelled, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved))
		expectStatus(ctx, attack, notPermitted(`"`+teamA+`"`))
	})

	It("maps namespaces to tenants from the informer", func(ctx SpecContext) {
		a := tenantNamespace(ctx, "initech")
		b := tenantNamespace(ctx, "initech")
		Eventually(func(g Gomega) {
			g.Expect(tenants.NamespacesOf("initech")).To(Equal(sortedPair(a, b)))
			t, ok := tenants.TenantOf(a)
			g.Expect(ok).To(BeTrue())
			g.Expect(t).To(Equal("initech"))
		}).Should(Succeed())
		_, ok := tenants.TenantOf(systemNS)
		Expect(ok).To(BeFalse())
		Expect(tenants.SystemNamespace()).To(Equal(systemNS))
	})
})

func sortedPair(a, b string) []string {
	if a > b {
		a, b = b, a
	}
	return []string{a, b}
}
