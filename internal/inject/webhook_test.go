package inject_test

import (
	"context"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/settings"
)

// newPod is a pod with one app container and the given annotations.
func newPod(namespace string, annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{GenerateName: "app-", Namespace: namespace, Annotations: annotations},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
}

// stored reads pod back from the API server.
func stored(ctx context.Context, pod *corev1.Pod) *corev1.Pod {
	GinkgoHelper()
	got := &corev1.Pod{}
	Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), got)).To(Succeed())
	return got
}

// agents are the pod's containers named lease-agent, init or not.
func agents(pod *corev1.Pod) []corev1.Container {
	var out []corev1.Container
	for _, c := range append(append([]corev1.Container{}, pod.Spec.InitContainers...), pod.Spec.Containers...) {
		if c.Name == inject.AgentContainerName {
			out = append(out, c)
		}
	}
	return out
}

// envByName indexes a container's env, failing on a duplicate name.
func envByName(c corev1.Container) map[string]corev1.EnvVar {
	GinkgoHelper()
	env := map[string]corev1.EnvVar{}
	for _, e := range c.Env {
		Expect(env).NotTo(HaveKey(e.Name), "container %s sets %s twice", c.Name, e.Name)
		env[e.Name] = e
	}
	return env
}

var injectTrue = map[string]string{inject.AnnotationInject: "true"}

var _ = Describe("Lease agent injection", func() {
	var ns string
	BeforeEach(func(ctx SpecContext) {
		ns = freshNamespace(ctx)
	})

	It("gives an annotated pod exactly one native sidecar agent wired to the downward API and the store", func(ctx SpecContext) {
		pod := newPod(ns, injectTrue)
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())

		got := stored(ctx, pod)
		Expect(agents(got)).To(HaveLen(1))
		Expect(got.Spec.InitContainers).To(HaveLen(1))
		agent := got.Spec.InitContainers[0]
		Expect(agent.Name).To(Equal("lease-agent"))
		Expect(agent.Image).To(Equal(agentImage))
		Expect(agent.RestartPolicy).To(HaveValue(Equal(corev1.ContainerRestartPolicyAlways)))
		Expect(agent.Command).To(HaveExactElements("/agent"))
		Expect(agent.Args).To(HaveExactElements("--api-bind-address=127.0.0.1:8090", "--internal-bind-address=:8091"))

		env := envByName(agent)
		for name, path := range map[string]string{
			"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace",
			"POD_UID": "metadata.uid", "POD_IP": "status.podIP",
		} {
			Expect(env).To(HaveKey(name))
			Expect(env[name].ValueFrom.FieldRef.FieldPath).To(Equal(path), name)
		}
		Expect(env).To(HaveKey("MONGODB_URI"))
		Expect(env["MONGODB_URI"].ValueFrom.SecretKeyRef.Name).To(Equal("lease-store"))
		Expect(env["MONGODB_URI"].ValueFrom.SecretKeyRef.Key).To(Equal("uri"))

		Expect(agent.Ports).To(ContainElements(
			SatisfyAll(HaveField("Name", "lease-agent"), HaveField("ContainerPort", int32(8090))),
			SatisfyAll(HaveField("Name", "lease-internal"), HaveField("ContainerPort", int32(8091))),
		))
		Expect(agent.StartupProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(agent.ReadinessProbe.HTTPGet.Path).To(Equal("/readyz"))
		Expect(agent.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()))
		Expect(agent.SecurityContext.ReadOnlyRootFilesystem).To(HaveValue(BeTrue()))
		Expect(agent.SecurityContext.Capabilities.Drop).To(ConsistOf(corev1.Capability("ALL")))

		Expect(got.Labels).To(HaveKeyWithValue(inject.LabelAgent, "true"))
		Expect(envByName(got.Spec.Containers[0])).To(HaveKeyWithValue("LEASE_AGENT_URL",
			corev1.EnvVar{Name: "LEASE_AGENT_URL", Value: "http://127.0.0.1:8090"}))
	})

	It("gives the agent its namespace's key for forwarded revocations, not the manager's secret", func(ctx SpecContext) {
		pod := newPod(ns, injectTrue)
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())

		Expect(envByName(agents(stored(ctx, pod))[0])).To(HaveKeyWithValue(settings.EnvAgentKey,
			corev1.EnvVar{Name: settings.EnvAgentKey, Value: "key-of-" + ns}))
	})

	It("reads the store from the Secret the pod names", func(ctx SpecContext) {
		pod := newPod(ns, map[string]string{inject.AnnotationInject: "true", inject.AnnotationStoreSecret: "tex-store"})
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())

		ref := envByName(agents(stored(ctx, pod))[0])["MONGODB_URI"].ValueFrom.SecretKeyRef
		Expect(ref.Name).To(Equal("tex-store"))
		Expect(ref.Key).To(Equal("uri"))
	})

	It("injects an agent that passes the restricted Pod Security Standard", func(ctx SpecContext) {
		nsObj := &corev1.Namespace{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: ns}, nsObj)).To(Succeed())
		nsObj.Labels["pod-security.kubernetes.io/enforce"] = "restricted"
		Expect(k8sClient.Update(ctx, nsObj)).To(Succeed())

		pod := newPod(ns, injectTrue)
		pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			AllowPrivilegeEscalation: ptr.To(false),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		}
		// Pod Security admission validates the pod after the webhook has mutated it.
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		Expect(agents(stored(ctx, pod))).To(HaveLen(1))
	})

	DescribeTable("leaves pods that do not ask for the agent untouched",
		func(ctx SpecContext, annotations map[string]string) {
			pod := newPod(ns, annotations)
			Expect(k8sClient.Create(ctx, pod)).To(Succeed())

			got := stored(ctx, pod)
			Expect(got.Spec.InitContainers).To(BeEmpty())
			Expect(got.Labels).NotTo(HaveKey(inject.LabelAgent))
			Expect(got.Spec.Containers).To(HaveLen(1))
			Expect(got.Spec.Containers[0].Env).To(BeEmpty())
		},
		Entry("no annotation", nil),
		Entry(`annotation "false"`, map[string]string{inject.AnnotationInject: "false"}),
	)

	DescribeTable("takes the agent label off pods it did not inject, so that the PodMonitor does not scrape them",
		func(ctx SpecContext, annotations map[string]string, initContainers []corev1.Container) {
			pod := newPod(ns, annotations)
			pod.Labels = map[string]string{inject.LabelAgent: "true", "app": "x"}
			pod.Spec.InitContainers = initContainers
			Expect(k8sClient.Create(ctx, pod)).To(Succeed())

			got := stored(ctx, pod)
			Expect(got.Labels).NotTo(HaveKey(inject.LabelAgent))
			Expect(got.Labels).To(HaveKeyWithValue("app", "x"))
		},
		Entry("labelled, no annotation", nil, nil),
		Entry(`labelled, annotation "false"`, map[string]string{inject.AnnotationInject: "false"}, nil),
		Entry("labelled, with a lease-agent sidecar of its own", injectTrue, []corev1.Container{{
			Name: inject.AgentContainerName, Image: "mine:1", RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways),
		}}),
	)

	It("does not inject a second agent when the pod is updated or created again from its own manifest", func(ctx SpecContext) {
		pod := newPod(ns, injectTrue)
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		first := stored(ctx, pod)
		Expect(agents(first)).To(HaveLen(1))

		By("updating the pod")
		first.Labels["touched"] = "yes"
		Expect(k8sClient.Update(ctx, first)).To(Succeed())
		updated := stored(ctx, pod)
		Expect(updated.Labels).To(HaveKeyWithValue("touched", "yes"))
		Expect(agents(updated)).To(HaveLen(1))
		Expect(updated.Spec.InitContainers).To(HaveLen(1))

		By("creating a new pod from the injected manifest, as `kubectl get -o yaml | kubectl create` would")
		again := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{
				GenerateName: "again-", Namespace: ns,
				Annotations: updated.Annotations, Labels: updated.Labels,
			},
			Spec: *updated.Spec.DeepCopy(),
		}
		Expect(k8sClient.Create(ctx, again)).To(Succeed())
		got := stored(ctx, again)
		Expect(agents(got)).To(HaveLen(1))
		Expect(got.Spec.InitContainers).To(HaveLen(1))
		Expect(got.Spec.Containers).To(HaveLen(1))
		envByName(got.Spec.Containers[0]) // fails on a duplicated LEASE_AGENT_URL
		Expect(got.Spec).To(Equal(updated.Spec))
	})

	It("rejects an invalid inject annotation with a clear message and writes nothing", func(ctx SpecContext) {
		pod := newPod(ns, map[string]string{inject.AnnotationInject: "yes"})
		pod.GenerateName, pod.Name = "", "typo"
		err := k8sClient.Create(ctx, pod)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "want an Invalid error, got %v", err)
		Expect(err).To(MatchError(ContainSubstring(`metadata.annotations[lease.vancetope.io/inject]: Unsupported value: "yes"`)))

		err = k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "want NotFound, got %v", err)
	})

	It("injects on dry-run requests without storing the pod", func(ctx SpecContext) {
		pod := newPod(ns, injectTrue)
		pod.GenerateName, pod.Name = "", "dry"
		Expect(k8sClient.Create(ctx, pod, client.DryRunAll)).To(Succeed())
		Expect(agents(pod)).To(HaveLen(1))

		err := k8sClient.Get(ctx, client.ObjectKeyFromObject(pod), &corev1.Pod{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "want NotFound, got %v", err)
	})

	It("is not called for pods in kube-system", func(ctx SpecContext) {
		pod := newPod(metav1.NamespaceSystem, injectTrue)
		Expect(k8sClient.Create(ctx, pod)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pod))).To(Succeed())
		})

		got := stored(ctx, pod)
		Expect(agents(got)).To(BeEmpty())
		Expect(got.Labels).NotTo(HaveKey(inject.LabelAgent))
	})

	It("when the webhook is down, holds back only the pods that asked for the agent", func(ctx SpecContext) {
		By("installing a copy of the generated webhook that points nowhere, limited to this namespace")
		installed := &admissionregistrationv1.MutatingWebhookConfiguration{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: env.WebhookInstallOptions.MutatingWebhooks[0].Name}, installed)).To(Succeed())
		down := &admissionregistrationv1.MutatingWebhookConfiguration{
			ObjectMeta: metav1.ObjectMeta{GenerateName: "down-"},
			Webhooks:   installed.DeepCopy().Webhooks,
		}
		for i := range down.Webhooks {
			h := &down.Webhooks[i]
			h.ClientConfig.Service = nil
			h.ClientConfig.URL = ptr.To("https://127.0.0.1:1" + inject.MutatePodPath)
			h.NamespaceSelector.MatchExpressions = append(h.NamespaceSelector.MatchExpressions, metav1.LabelSelectorRequirement{
				Key: "kubernetes.io/metadata.name", Operator: metav1.LabelSelectorOpIn, Values: []string{ns},
			})
		}
		Expect(k8sClient.Create(ctx, down)).To(Succeed())
		DeferCleanup(func(ctx SpecContext) {
			Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, down))).To(Succeed())
		})

		By("rejecting an annotated pod (failurePolicy Fail)")
		Eventually(func(g Gomega) {
			err := k8sClient.Create(ctx, newPod(ns, injectTrue), client.DryRunAll)
			g.Expect(err).To(MatchError(ContainSubstring("failed calling webhook")))
		}).Should(Succeed())

		By("admitting pods that did not ask for the agent (matchConditions)")
		Expect(k8sClient.Create(ctx, newPod(ns, nil))).To(Succeed())
		Expect(k8sClient.Create(ctx, newPod(ns, map[string]string{inject.AnnotationInject: "false"}))).To(Succeed())
	})
})
