package adminapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/jsonbody"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// Error codes of the JSON error body.
const (
	CodeInvalid          = "INVALID_REQUEST"
	CodeUnauthorized     = "UNAUTHORIZED"
	CodeDisabled         = "ADMIN_DISABLED"
	CodeNotFound         = "NOT_FOUND"
	CodeUnknownRoute     = "UNKNOWN_ROUTE"
	CodeMethodNotAllowed = "METHOD_NOT_ALLOWED"
	CodeUnavailable      = "LEASE_UNAVAILABLE"
	CodeInternal         = "INTERNAL"
)

// tokenLen is the length of a holder token: 128 random bits in lowercase hex.
const tokenLen = 32

// revokeBody is the body of POST /internal/lease/admin/revoke.
type revokeBody struct {
	// Token is the holder's token.
	Token string `json:"token"`
	// Tenant, when set, restricts the revocation to a holder of that tenant: the binding is
	// in the store's delete filter.
	Tenant string `json:"tenant,omitempty"`
}

func (b revokeBody) validate() error {
	if err := validToken(b.Token); err != nil {
		return err
	}
	if b.Tenant != "" {
		if err := definition.ValidateScope(b.Tenant, definition.TenantProject); err != nil {
			return &invalidError{Field: "tenant", Detail: fmt.Sprintf("%q is not a valid tenant ID", truncate(b.Tenant))}
		}
	}
	return nil
}

func validToken(token string) error {
	switch {
	case token == "":
		return &invalidError{Field: "token", Detail: "is required"}
	case len(token) != tokenLen || strings.IndexFunc(token, notLowerHex) >= 0:
		return &invalidError{Field: "token", Detail: fmt.Sprintf("%q is not a lease token (want %d lowercase hex digits)", truncate(token), tokenLen)}
	}
	return nil
}

func notLowerHex(r rune) bool { return (r < '0' || r > '9') && (r < 'a' || r > 'f') }

// revokePodBody is the body of POST /internal/lease/admin/revoke-pod.
type revokePodBody struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
}

func (b revokePodBody) validate() error {
	switch {
	case b.Namespace == "":
		return &invalidError{Field: "namespace", Detail: "is required"}
	case len(validation.IsDNS1123Label(b.Namespace)) > 0:
		return &invalidError{Field: "namespace", Detail: fmt.Sprintf("%q is not a valid namespace: %s",
			truncate(b.Namespace), strings.Join(validation.IsDNS1123Label(b.Namespace), "; "))}
	case b.Name == "":
		return &invalidError{Field: "name", Detail: "is required"}
	case len(validation.IsDNS1123Subdomain(b.Name)) > 0:
		return &invalidError{Field: "name", Detail: fmt.Sprintf("%q is not a valid pod name: %s",
			truncate(b.Name), strings.Join(validation.IsDNS1123Subdomain(b.Name), "; "))}
	}
	return nil
}

// emptyBody is the (optional) body of sweep and reconcile: nothing, or {}.
type emptyBody struct{}

// HolderView is a revoked holder as the admin API shows it.
type HolderView struct {
	Token     string `json:"token"`
	State     string `json:"state"`
	Lease     string `json:"lease"`
	Resource  string `json:"resource"`
	Type      string `json:"type"`
	Tenant    string `json:"tenant"`
	Project   string `json:"project"`
	User      string `json:"user,omitempty"`
	HolderRef string `json:"holderRef,omitempty"`
	// Pod is namespace/name; empty for a holder without a pod.
	Pod      string            `json:"pod,omitempty"`
	PodUID   string            `json:"podUID,omitempty"`
	PodBound bool              `json:"podBound"`
	Payload  map[string]string `json:"payload,omitempty"`
	// Levels are the counter keys the holder had booked and that were returned.
	Levels     []string  `json:"levels"`
	AcquiredAt time.Time `json:"acquiredAt,omitzero"`
	LastSeenAt time.Time `json:"lastSeenAt,omitzero"`
}

// HolderViewOf renders a holder as the operator API (and kubectl lease) shows it.
func HolderViewOf(h lease.Holder) HolderView {
	levels := h.Levels
	if levels == nil {
		levels = []string{}
	}
	return HolderView{
		Token:      h.Token,
		State:      string(h.State),
		Lease:      h.LeaseName,
		Resource:   h.Resource,
		Type:       h.Type,
		Tenant:     h.Tenant,
		Project:    h.Project,
		User:       h.User,
		HolderRef:  h.HolderRef,
		Pod:        h.Pod.String(),
		PodUID:     h.Pod.UID,
		PodBound:   h.PodBound,
		Payload:    h.Payload,
		Levels:     levels,
		AcquiredAt: h.AcquiredAt.UTC(),
		LastSeenAt: h.LastSeenAt.UTC(),
	}
}

func holderViews(hs []lease.Holder) []HolderView {
	out := make([]HolderView, 0, len(hs))
	for _, h := range hs {
		out = append(out, HolderViewOf(h))
	}
	return out
}

// RevokeResult is the answer of revoke.
type RevokeResult struct {
	Revoked bool       `json:"revoked"`
	Holder  HolderView `json:"holder"`
}

// RevokePodResult is the answer of revoke-pod; Revoked is len(Holders), 0 when the pod held
// nothing.
type RevokePodResult struct {
	Revoked int          `json:"revoked"`
	Holders []HolderView `json:"holders"`
}

// ReconcileView is the answer of reconcile (leasestore.ReconcileResult).
type ReconcileView struct {
	Corrected int `json:"corrected"`
	Deleted   int `json:"deleted"`
	Created   int `json:"created"`
	Skipped   int `json:"skipped"`
}

func reconcileView(r leasestore.ReconcileResult) ReconcileView {
	return ReconcileView{Corrected: r.Corrected, Deleted: r.Deleted, Created: r.Created, Skipped: r.Skipped}
}

// SweepView is the answer of sweep (sweeper.Result): holders reaped idle, holders of dead
// pods reaped, and the reconcile of the round.
type SweepView struct {
	Idle      int           `json:"idle"`
	Pod       int           `json:"pod"`
	Reconcile ReconcileView `json:"reconcile"`
}

func sweepView(r sweeper.Result) SweepView {
	return SweepView{Idle: r.Idle, Pod: r.Pod, Reconcile: reconcileView(r.Reconcile)}
}

// ErrorBody is every error answer: Error is the code, Message the detail.
type ErrorBody struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	// Field names the offending request field (INVALID_REQUEST).
	Field string `json:"field,omitempty"`
	// Result is what was done before a 5xx failure, in the route's success shape.
	Result any `json:"result,omitempty"`
}

// invalidError is a 400 INVALID_REQUEST naming the field.
type invalidError struct {
	Field  string
	Detail string
}

func (e *invalidError) Error() string { return e.Field + ": " + e.Detail }

// decode reads a JSON body strictly (see jsonbody.Decode). With required false an empty
// body is accepted.
func (h *handler) decode(w http.ResponseWriter, r *http.Request, dst any, required bool) error {
	if fe := jsonbody.Decode(w, r, h.maxBody, dst, required); fe != nil {
		return &invalidError{Field: fe.Field, Detail: fe.Detail}
	}
	return nil
}

func writeInvalid(w http.ResponseWriter, err error) {
	var inv *invalidError
	field := "body"
	if errors.As(err, &inv) {
		field = inv.Field
	}
	writeJSON(w, http.StatusBadRequest, ErrorBody{Error: CodeInvalid, Message: err.Error(), Field: field})
}

// fail answers a failed operation: 503 LEASE_UNAVAILABLE for a store error, 500 INTERNAL
// otherwise, with what was done before the failure in "result". This is where the error
// ends, so it is logged here.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error, partial any, format string, args ...any) {
	err = fmt.Errorf(format+": %w", append(args, err)...)
	h.audit(r).Error(err, "Admin operation failed", "partial", partial != nil)
	body := ErrorBody{Error: CodeInternal, Message: err.Error(), Result: partial}
	status := http.StatusInternalServerError
	if errors.Is(err, lease.ErrUnavailable) {
		body.Error, status = CodeUnavailable, http.StatusServiceUnavailable
	}
	if partial != nil {
		body.Message += " (\"result\" shows what was done before the failure; revoked holders went to their handlers)"
	}
	writeJSON(w, status, body)
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{Error: CodeMethodNotAllowed,
		Message: r.Method + " is not allowed on " + r.URL.Path + "; use POST"})
}

func unknownRoute(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusNotFound, ErrorBody{Error: CodeUnknownRoute,
		Message: "no admin route " + r.URL.Path + " (this manager serves revoke, revoke-pod, sweep, reconcile under " + PathPrefix + ")"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	// The status line is sent: a failed write only means the client went away.
	_ = json.NewEncoder(w).Encode(v)
}

func truncate(s string) string {
	const n = 64
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
