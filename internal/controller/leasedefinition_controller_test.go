package controller_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

const (
	sys = leasev1alpha1.SystemTenant
	all = leasev1alpha1.TenantProject
)

// newDef returns an unsaved LeaseDefinition.
func newDef(ns, name, lease, tenant, project string, mutate func(*leasev1alpha1.LeaseDefinitionSpec)) *leasev1alpha1.LeaseDefinition {
	ld := &leasev1alpha1.LeaseDefinition{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Spec:       leasev1alpha1.LeaseDefinitionSpec{LeaseName: lease, Tenant: tenant, Project: project},
	}
	if mutate != nil {
		mutate(&ld.Spec)
	}
	return ld
}

// create creates the object and deletes it when the spec ends (envtest has no namespace
// controller, so deleting the namespace would leave it behind).
func create(ctx context.Context, ld *leasev1alpha1.LeaseDefinition) *leasev1alpha1.LeaseDefinition {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, ld)).To(Succeed())
	DeferCleanup(func(ctx SpecContext) {
		Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ld))).To(Succeed())
	})
	return ld
}

func update(ctx context.Context, ld *leasev1alpha1.LeaseDefinition, mutate func(*leasev1alpha1.LeaseDefinitionSpec)) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ld), ld)).To(Succeed())
		mutate(&ld.Spec)
		g.Expect(k8sClient.Update(ctx, ld)).To(Succeed())
	}).Should(Succeed())
}

func remove(ctx context.Context, ld *leasev1alpha1.LeaseDefinition) {
	GinkgoHelper()
	Expect(k8sClient.Delete(ctx, ld)).To(Succeed())
}

// expectResolves waits until the resolver (reading the manager's cache) resolves lease in
// (tenant, project) to want.
func expectResolves(ctx context.Context, tenant, project, lease string, want definition.Definition) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		got, err := resolver.Resolve(ctx, tenant, project, lease)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(got).To(Equal(want))
	}).Should(Succeed())
}

// expectUnavailable waits until resolving lease in (tenant, project) fails closed.
func expectUnavailable(ctx context.Context, tenant, project, name string, cause error) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		_, err := resolver.Resolve(ctx, tenant, project, name)
		g.Expect(err).To(MatchError(lease.ErrUnavailable))
		g.Expect(err).To(MatchError(cause))
	}).Should(Succeed())
}

// expectStatus waits until the object's status is current for its generation and passes check.
func expectStatus(ctx context.Context, ld *leasev1alpha1.LeaseDefinition, check func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus)) {
	GinkgoHelper()
	Eventually(func(g Gomega) {
		var cur leasev1alpha1.LeaseDefinition
		g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ld), &cur)).To(Succeed())
		g.Expect(cur.Status.ObservedGeneration).To(Equal(cur.Generation))
		for _, c := range cur.Status.Conditions {
			g.Expect(c.ObservedGeneration).To(Equal(cur.Generation), "condition %s", c.Type)
		}
		check(g, cur.Status)
	}).Should(Succeed())
}

func haveCondition(typ string, status metav1.ConditionStatus, reason string) func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
	return func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
		c := meta.FindStatusCondition(st.Conditions, typ)
		g.Expect(c).NotTo(BeNil(), "condition %s", typ)
		g.Expect(c.Status).To(Equal(status), "condition %s: %s", typ, c.Message)
		g.Expect(c.Reason).To(Equal(reason), "condition %s: %s", typ, c.Message)
	}
}

func levels(global, tenant, project, user int32) *leasev1alpha1.LeaseLevels {
	l := &leasev1alpha1.LeaseLevels{}
	for _, c := range []struct {
		dst **int32
		v   int32
	}{{&l.Global, global}, {&l.Tenant, tenant}, {&l.Project, project}, {&l.User, user}} {
		if c.v > 0 {
			*c.dst = ptr.To(c.v)
		}
	}
	return l
}

var _ = Describe("LeaseDefinition", func() {
	var (
		ns string
		// home returns the namespace a layer of tenant belongs in: the system namespace for
		// the system layer, otherwise one namespace of the tenant per spec.
		home func(tenant string) string
	)

	BeforeEach(func(ctx SpecContext) {
		ns = freshNamespace(ctx)
		homes := map[string]string{sys: systemNS}
		home = func(tenant string) string {
			if _, ok := homes[tenant]; !ok {
				// Called from the spec: the BeforeEach's context is done by then.
				homes[tenant] = tenantNamespace(context.Background(), tenant)
			}
			return homes[tenant]
		}
	})

	It("merges every layer field by field and reports ignored fields in status", func(ctx SpecContext) {
		// Built-in suitebuiltin: resource pool-a, global 10, tenant 4, project 2, ttl 60.
		system := create(ctx, newDef(systemNS, ns+"-system", "suitebuiltin", sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(8, 0, 0, 0)
			s.WaitMs = ptr.To[int32](1000)
			s.Fairness = ptr.To(leasev1alpha1.FairnessGlobal)
		}))
		tenant := create(ctx, newDef(home("t1"), "tenant-t1", "suitebuiltin", "t1", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(100, 3, 0, 0)                    // a tenant cannot raise the global ceiling
			s.Fairness = ptr.To(leasev1alpha1.FairnessProcess) // nor opt out of the operator's order
		}))
		project := create(ctx, newDef(home("t1"), "project-t1-p1", "suitebuiltin", "t1", "p1", func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Resource = ptr.To("mine") // a project does not land on its own counter
			s.Levels = levels(0, 0, 1, 1)
			s.TTLSeconds = ptr.To[int32](30)
		}))

		expectResolves(ctx, "t1", "p1", "suitebuiltin", definition.Definition{Name: "suitebuiltin", Resource: "pool-a",
			Caps: definition.Caps{Global: 8, Tenant: 3, Project: 1, User: 1}, TTL: 30 * time.Second, Wait: time.Second, Fairness: definition.FairGlobal})
		expectResolves(ctx, "t1", "p2", "suitebuiltin", definition.Definition{Name: "suitebuiltin", Resource: "pool-a",
			Caps: definition.Caps{Global: 8, Tenant: 3, Project: 2}, TTL: time.Minute, Wait: time.Second, Fairness: definition.FairGlobal})
		expectResolves(ctx, "t2", "p1", "suitebuiltin", definition.Definition{Name: "suitebuiltin", Resource: "pool-a",
			Caps: definition.Caps{Global: 8, Tenant: 4, Project: 2}, TTL: time.Minute, Wait: time.Second, Fairness: definition.FairGlobal})

		expectStatus(ctx, system, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)(g, st)
			haveCondition(leasev1alpha1.ConditionFieldsIgnored, metav1.ConditionFalse, leasev1alpha1.ReasonAllFieldsOwned)(g, st)
			g.Expect(st.IgnoredFields).To(BeEmpty())
			g.Expect(st.Effective).To(Equal(&leasev1alpha1.EffectiveDefinition{
				Resource: "pool-a", Levels: levels(8, 4, 2, 0), TTLSeconds: 60, WaitMs: ptr.To[int32](1000), Fairness: leasev1alpha1.FairnessGlobal}))
		})
		expectStatus(ctx, tenant, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)(g, st)
			haveCondition(leasev1alpha1.ConditionFieldsIgnored, metav1.ConditionTrue, leasev1alpha1.ReasonFieldsNotOwned)(g, st)
			g.Expect(st.IgnoredFields).To(Equal([]string{"levels.global", "fairness"}))
			g.Expect(st.Effective).To(Equal(&leasev1alpha1.EffectiveDefinition{
				Resource: "pool-a", Levels: levels(8, 3, 2, 0), TTLSeconds: 60, WaitMs: ptr.To[int32](1000), Fairness: leasev1alpha1.FairnessGlobal}))
		})
		expectStatus(ctx, project, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)(g, st)
			haveCondition(leasev1alpha1.ConditionFieldsIgnored, metav1.ConditionTrue, leasev1alpha1.ReasonFieldsNotOwned)(g, st)
			g.Expect(st.IgnoredFields).To(Equal([]string{"resource"}))
			g.Expect(st.Effective).To(Equal(&leasev1alpha1.EffectiveDefinition{
				Resource: "pool-a", Levels: levels(8, 3, 1, 1), TTLSeconds: 30, WaitMs: ptr.To[int32](1000), Fairness: leasev1alpha1.FairnessGlobal}))
		})
	})

	It("refuses a tenant layer that moves a capped lease to another resource (CapNotPermitted)", func(ctx SpecContext) {
		// Built-in suitebuiltin caps pool-a (global 10, tenant 4): a tenant may not take it
		// out of those ceilings (docs/tenancy.md, "Caps belong to the resource").
		moved := create(ctx, newDef(home("t3"), "tenant-t3", "suitebuiltin", "t3", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Resource = ptr.To("pool-t3")
		}))
		expectStatus(ctx, moved, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonCapNotPermitted))
		expectUnavailable(ctx, "t3", "p1", "suitebuiltin", definition.ErrCapNotPermitted)
	})

	It("refuses a tenant layer that moves a lease with operator priority and borrowing but no caps (CapNotPermitted)", func(ctx SpecContext) {
		// The operator's lease takes its caps from its resource and adds priority and
		// borrowing: moved elsewhere, it would carry them to a resource whose own lease allows
		// neither (issue 42).
		lease := ns
		create(ctx, newDef(systemNS, ns+"-system", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Resource = ptr.To("pool-a")
			s.MaxPriority = ptr.To[int32](100)
			s.Borrowing = &leasev1alpha1.LeaseBorrowing{Enabled: ptr.To(true)}
		}))
		moved := create(ctx, newDef(home("t5"), "tenant-t5", lease, "t5", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Resource = ptr.To("pool-t5")
		}))
		expectStatus(ctx, moved, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonCapNotPermitted))
		expectUnavailable(ctx, "t5", "p1", lease, definition.ErrCapNotPermitted)
	})

	It("refuses a tenant's own lease on a resource whose built-in document does not load, and says why", func(ctx SpecContext) {
		own := create(ctx, newDef(home("t6"), "tenant-t6", ns, "t6", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Resource = ptr.To("suitebroken")
			s.Levels = levels(0, 0, 0, 1)
		}))
		expectStatus(ctx, own, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonLayerUnavailable)(g, st)
			g.Expect(meta.FindStatusCondition(st.Conditions, leasev1alpha1.ConditionReady).Message).To(
				ContainSubstring(`resource "suitebroken": defaults-dir suitebroken.yaml does not load`))
		})
		expectUnavailable(ctx, "t6", "p1", ns, definition.ErrOperatorDocumentBroken)
	})

	It("re-resolves every scope after a system-layer update, and only the tenant's after a tenant-layer update", func(ctx SpecContext) {
		lease := ns // unique per spec
		system := create(ctx, newDef(systemNS, ns+"-system", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(5, 0, 0, 0)
		}))
		tenantA := create(ctx, newDef(home("a"), "tenant-a", lease, "a", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 2, 0, 0)
		}))
		def := func(global, tenant int) definition.Definition {
			return definition.Definition{Name: lease, Resource: lease, Caps: definition.Caps{Global: global, Tenant: tenant},
				TTL: definition.DefaultTTL, Wait: definition.DefaultWait, Fairness: definition.FairProcess}
		}
		// Resolve (and cache) three scopes.
		expectResolves(ctx, "a", "p", lease, def(5, 2))
		expectResolves(ctx, "a", all, lease, def(5, 2))
		expectResolves(ctx, "b", "q", lease, def(5, 0))

		update(ctx, system, func(s *leasev1alpha1.LeaseDefinitionSpec) { s.Levels.Global = ptr.To[int32](7) })
		expectResolves(ctx, "a", "p", lease, def(7, 2))
		expectResolves(ctx, "a", all, lease, def(7, 2))
		expectResolves(ctx, "b", "q", lease, def(7, 0))
		// The tenant object's effective definition follows the system layer.
		expectStatus(ctx, tenantA, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			g.Expect(st.Effective).NotTo(BeNil())
			g.Expect(st.Effective.Levels).To(Equal(levels(7, 2, 0, 0)))
		})

		update(ctx, tenantA, func(s *leasev1alpha1.LeaseDefinitionSpec) { s.Levels.Tenant = ptr.To[int32](1) })
		expectResolves(ctx, "a", "p", lease, def(7, 1))
		expectResolves(ctx, "b", "q", lease, def(7, 0))
	})

	It("fails closed on a conflict for the affected scopes and recovers when it is removed", func(ctx SpecContext) {
		lease := ns
		create(ctx, newDef(systemNS, ns+"-system", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(3, 0, 0, 0)
		}))
		tenantA := create(ctx, newDef(home("a"), "tenant-a", lease, "a", all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 2, 0, 0)
		}))
		first := create(ctx, newDef(home("a"), "a-p-first", lease, "a", "p", func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 0, 1, 0)
		}))
		def := func(project int) definition.Definition {
			return definition.Definition{Name: lease, Resource: lease, Caps: definition.Caps{Global: 3, Tenant: 2, Project: project},
				TTL: definition.DefaultTTL, Wait: definition.DefaultWait, Fairness: definition.FairProcess}
		}
		expectResolves(ctx, "a", "p", lease, def(1))

		// A second object for the same (leaseName, tenant, project), in another namespace of
		// the tenant.
		otherNS := tenantNamespace(ctx, "a")
		second := create(ctx, newDef(otherNS, "a-p-second", lease, "a", "p", func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 0, 5, 0)
		}))
		expectUnavailable(ctx, "a", "p", lease, definition.ErrConflict)
		expectResolves(ctx, "a", "q", lease, def(0)) // a sibling scope is not affected
		for _, ld := range []*leasev1alpha1.LeaseDefinition{first, second} {
			expectStatus(ctx, ld, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
				haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonConflict)(g, st)
				g.Expect(meta.FindStatusCondition(st.Conditions, leasev1alpha1.ConditionReady).Message).
					To(And(ContainSubstring(home("a")+"/a-p-first"), ContainSubstring(otherNS+"/a-p-second")))
				g.Expect(st.Effective).To(BeNil())
			})
		}

		// A conflict at the system layer makes every scope unavailable.
		dupSystem := create(ctx, newDef(systemNS, ns+"-system-dup", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(30, 0, 0, 0)
		}))
		expectUnavailable(ctx, "a", "q", lease, definition.ErrConflict)
		expectUnavailable(ctx, "z", "z", lease, definition.ErrConflict)
		expectStatus(ctx, tenantA, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonLayerUnavailable))

		// Fixing the system layer restores the scopes that were only affected by it.
		remove(ctx, dupSystem)
		expectResolves(ctx, "a", "q", lease, def(0))
		expectStatus(ctx, tenantA, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved))
		expectUnavailable(ctx, "a", "p", lease, definition.ErrConflict)

		// Removing the second project object restores its scope.
		remove(ctx, second)
		expectResolves(ctx, "a", "p", lease, def(1))
		expectStatus(ctx, first, haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved))
	})

	It("puts back a status that another write changed", func(ctx SpecContext) {
		// The controller compares its verdict with the status its cache shows; a status that
		// changes under it must bring it back, or a write computed from a stale copy stays.
		system := create(ctx, newDef(systemNS, ns+"-system", ns, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(4, 0, 0, 0)
		}))
		resolved := func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
			haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)(g, st)
			g.Expect(st.Effective).NotTo(BeNil())
		}
		expectStatus(ctx, system, resolved)
		Eventually(func(g Gomega) {
			var cur leasev1alpha1.LeaseDefinition
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(system), &cur)).To(Succeed())
			cur.Status.Effective = nil
			meta.SetStatusCondition(&cur.Status.Conditions, metav1.Condition{Type: leasev1alpha1.ConditionReady,
				Status: metav1.ConditionFalse, Reason: leasev1alpha1.ReasonConflict, Message: "written by a stale reconcile",
				ObservedGeneration: cur.Generation})
			g.Expect(k8sClient.Status().Update(ctx, &cur)).To(Succeed())
		}).Should(Succeed())
		expectStatus(ctx, system, resolved)
	})

	It("drops a deleted object out of the merge", func(ctx SpecContext) {
		lease := ns
		system := create(ctx, newDef(systemNS, ns+"-system", lease, sys, all, func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(5, 0, 0, 1)
		}))
		project := create(ctx, newDef(home("a"), "a-p", lease, "a", "p", func(s *leasev1alpha1.LeaseDefinitionSpec) {
			s.Levels = levels(0, 0, 0, 2)
			s.WaitMs = ptr.To[int32](0)
		}))
		expectResolves(ctx, "a", "p", lease, definition.Definition{Name: lease, Resource: lease,
			Caps: definition.Caps{Global: 5, User: 2}, TTL: definition.DefaultTTL, Wait: 0, Fairness: definition.FairProcess})

		remove(ctx, project)
		expectResolves(ctx, "a", "p", lease, definition.Definition{Name: lease, Resource: lease,
			Caps: definition.Caps{Global: 5, User: 1}, TTL: definition.DefaultTTL, Wait: definition.DefaultWait, Fairness: definition.FairProcess})

		remove(ctx, system)
		expectResolves(ctx, "a", "p", lease, definition.Definition{Name: lease, Resource: lease,
			TTL: definition.DefaultTTL, Wait: definition.DefaultWait, Fairness: definition.FairProcess})
		d, err := resolver.Resolve(ctx, "a", "p", lease)
		Expect(err).NotTo(HaveOccurred())
		Expect(d.NoOp()).To(BeTrue())
	})

	DescribeTable("the API server rejects invalid definitions",
		func(ctx SpecContext, mutate func(*leasev1alpha1.LeaseDefinition), wantMsg string) {
			ld := newDef(ns, "bad", "tex", "acme", "web", nil)
			mutate(ld)
			err := k8sClient.Create(ctx, ld)
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "error %v", err)
			Expect(err.Error()).To(ContainSubstring(wantMsg))
		},
		Entry("a cap of 0", func(ld *leasev1alpha1.LeaseDefinition) {
			ld.Spec.Levels = &leasev1alpha1.LeaseLevels{Global: ptr.To[int32](0)}
		},
			"spec.levels.global"),
		Entry("a negative cap", func(ld *leasev1alpha1.LeaseDefinition) {
			ld.Spec.Levels = &leasev1alpha1.LeaseLevels{User: ptr.To[int32](-1)}
		},
			"spec.levels.user"),
		Entry("a lease name with a slash", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.LeaseName = "a/b" },
			"spec.leaseName"),
		Entry("a lease name starting with a dash", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.LeaseName = "-tex" },
			"spec.leaseName"),
		Entry("a lease name of 65 characters", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.LeaseName = strings.Repeat("a", 65) },
			"spec.leaseName"),
		Entry("a system layer with a project", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.Tenant = sys },
			"the system layer (tenant _vance) must have project _tenant"),
		Entry("a reserved-looking tenant", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.Tenant = "_other" },
			"spec.tenant"),
		Entry("a ttl of 0", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.TTLSeconds = ptr.To[int32](0) },
			"spec.ttlSeconds"),
		Entry("a negative wait", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.WaitMs = ptr.To[int32](-1) },
			"spec.waitMs"),
		Entry("a resource with a pipe", func(ld *leasev1alpha1.LeaseDefinition) { ld.Spec.Resource = ptr.To("a|b") },
			"spec.resource"),
	)

	It("keeps leaseName, tenant and project immutable", func(ctx SpecContext) {
		ld := create(ctx, newDef(ns, "immutable", ns, "acme", "web", nil))
		for field, mutate := range map[string]func(*leasev1alpha1.LeaseDefinitionSpec){
			"leaseName is immutable": func(s *leasev1alpha1.LeaseDefinitionSpec) { s.LeaseName = "other" },
			"tenant is immutable":    func(s *leasev1alpha1.LeaseDefinitionSpec) { s.Tenant = "other" },
			"project is immutable":   func(s *leasev1alpha1.LeaseDefinitionSpec) { s.Project = "other" },
		} {
			// Retried: the controller's status writes may make an update a conflict.
			Eventually(func(g Gomega) {
				var cur leasev1alpha1.LeaseDefinition
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ld), &cur)).To(Succeed())
				mutate(&cur.Spec)
				err := k8sClient.Update(ctx, &cur)
				g.Expect(apierrors.IsInvalid(err)).To(BeTrue(), "error %v", err)
				g.Expect(err.Error()).To(ContainSubstring(field))
			}).Should(Succeed())
		}
	})

	It("applies every sample under config/samples cleanly", func(ctx SpecContext) {
		dir := filepath.Join("..", "..", "config", "samples")
		entries, err := os.ReadDir(dir)
		Expect(err).NotTo(HaveOccurred())

		var kust struct {
			Resources []string `json:"resources"`
		}
		data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
		Expect(err).NotTo(HaveOccurred())
		Expect(yaml.Unmarshal(data, &kust)).To(Succeed())

		var files []string
		var created []*leasev1alpha1.LeaseDefinition
		for _, e := range entries {
			if e.IsDir() || !strings.HasSuffix(e.Name(), ".yaml") || e.Name() == "kustomization.yaml" {
				continue
			}
			files = append(files, e.Name())
			data, err := os.ReadFile(filepath.Join(dir, e.Name()))
			Expect(err).NotTo(HaveOccurred())
			if e.Name() == "namespaces.yaml" {
				// The samples' own namespaces: the system namespace and acme's.
				for _, doc := range strings.Split(string(data), "\n---\n") {
					var ns corev1.Namespace
					Expect(yaml.UnmarshalStrict([]byte(doc), &ns)).To(Succeed(), "sample %s", e.Name())
					Expect(ns.Kind).To(Equal("Namespace"))
					if err := k8sClient.Create(ctx, &ns); !apierrors.IsAlreadyExists(err) {
						Expect(err).NotTo(HaveOccurred())
					}
				}
				continue
			}
			var ld leasev1alpha1.LeaseDefinition
			Expect(yaml.UnmarshalStrict(data, &ld)).To(Succeed(), "sample %s", e.Name())
			Expect(ld.APIVersion).To(Equal(leasev1alpha1.GroupVersion.String()), "sample %s", e.Name())
			Expect(ld.Kind).To(Equal("LeaseDefinition"), "sample %s", e.Name())
			Expect(ld.Namespace).NotTo(BeEmpty(), "sample %s names the namespace that owns its layer", e.Name())
			created = append(created, ld.DeepCopy())
		}
		// Namespaces first, as kubectl apply -k orders them.
		for i, ld := range created {
			created[i] = create(ctx, ld)
		}
		slices.Sort(kust.Resources)
		Expect(kust.Resources).To(Equal(files), "config/samples/kustomization.yaml lists every sample")

		for _, ld := range created {
			expectStatus(ctx, ld, func(g Gomega, st leasev1alpha1.LeaseDefinitionStatus) {
				haveCondition(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved)(g, st)
				haveCondition(leasev1alpha1.ConditionFieldsIgnored, metav1.ConditionFalse, leasev1alpha1.ReasonAllFieldsOwned)(g, st)
			})
		}
		expectResolves(ctx, "acme", "website", "tex", definition.Definition{Name: "tex", Resource: "tex",
			Caps: definition.Caps{Global: 6, Tenant: 2, Project: 2}, TTL: 5 * time.Minute, Wait: 30 * time.Second, Fairness: definition.FairGlobal})
		expectResolves(ctx, "acme", "docs", "tex", definition.Definition{Name: "tex", Resource: "tex",
			Caps: definition.Caps{Global: 6, Tenant: 2, Project: 1}, TTL: 2 * time.Minute, Wait: 30 * time.Second, Fairness: definition.FairGlobal})
		expectResolves(ctx, "globex", "web", "browser", definition.Definition{Name: "browser", Resource: "browser-sessions",
			Caps: definition.Caps{Global: 20, Tenant: 5, User: 1}, TTL: 5 * time.Minute, Wait: 5 * time.Second, Fairness: definition.FairProcess})
	})
})
