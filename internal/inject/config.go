// Package inject injects the lease agent into workload pods: a mutating admission webhook
// served by the manager adds the agent as a native sidecar to every pod annotated
// lease.vancetope.io/inject: "true".
//
// The mutation is the pure function Inject; the webhook is a thin adapter around it, so the
// rules of injection can be read (and tested) without an API server.
package inject

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/vancetope/lease-operator/internal/settings"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Annotations and labels on workload pods.
const (
	// AnnotationInject asks for the lease agent: "true" injects it, "false" (or no annotation)
	// leaves the pod alone, any other value is rejected.
	AnnotationInject = "lease.vancetope.io/inject"
	// AnnotationStoreSecret overrides, for one pod, the name of the Secret (in the pod's
	// namespace) that holds the store's connection string.
	AnnotationStoreSecret = "lease.vancetope.io/store-secret"
	// LabelAgent marks a pod that runs the agent the webhook injected; the agents'
	// PodMonitor selects on it. The webhook sets it only on such pods and removes it from
	// every other pod it sees (Inject).
	LabelAgent = "lease.vancetope.io/agent"
)

// The agent's side of the contract: what the injected container runs and how it is reached.
// The agent binary must honour these (see AgentCommand and AgentArgs).
const (
	// AgentContainerName is the name of the injected init container. A pod that already has
	// a container of this name is never injected again.
	AgentContainerName = "lease-agent"
	// AgentBinary is the agent's program in the image (cmd/agent), beside /manager.
	AgentBinary = "/agent"

	// AgentAPIPort: see settings.AgentAPIPort.
	AgentAPIPort = settings.AgentAPIPort
	// AgentAPIPortName names AgentAPIPort in the pod spec.
	AgentAPIPortName = "lease-agent"
	// AgentInternalPort: see settings.AgentInternalPort.
	AgentInternalPort = settings.AgentInternalPort
	// AgentInternalPortName names AgentInternalPort in the pod spec.
	AgentInternalPortName = "lease-internal"

	// AgentURLEnv is set in every other container of the pod so the app finds its agent.
	AgentURLEnv = settings.EnvAgentURL

	// DefaultStoreSecret is the Secret read for MONGODB_URI unless configured otherwise.
	DefaultStoreSecret = "lease-store"
	// StoreSecretKey is the key in the store Secret that holds the MongoDB connection string.
	StoreSecretKey = "uri"
)

// AgentCommand is the command of the agent container: the agent binary of the image.
func AgentCommand() []string { return []string{AgentBinary} }

// AgentArgs are the arguments of the agent container, its two listeners. The agent binary
// must accept them: `agent --api-bind-address=127.0.0.1:8090 --internal-bind-address=:8091`.
func AgentArgs() []string {
	return []string{
		"--api-bind-address=127.0.0.1:" + strconv.Itoa(AgentAPIPort),
		"--internal-bind-address=:" + strconv.Itoa(AgentInternalPort),
	}
}

// Config is what the webhook needs to build the agent container.
type Config struct {
	// Image is the agent's image: the manager's own image, which has /agent beside /manager
	// (--agent-image). Required.
	Image string
	// ImagePullPolicy of the agent container; empty leaves the API server's default.
	ImagePullPolicy corev1.PullPolicy
	// StoreSecret names the Secret, in the pod's namespace, whose key "uri" becomes
	// MONGODB_URI. Default DefaultStoreSecret; a pod may override it with
	// AnnotationStoreSecret.
	StoreSecret string
	// StoreDatabase, when set, becomes MONGODB_DATABASE.
	StoreDatabase string
	// ManagerURL becomes LEASE_MANAGER_URL: the manager's admission Service, which the agent
	// asks for its tenant, its lease definitions and its lazy idle sweeps. Required: the
	// agent reads nothing from the Kubernetes API, so its pod's service account needs no role.
	ManagerURL string
	// Resources of the agent container; zero means DefaultAgentResources.
	Resources corev1.ResourceRequirements
	// AgentKey, when set, gives the key the agents of a namespace verify forwarded
	// revocations with (agentlink.AgentKey); it becomes LEASE_AGENT_KEY. The manager's
	// internal secret itself never leaves the manager.
	AgentKey func(namespace string) string
}

// DefaultAgentResources fit the agent's measured footprint (docs/figures.md, "Agent
// footprint": some 15 MiB resident idle and 18 MiB after 10 000 grants, of which the binary's
// pages, shared by the node's agents, are 11 MiB; 1.6–1.8 ms of CPU per acquire+release). No
// CPU limit (throttling shows up as acquire latency); a memory limit, with room for bursts of
// callers beyond twice what it was seen to use, so a leaking agent cannot take the node's
// memory.
func DefaultAgentResources() corev1.ResourceRequirements {
	return corev1.ResourceRequirements{
		Requests: corev1.ResourceList{
			corev1.ResourceCPU:    resource.MustParse("10m"),
			corev1.ResourceMemory: resource.MustParse("32Mi"),
		},
		Limits: corev1.ResourceList{
			corev1.ResourceMemory: resource.MustParse("64Mi"),
		},
	}
}

// withDefaults fills the optional fields.
func (c Config) withDefaults() Config {
	if c.StoreSecret == "" {
		c.StoreSecret = DefaultStoreSecret
	}
	if len(c.Resources.Requests) == 0 && len(c.Resources.Limits) == 0 && len(c.Resources.Claims) == 0 {
		c.Resources = DefaultAgentResources()
	}
	return c
}

// Validate reports a configuration the webhook cannot inject with.
func (c Config) Validate() error {
	c = c.withDefaults()
	var errs []error
	if c.Image == "" {
		errs = append(errs, errors.New("agent image is required"))
	}
	if c.ManagerURL == "" {
		errs = append(errs, errors.New("the manager URL is required: agents ask the manager for their definitions"))
	}
	for _, msg := range validation.IsDNS1123Subdomain(c.StoreSecret) {
		errs = append(errs, fmt.Errorf("store secret %q: %s", c.StoreSecret, msg))
	}
	switch c.ImagePullPolicy {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		errs = append(errs, fmt.Errorf("image pull policy %q: want Always, IfNotPresent or Never", c.ImagePullPolicy))
	}
	return errors.Join(errs...)
}
