package leaseclient

import "time"

// The JSON bodies of the admission API (api/openapi/lease-api.yaml). The client keeps its
// own copies so that it imports nothing of the operator; the OpenAPI conformance test of
// internal/httpapi keeps server and document, and this package's tests keep client and
// server, in agreement.

type acquireBody struct {
	Type      string            `json:"type"`
	Lease     string            `json:"lease,omitempty"`
	Leases    []string          `json:"leases,omitempty"`
	Inline    *Inline           `json:"inline,omitempty"`
	Tenant    string            `json:"tenant,omitempty"`
	Project   string            `json:"project"`
	User      string            `json:"user,omitempty"`
	HolderRef string            `json:"holderRef,omitempty"`
	PodBound  bool              `json:"podBound,omitempty"`
	Payload   map[string]string `json:"payload,omitempty"`
	WaitMs    *int64            `json:"waitMs,omitempty"`
	Priority  int               `json:"priority,omitempty"`
}

type levelBody struct {
	Level string `json:"level"`
	Scope string `json:"scope"`
	Cap   int    `json:"cap"`
}

// leaseBody is the 200 answer of an acquire; a NOOP answer has only noop=true. A dry run's
// answer has dryRun=true and no token and fence. The answer for several leases has leases in
// place of lease, resource, levels and fence.
type leaseBody struct {
	DryRun     bool        `json:"dryRun"`
	Token      string      `json:"token"`
	NoOp       bool        `json:"noop"`
	Lease      string      `json:"lease"`
	Resource   string      `json:"resource"`
	Levels     []levelBody `json:"levels"`
	TTLSeconds int64       `json:"ttlSeconds"`
	Fence      int64       `json:"fence"`
	Leases     []partBody  `json:"leases"`
}

// partBody is one lease of the answer for several; no fence in a dry run's.
type partBody struct {
	Lease    string      `json:"lease"`
	Resource string      `json:"resource"`
	Levels   []levelBody `json:"levels"`
	Fence    int64       `json:"fence"`
}

type payloadBody struct {
	Payload map[string]string `json:"payload"`
}

type outcomeBody struct {
	Outcome string `json:"outcome"`
}

type errorBody struct {
	Error    string `json:"error"`
	Message  string `json:"message"`
	Field    string `json:"field"`
	Lease    string `json:"lease"`
	Resource string `json:"resource"`
	Level    string `json:"level"`
	Scope    string `json:"scope"`
	Count    int    `json:"count"`
	Cap      int    `json:"cap"`
	WaitedMs int64  `json:"waitedMs"`
	// Position and EstimatedWaitMs come with LEASE_BUSY when the server knew them.
	Position        *int  `json:"position"`
	EstimatedWaitMs int64 `json:"estimatedWaitMs"`

	CallerNamespace string `json:"callerNamespace"`
	CallerTenant    string `json:"callerTenant"`
}

// Event is a revocation notice from GET /v1/leases/{token}/events: the lease was reaped
// (reason idle or pod) or revoked by an operator (reason revoke). Stop using the resource.
type Event struct {
	Token string `json:"token"`
	// Reason is idle, pod or revoke.
	Reason   string    `json:"reason"`
	Type     string    `json:"type"`
	Resource string    `json:"resource"`
	At       time.Time `json:"at"`
}
