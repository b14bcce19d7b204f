// Package settings is the one home of the names and defaults that several processes share:
// the environment variables the manager, the agent and the kubectl plugin read, the ports of
// the injected agent, and the store defaults. A setting is spelled here once and imported
// everywhere else. docs/configuration.md lists them for users.
package settings

// Store connection.
const (
	// EnvMongoURI is the MongoDB connection string.
	EnvMongoURI = "MONGODB_URI"
	// EnvMongoDatabase is the database of the counters and holders.
	EnvMongoDatabase = "MONGODB_DATABASE"
	// DefaultMongoURI is the development store that `make mongo` and `make run` start.
	DefaultMongoURI = "mongodb://127.0.0.1:27017"
	// DefaultMongoDatabase is the database when none is configured.
	DefaultMongoDatabase = "lease"
)

// Secrets and peers.
const (
	// EnvInternalSecret is the shared secret of the internal revocation endpoints.
	EnvInternalSecret = "LEASE_INTERNAL_SECRET"
	// EnvAdminSecret is the bearer secret of the shared-secret operator API.
	EnvAdminSecret = "LEASE_ADMIN_SECRET"
	// DefaultAdminAddress is where the manager serves the operator API when it has a secret:
	// loopback, on a port of its own, so that the bearer secret never crosses the pod network
	// and the admission Service never routes to it (reach it with kubectl port-forward).
	DefaultAdminAddress = "127.0.0.1:8083"
	// EnvManagerURL tells an agent where the manager's API is: its lazy idle sweep runs
	// there, so that reaped holders go through the manager's dispatch matrix.
	EnvManagerURL = "LEASE_MANAGER_URL"
	// EnvSystemNamespace is the namespace whose LeaseDefinitions may hold the system layer.
	EnvSystemNamespace = "LEASE_SYSTEM_NAMESPACE"
	// EnvBuiltinConfigMap names the ConfigMap (in the system namespace) of the built-in layer.
	EnvBuiltinConfigMap = "LEASE_BUILTIN_CONFIGMAP"
	// EnvAgentURL is set in the app containers of an injected pod: where their agent listens.
	EnvAgentURL = "LEASE_AGENT_URL"
	// EnvAgentKey carries the namespace's agent key, with which reapers sign the revocations
	// they forward to the agent.
	EnvAgentKey = "LEASE_AGENT_KEY"
)

// The pod's identity, from the downward API.
const (
	EnvPodName      = "POD_NAME"
	EnvPodNamespace = "POD_NAMESPACE"
	EnvPodUID       = "POD_UID"
	EnvPodIP        = "POD_IP"
)

// Ports of the injected agent.
const (
	// AgentAPIPort serves the admission API to the pod's own containers, on 127.0.0.1 only:
	// every call on it acts with the pod's identity, so nothing outside the pod may reach it.
	AgentAPIPort = 8090
	// AgentInternalPort serves, on all interfaces, only what must be reachable from outside
	// the pod: revocations forwarded by reapers and the kubelet's probes.
	AgentInternalPort = 8091
	// AgentURL is the value of EnvAgentURL: the API port on loopback.
	AgentURL = "http://127.0.0.1:8090"
)
