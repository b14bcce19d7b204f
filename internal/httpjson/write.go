package httpjson

import (
	"encoding/json"
	"net/http"
)

// Error codes shared by the project's APIs. The lease outcomes are spelled as the sentinels of
// internal/lease print themselves.
const (
	CodeInvalid     = "INVALID_REQUEST"
	CodeBusy        = "LEASE_BUSY"
	CodeLost        = "LEASE_LOST"
	CodeUnavailable = "LEASE_UNAVAILABLE"
	// CodeTenantForbidden: the caller may not act for the tenant it named (a pod acts only for
	// the tenant of its namespace); nothing was written.
	CodeTenantForbidden = "TENANT_FORBIDDEN"
	// CodeUnauthorized: a missing or wrong shared secret.
	CodeUnauthorized = "UNAUTHORIZED"
	// CodeNotFound: the named object does not exist.
	CodeNotFound = "NOT_FOUND"
	// CodeUnknownRoute: no route at that path.
	CodeUnknownRoute = "UNKNOWN_ROUTE"
	// CodeMethodNotAllowed: the path exists, the method does not.
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	// CodeInternal: a failure that is not the store's.
	CodeInternal = "INTERNAL"
)

// ErrorBody is every error answer of every API: Error is the code, Message the detail; the
// other fields are set for the codes that carry them. docs/api.md documents it.
type ErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	// Field names the offending request field (INVALID_REQUEST).
	Field string `json:"field,omitempty"`
	// CorrelationID (LEASE_UNAVAILABLE) finds the details in the server's log, which the
	// answer leaves out (docs/security.md).
	CorrelationID string `json:"correlationId,omitempty"`
	// The busy diagnosis (LEASE_BUSY): the first full level, narrow to wide. Lease names the
	// part of an acquisition of several leases that is full; absent for a single lease.
	Lease    string `json:"lease,omitempty"`
	Resource string `json:"resource,omitempty"`
	Level    string `json:"level,omitempty"`
	Scope    string `json:"scope,omitempty"`
	Count    *int   `json:"count,omitempty"`
	Cap      *int   `json:"cap,omitempty"`
	WaitedMs *int64 `json:"waitedMs,omitempty"`
	// Position: live waiters ahead at the full level; EstimatedWaitMs: the estimate of the
	// wait from there (LEASE_BUSY, when known; docs/waiting.md "Who waits").
	Position        *int   `json:"position,omitempty"`
	EstimatedWaitMs *int64 `json:"estimatedWaitMs,omitempty"`
	// The refusal's diagnosis (TENANT_FORBIDDEN): the calling pod's namespace (empty for a
	// caller that is no pod) and the tenant that namespace speaks for (empty when unlabelled).
	CallerNamespace string `json:"callerNamespace,omitempty"`
	CallerTenant    string `json:"callerTenant,omitempty"`
	// Result is what an operator action did before a failure, in the route's success shape.
	Result any `json:"result,omitempty"`
}

// Write answers status with v as JSON. Answers are never cached: they describe live state.
func Write(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// The status line is sent: a failed write only means the client went away.
	_ = json.NewEncoder(w).Encode(v)
}

// WriteError answers status with an ErrorBody of code and message.
func WriteError(w http.ResponseWriter, status int, code, message string) {
	Write(w, status, ErrorBody{Error: code, Message: message})
}

// WriteUnavailable answers 503 LEASE_UNAVAILABLE with message, a fixed text that says what
// kind of thing is unavailable, and id (lease.CorrelationID), under which the caller has logged
// the cause in full. The cause itself (store host names, replica-set topology) never goes on
// the wire (docs/security.md, "Errors without internal detail").
func WriteUnavailable(w http.ResponseWriter, message, id string) {
	Write(w, http.StatusServiceUnavailable, ErrorBody{Error: CodeUnavailable,
		Message: message + " (correlation id " + id + " in the server's log)", CorrelationID: id})
}
