package controller_test

import (
	"context"
	"os"
	"path/filepath"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// loadPolicyFile decodes one file of config/policy: the shipped file is what is tested.
func loadPolicyFile(name string, into any) {
	GinkgoHelper()
	data, err := os.ReadFile(filepath.Join("..", "..", "config", "policy", name))
	Expect(err).NotTo(HaveOccurred())
	Expect(yaml.UnmarshalStrict(data, into)).To(Succeed(), "config/policy/%s", name)
}

var _ = Describe("The tenancy admission policy (config/policy)", Ordered, func() {
	const scopeLabel = "lease.vancetope.io/policy-test"
	var (
		user     client.Client
		sysNS    string
		acmeNS   string
		globexNS string
		plainNS  string
	)
	namespace := func(ctx context.Context, tenant string) string {
		GinkgoHelper()
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "policy-", Labels: map[string]string{scopeLabel: "true"}}}
		if tenant != "" {
			ns.Labels[tenancy.TenantLabel] = tenant
		}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, ns))).To(Succeed()) })
		return ns.Name
	}
	// write creates the document as the tenant administrator, server-side dry run: admission
	// runs in full, nothing is stored.
	write := func(ctx context.Context, ns, tenant, project string) error {
		ld := newDef(ns, "doc", "tex", tenant, project, func(s *leasev1alpha1.LeaseDefinitionSpec) { s.Levels = levels(0, 0, 1, 0) })
		return user.Create(ctx, ld, client.DryRunAll)
	}

	BeforeAll(func(ctx SpecContext) {
		sysNS = namespace(ctx, "")
		acmeNS = namespace(ctx, "acme")
		globexNS = namespace(ctx, "globex")
		plainNS = namespace(ctx, "")

		var (
			policy  admissionregistrationv1.ValidatingAdmissionPolicy
			binding admissionregistrationv1.ValidatingAdmissionPolicyBinding
			params  corev1.ConfigMap
		)
		loadPolicyFile("policy.yaml", &policy)
		loadPolicyFile("binding.yaml", &binding)
		loadPolicyFile("params.yaml", &params)
		// The documented substitution: the parameter ConfigMap lives in the system namespace.
		params.Namespace = sysNS
		binding.Spec.ParamRef.Namespace = sysNS
		// Test-only: confine the binding to this container's namespaces, so that the other
		// specs of the suite keep testing the resolver without the policy.
		binding.Spec.MatchResources = &admissionregistrationv1.MatchResources{
			NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{scopeLabel: "true"}}}
		for _, obj := range []client.Object{&policy, &params, &binding} {
			Expect(k8sClient.Create(ctx, obj)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
		}

		// A tenant administrator: may write LeaseDefinitions anywhere, but is no
		// system:masters member.
		role := &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: "policy-test-ldef-writer"},
			Rules: []rbacv1.PolicyRule{{APIGroups: []string{leasev1alpha1.GroupVersion.Group},
				Resources: []string{"leasedefinitions"}, Verbs: []string{"get", "list", "create", "update", "delete"}}}}
		roleBinding := &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "policy-test-ldef-writer"},
			RoleRef:  rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: role.Name},
			Subjects: []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: "User", Name: "tenant-admin"}}}
		for _, obj := range []client.Object{role, roleBinding} {
			Expect(k8sClient.Create(ctx, obj)).To(Succeed())
			DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
		}
		authn, err := env.AddUser(envtest.User{Name: "tenant-admin", Groups: []string{"tenant-admins"}}, nil)
		Expect(err).NotTo(HaveOccurred())
		user, err = client.New(authn.Config(), client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())

		// The API server applies a new policy asynchronously: wait until it refuses the
		// attack and admits the system layer in the system namespace (the parameter is found).
		Eventually(func(g Gomega) {
			g.Expect(apierrors.IsForbidden(write(ctx, plainNS, sys, all))).To(BeTrue())
			g.Expect(write(ctx, sysNS, sys, all)).To(Succeed())
		}).Should(Succeed())
	})

	DescribeTable("admits exactly the layers a namespace owns",
		func(ctx SpecContext, ns func() string, tenant, project string, wantFragments ...func() string) {
			err := write(ctx, ns(), tenant, project)
			if len(wantFragments) == 0 {
				Expect(err).NotTo(HaveOccurred())
				return
			}
			Expect(apierrors.IsForbidden(err)).To(BeTrue(), "error %v", err)
			for _, f := range wantFragments {
				Expect(err.Error()).To(ContainSubstring(f()))
			}
		},
		Entry("the system layer in the system namespace", func() string { return sysNS }, sys, all),
		Entry("acme's tenant layer in acme's namespace", func() string { return acmeNS }, "acme", all),
		Entry("acme's project layer in acme's namespace", func() string { return acmeNS }, "acme", "thesis"),
		Entry("the system layer in an unrelated namespace (the team-a attack)", func() string { return plainNS }, sys, all,
			func() string { return `belongs in the system namespace "` + sysNS + `"` }, func() string { return `not in "` + plainNS + `"` }),
		Entry("the system layer in a tenant's namespace", func() string { return acmeNS }, sys, all,
			func() string { return `belongs in the system namespace "` + sysNS + `"` }),
		Entry("acme's tenant layer in globex's namespace", func() string { return globexNS }, "acme", all,
			func() string { return "belongs in a namespace labelled lease.vancetope.io/tenant=acme" },
			func() string { return `namespace "` + globexNS + `" is labelled lease.vancetope.io/tenant=globex` }),
		Entry("acme's project layer in an unlabelled namespace", func() string { return plainNS }, "acme", "thesis",
			func() string { return "belongs in a namespace labelled lease.vancetope.io/tenant=acme" },
			func() string { return `namespace "` + plainNS + `" is not labelled lease.vancetope.io/tenant` }),
		Entry("acme's tenant layer in the system namespace", func() string { return sysNS }, "acme", all,
			func() string { return "lease.vancetope.io/tenant=acme" }),
	)
})
