package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// CodeDisabled is the error code when the operator API has no secret configured.
const CodeDisabled = "ADMIN_DISABLED"

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
			return &lease.InvalidError{Field: "tenant", Detail: fmt.Sprintf("%q is not a valid tenant ID", lease.Clip(b.Tenant, 64))}
		}
	}
	return nil
}

func validToken(token string) error {
	switch {
	case token == "":
		return &lease.InvalidError{Field: "token", Detail: "is required"}
	case len(token) != tokenLen || strings.IndexFunc(token, notLowerHex) >= 0:
		return &lease.InvalidError{Field: "token", Detail: fmt.Sprintf("%q is not a lease token (want %d lowercase hex digits)", lease.Clip(token, 64), tokenLen)}
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
		return &lease.InvalidError{Field: "namespace", Detail: "is required"}
	case len(validation.IsDNS1123Label(b.Namespace)) > 0:
		return &lease.InvalidError{Field: "namespace", Detail: fmt.Sprintf("%q is not a valid namespace: %s",
			lease.Clip(b.Namespace, 64), strings.Join(validation.IsDNS1123Label(b.Namespace), "; "))}
	case b.Name == "":
		return &lease.InvalidError{Field: "name", Detail: "is required"}
	case len(validation.IsDNS1123Subdomain(b.Name)) > 0:
		return &lease.InvalidError{Field: "name", Detail: fmt.Sprintf("%q is not a valid pod name: %s",
			lease.Clip(b.Name, 64), strings.Join(validation.IsDNS1123Subdomain(b.Name), "; "))}
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

// decode reads a JSON body strictly (see httpjson.Decode). With required false an empty
// body is accepted.
func (h *handler) decode(w http.ResponseWriter, r *http.Request, dst any, required bool) error {
	if fe := httpjson.Decode(w, r, h.maxBody, dst, required); fe != nil {
		return &lease.InvalidError{Field: fe.Field, Detail: fe.Detail}
	}
	return nil
}

func writeInvalid(w http.ResponseWriter, err error) {
	var inv *lease.InvalidError
	field := "body"
	if errors.As(err, &inv) {
		field = inv.Field
	}
	httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Error: httpjson.CodeInvalid, Message: err.Error(), Field: field})
}

// fail answers a failed operation: 503 LEASE_UNAVAILABLE for a store error, 500 INTERNAL
// otherwise, with what was done before the failure in "result". This is where the error
// ends, so it is logged here.
func (h *handler) fail(w http.ResponseWriter, r *http.Request, err error, partial any, format string, args ...any) {
	err = fmt.Errorf(format+": %w", append(args, err)...)
	h.audit(r).Error(err, "Admin operation failed", "partial", partial != nil)
	body := httpjson.ErrorBody{Error: httpjson.CodeInternal, Message: err.Error(), Result: partial}
	status := http.StatusInternalServerError
	if errors.Is(err, lease.ErrUnavailable) {
		body.Error, status = httpjson.CodeUnavailable, http.StatusServiceUnavailable
	}
	if partial != nil {
		body.Message += " (\"result\" shows what was done before the failure; revoked holders went to their handlers)"
	}
	httpjson.Write(w, status, body)
}

func methodNotAllowed(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Allow", http.MethodPost)
	httpjson.Write(w, http.StatusMethodNotAllowed, httpjson.ErrorBody{Error: httpjson.CodeMethodNotAllowed,
		Message: r.Method + " is not allowed on " + r.URL.Path + "; use POST"})
}

func unknownRoute(w http.ResponseWriter, r *http.Request) {
	httpjson.Write(w, http.StatusNotFound, httpjson.ErrorBody{Error: httpjson.CodeUnknownRoute,
		Message: "no admin route " + r.URL.Path + " (this manager serves revoke, revoke-pod, sweep, reconcile under " + PathPrefix + ")"})
}
