package inject

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// MutatePodPath is where the manager's webhook server serves the injection.
const MutatePodPath = "/mutate--v1-pod"

// The webhook configuration, generated into config/webhook by controller-gen:
//
//   - CREATE only: a pod's containers cannot change after creation, so there is nothing to
//     inject on UPDATE.
//   - matchConditions: the API server calls the webhook only for pods that carry the inject
//     annotation with a value other than "false", or the label LabelAgent (which the webhook
//     removes from a pod it did not inject, so that a tenant cannot have an arbitrary pod
//     scraped as an agent). Label selectors cannot see annotations, nor select "this label
//     or that annotation"; a CEL condition can, so every other pod of the cluster is
//     admitted without a call.
//   - failurePolicy Fail: a pod that asked for the agent but started without it would fail
//     every acquire while looking healthy, and would stay that way until someone recreated
//     it. Failing its creation instead is visible (events on the ReplicaSet/Job) and heals
//     itself: the workload controller retries once the webhook is back. Because of the match
//     condition this can only hold back pods that asked for injection (or carry the agent's
//     label), never the manager's own pods or the rest of the cluster; kube-system and
//     kube-node-lease are excluded outright.
//   - reinvocationPolicy IfNeeded: when a later webhook adds containers, the API server calls
//     this one again and Inject gives them LEASE_AGENT_URL (the agent itself is not added
//     twice).
//   - sideEffects None: Inject only mutates the object, so dry-run requests are served.
//
// +kubebuilder:webhook:path=/mutate--v1-pod,mutating=true,failurePolicy=fail,sideEffects=None,groups="",resources=pods,verbs=create,versions=v1,name=inject.lease.vancetope.io,admissionReviewVersions=v1,matchPolicy=Equivalent,reinvocationPolicy=IfNeeded,timeoutSeconds=5,patch=`{"matchConditions":[{"name":"lease-inject-requested-or-agent-labelled","expression":"(has(object.metadata.annotations) && 'lease.vancetope.io/inject' in object.metadata.annotations && object.metadata.annotations['lease.vancetope.io/inject'] != 'false') || (has(object.metadata.labels) && 'lease.vancetope.io/agent' in object.metadata.labels)"}],"namespaceSelector":{"matchExpressions":[{"key":"kubernetes.io/metadata.name","operator":"NotIn","values":["kube-system","kube-node-lease"]}]}}`

// podInjector adapts Inject to controller-runtime's defaulting webhook.
type podInjector struct {
	cfg Config
}

var _ admission.Defaulter[*corev1.Pod] = (*podInjector)(nil)

// Default injects the lease agent. An error from Inject denies the pod with its message.
func (p *podInjector) Default(ctx context.Context, pod *corev1.Pod) error {
	changed, err := Inject(pod, p.cfg)
	if err != nil {
		return err
	}
	if changed {
		ctrl.LoggerFrom(ctx).V(1).Info("Injected the lease agent")
	}
	return nil
}

// SetupWebhookWithManager registers the injection webhook on the manager's webhook server
// at MutatePodPath. The manager's scheme must know core/v1.
func SetupWebhookWithManager(mgr ctrl.Manager, cfg Config) error {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("configuring lease agent injection: %w", err)
	}
	if err := ctrl.NewWebhookManagedBy(mgr, &corev1.Pod{}).
		WithDefaulter(&podInjector{cfg: cfg}).
		WithDefaulterCustomPath(MutatePodPath).
		Complete(); err != nil {
		return fmt.Errorf("registering the lease agent injection webhook: %w", err)
	}
	return nil
}
