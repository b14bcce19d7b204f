package inject

import (
	"fmt"
	"slices"

	"github.com/vancetope/lease-operator/internal/settings"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
)

// agentUID is the non-root user the agent runs as (distroless "nonroot"). It is set
// explicitly so runAsNonRoot holds whatever USER the image declares.
const agentUID int64 = 65532

// Inject adds the lease agent to pod if the pod asks for it (AnnotationInject "true") and
// reports whether it changed the pod. A pod without the annotation, or with "false", is
// returned untouched. Each part of the injection is applied only where missing, so Inject is
// idempotent and a pod that already carries the agent never gets a second one:
//
//   - the agent as the first init container, a native sidecar (restartPolicy Always), so it
//     starts before, and stops after, every other container of the pod, init containers
//     included;
//   - the label LabelAgent "true", which the agents' PodMonitor selects on
//     (config/prometheus), only when the pod runs the agent the webhook builds;
//   - LEASE_AGENT_URL in every other container that does not set it itself. This is also
//     what a reinvocation after another webhook added containers fills in.
//
// A pod that carries LabelAgent but does not run that agent (no annotation, or a container
// named AgentContainerName of its author's own making) loses the label: a tenant must not be
// able to have its pod scraped as a lease agent (docs/observability.md, "Who is scraped").
//
// An invalid annotation, or a pod the agent cannot run in (host network, not Linux, a
// container that declares one of the agent's ports), yields an Invalid API error and leaves
// the pod unchanged.
func Inject(pod *corev1.Pod, cfg Config) (changed bool, err error) {
	want, errs := wantsAgent(pod)
	if len(errs) > 0 {
		return false, invalid(pod, errs)
	}
	if !want {
		return dropAgentLabel(pod), nil
	}
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return false, fmt.Errorf("lease agent configuration: %w", err)
	}

	if !hasContainer(pod, AgentContainerName) {
		secret, errs := storeSecret(pod, cfg)
		errs = append(errs, podFitsAgent(pod)...)
		if len(errs) > 0 {
			return false, invalid(pod, errs)
		}
		pod.Spec.InitContainers = append([]corev1.Container{agentContainer(cfg, pod.Namespace, secret)}, pod.Spec.InitContainers...)
		changed = true
	}

	switch {
	case !runsInjectedAgent(pod, cfg):
		if dropAgentLabel(pod) {
			changed = true
		}
	case pod.Labels[LabelAgent] != "true":
		if pod.Labels == nil {
			pod.Labels = map[string]string{}
		}
		pod.Labels[LabelAgent] = "true"
		changed = true
	}

	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for i := range list {
			if list[i].Name != AgentContainerName && ensureAgentURL(&list[i]) {
				changed = true
			}
		}
	}
	return changed, nil
}

// wantsAgent reads AnnotationInject.
func wantsAgent(pod *corev1.Pod) (bool, field.ErrorList) {
	value, ok := pod.Annotations[AnnotationInject]
	switch {
	case !ok || value == "false":
		return false, nil
	case value == "true":
		return true, nil
	default:
		path := field.NewPath("metadata", "annotations").Key(AnnotationInject)
		return false, field.ErrorList{field.NotSupported(path, value, []string{"true", "false"})}
	}
}

// storeSecret is the Secret the agent reads MONGODB_URI from: the pod's override or the
// configured default.
func storeSecret(pod *corev1.Pod, cfg Config) (string, field.ErrorList) {
	name, ok := pod.Annotations[AnnotationStoreSecret]
	if !ok {
		return cfg.StoreSecret, nil
	}
	path := field.NewPath("metadata", "annotations").Key(AnnotationStoreSecret)
	var errs field.ErrorList
	for _, msg := range validation.IsDNS1123Subdomain(name) {
		errs = append(errs, field.Invalid(path, name, msg))
	}
	return name, errs
}

// podFitsAgent rejects pods the agent cannot run in.
func podFitsAgent(pod *corev1.Pod) field.ErrorList {
	var errs field.ErrorList
	if pod.Spec.HostNetwork {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "hostNetwork"),
			"the lease agent cannot run on the host network: its ports would be the node's ports"))
	}
	if pod.Spec.OS != nil && pod.Spec.OS.Name != corev1.Linux {
		errs = append(errs, field.Forbidden(field.NewPath("spec", "os", "name"),
			"the lease agent runs on Linux only"))
	}
	for _, c := range []struct {
		path string
		list []corev1.Container
	}{{"initContainers", pod.Spec.InitContainers}, {"containers", pod.Spec.Containers}} {
		for i, ctr := range c.list {
			for j, port := range ctr.Ports {
				if port.ContainerPort == AgentAPIPort || port.ContainerPort == AgentInternalPort {
					path := field.NewPath("spec", c.path).Index(i).Child("ports").Index(j).Child("containerPort")
					errs = append(errs, field.Invalid(path, port.ContainerPort,
						fmt.Sprintf("ports %d and %d are reserved for the lease agent", AgentAPIPort, AgentInternalPort)))
				}
			}
		}
	}
	return errs
}

func hasContainer(pod *corev1.Pod, name string) bool {
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if c.Name == name {
				return true
			}
		}
	}
	return false
}

// runsInjectedAgent reports whether the pod's AgentContainerName container is the agent
// this webhook injects: a native sidecar running cfg.Image with the agent's command line.
// Only what decides which program runs is compared, so that the pod still counts as injected
// when a later webhook or admission plugin has added environment variables or volume mounts
// to the agent (reinvocation), or when an injected pod's manifest is created again. A copy
// made by hand of these fields runs the genuine agent, which is what the label promises.
func runsInjectedAgent(pod *corev1.Pod, cfg Config) bool {
	for _, c := range pod.Spec.InitContainers {
		if c.Name == AgentContainerName {
			return c.Image == cfg.Image && runsAgent(c.Command, c.Args) &&
				c.RestartPolicy != nil && *c.RestartPolicy == corev1.ContainerRestartPolicyAlways
		}
	}
	return false
}

// runsAgent reports whether command and args start the agent: as this webhook injects it,
// or as an earlier version did (the image's entrypoint, /manager, with the first argument
// "agent", which starts /agent with the rest).
func runsAgent(command, args []string) bool {
	if slices.Equal(command, AgentCommand()) {
		return slices.Equal(args, AgentArgs())
	}
	return len(command) == 0 && len(args) > 0 && args[0] == "agent" && slices.Equal(args[1:], AgentArgs())
}

// dropAgentLabel removes LabelAgent and reports whether the pod had it.
func dropAgentLabel(pod *corev1.Pod) bool {
	if _, ok := pod.Labels[LabelAgent]; !ok {
		return false
	}
	delete(pod.Labels, LabelAgent)
	return true
}

// ensureAgentURL adds LEASE_AGENT_URL unless the container sets it itself.
func ensureAgentURL(c *corev1.Container) bool {
	for _, e := range c.Env {
		if e.Name == AgentURLEnv {
			return false
		}
	}
	c.Env = append(c.Env, corev1.EnvVar{Name: AgentURLEnv, Value: settings.AgentURL})
	return true
}

func invalid(pod *corev1.Pod, errs field.ErrorList) error {
	name := pod.Name
	if name == "" {
		name = pod.GenerateName
	}
	return apierrors.NewInvalid(corev1.SchemeGroupVersion.WithKind("Pod").GroupKind(), name, errs)
}

// agentContainer builds the lease agent.
//
// Two listeners rather than one port guarded by a shared secret: the admission API acts with
// the pod's identity, so it is bound to 127.0.0.1 where only the pod's own containers reach it;
// the internal port carries only what other pods and the kubelet must reach (forwarded
// revocations, probes). A shared secret would have to be distributed to and rotated in every
// workload namespace, and would still leave the kubelet's probes (which dial the pod IP)
// needing a non-loopback listener. A forged revocation on the internal port can at most make
// the agent re-check its token against the store; a NetworkPolicy can further restrict the
// port to pods labelled LabelAgent and the manager.
func agentContainer(cfg Config, namespace, storeSecret string) corev1.Container {
	fieldEnv := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path},
		}}
	}
	env := []corev1.EnvVar{
		fieldEnv(settings.EnvPodName, "metadata.name"),
		fieldEnv(settings.EnvPodNamespace, "metadata.namespace"),
		fieldEnv(settings.EnvPodUID, "metadata.uid"),
		fieldEnv(settings.EnvPodIP, "status.podIP"),
		{Name: settings.EnvMongoURI, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: storeSecret},
			Key:                  StoreSecretKey,
		}}},
	}
	if cfg.StoreDatabase != "" {
		env = append(env, corev1.EnvVar{Name: settings.EnvMongoDatabase, Value: cfg.StoreDatabase})
	}
	// The agent's tenant and definitions come from the manager (internal/deflink), not from
	// the Kubernetes API: the pod's service account needs no role for the agent.
	env = append(env, corev1.EnvVar{Name: settings.EnvManagerURL, Value: cfg.ManagerURL})
	// The API server has set the namespace of a created pod before admission.
	if cfg.AgentKey != nil && namespace != "" {
		if key := cfg.AgentKey(namespace); key != "" {
			env = append(env, corev1.EnvVar{Name: settings.EnvAgentKey, Value: key})
		}
	}

	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString(AgentInternalPortName),
			}},
			PeriodSeconds:    period,
			TimeoutSeconds:   1,
			FailureThreshold: failures,
		}
	}
	return corev1.Container{
		Name:            AgentContainerName,
		Image:           cfg.Image,
		ImagePullPolicy: cfg.ImagePullPolicy,
		Command:         AgentCommand(),
		Args:            AgentArgs(),
		Env:             env,
		Ports: []corev1.ContainerPort{
			{Name: AgentAPIPortName, ContainerPort: AgentAPIPort, Protocol: corev1.ProtocolTCP},
			{Name: AgentInternalPortName, ContainerPort: AgentInternalPort, Protocol: corev1.ProtocolTCP},
		},
		// A native sidecar's startup probe holds back the containers after it, so the app's
		// first acquire finds the agent listening; probing every second keeps that wait short.
		StartupProbe:             probe("/readyz", 1, 30),
		ReadinessProbe:           probe("/readyz", 10, 3),
		LivenessProbe:            probe("/healthz", 10, 3),
		Resources:                *cfg.Resources.DeepCopy(),
		RestartPolicy:            ptr.To(corev1.ContainerRestartPolicyAlways),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To(agentUID),
			RunAsGroup:               ptr.To(agentUID),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}
