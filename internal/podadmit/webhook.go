package podadmit

import (
	"context"
	"errors"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/validation/field"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// GatePodPath is where the manager's webhook server serves the gating.
const GatePodPath = "/gate--v1-pod"

// The webhook configuration, generated into config/webhook by controller-gen:
//
//   - CREATE only: scheduling gates can be set only at creation (and only removed later).
//   - matchConditions: only pods with the admit-lease annotation are sent; every other pod
//     of the cluster is admitted without a call.
//   - failurePolicy Fail: a pod that asked to wait for its lease must not start without it.
//     Because of the match condition this holds back only such pods.
//   - reinvocationPolicy Never: the gate, once added, stays; a later webhook cannot remove it
//     (the API server allows removing gates only by an update).
//
// +kubebuilder:webhook:path=/gate--v1-pod,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=admit.lease.vancetope.io,admissionReviewVersions=v1,matchPolicy=Equivalent,reinvocationPolicy=Never,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"lease-admission-requested","expression":"has(object.metadata.annotations) && 'lease.vancetope.io/admit-lease' in object.metadata.annotations"}],"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kube-system","kube-node-lease"]}]}}`

// Gater adds the scheduling gate to a pod that asks for admission by lease, after checking
// that its namespace speaks for a tenant and that its annotations are valid: a pod that
// could never be admitted is refused at creation, with the reason.
type Gater struct {
	// Namespaces reads the pod's namespace (its tenant label).
	Namespaces client.Reader
}

var _ admission.Defaulter[*corev1.Pod] = (*Gater)(nil)

// Default gates pod, or refuses it with a message that names what to fix.
func (g *Gater) Default(ctx context.Context, pod *corev1.Pod) error {
	if !Wants(pod) {
		return nil
	}
	ns := pod.Namespace
	if req, err := admission.RequestFromContext(ctx); err == nil && req.Namespace != "" {
		ns = req.Namespace // a pod created without metadata.namespace
	}
	tenant, err := tenantOf(ctx, g.Namespaces, ns)
	if err != nil {
		return err
	}
	p := pod.DeepCopy()
	p.Namespace = ns
	if _, err := RequestOf(p, tenant); err != nil {
		return refusal(pod, err)
	}
	pod.Spec.SchedulingGates = withGate(pod.Spec.SchedulingGates)
	ctrl.LoggerFrom(ctx).V(1).Info("Gated a pod until its lease is granted", "lease", pod.Annotations[AnnotationLease], "tenant", tenant)
	return nil
}

// tenantOf is the tenant namespace ns speaks for; a namespace without the tenant label is a
// refusal that names the label.
func tenantOf(ctx context.Context, r client.Reader, ns string) (string, error) {
	var n corev1.Namespace
	if err := r.Get(ctx, client.ObjectKey{Name: ns}, &n); err != nil {
		return "", fmt.Errorf("reading namespace %s for its tenant: %w", ns, err)
	}
	t := n.Labels[tenancy.TenantLabel]
	if t == "" {
		return "", apierrors.NewForbidden(corev1.Resource("pods"), "",
			fmt.Errorf("the pod asks for admission by lease (annotation %s), but namespace %q has no label %s and so speaks for no tenant; label the namespace or remove the annotation",
				AnnotationLease, ns, tenancy.TenantLabel))
	}
	return t, nil
}

// refusal turns an annotation's *lease.InvalidError into the API's Invalid answer.
func refusal(pod *corev1.Pod, err error) error {
	var inv *lease.InvalidError
	if !errors.As(err, &inv) {
		return err
	}
	path := field.NewPath("metadata", "annotations").Key(inv.Field)
	return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), pod.Name,
		field.ErrorList{field.Invalid(path, pod.Annotations[inv.Field], inv.Detail)})
}

// SetupWebhookWithManager registers the gating webhook on the manager's webhook server at
// GatePodPath.
func SetupWebhookWithManager(mgr ctrl.Manager) error {
	if err := ctrl.NewWebhookManagedBy(mgr, &corev1.Pod{}).
		WithDefaulter(&Gater{Namespaces: mgr.GetClient()}).
		WithDefaulterCustomPath(GatePodPath).
		Complete(); err != nil {
		return fmt.Errorf("registering the pod admission webhook: %w", err)
	}
	return nil
}
