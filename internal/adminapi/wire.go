package adminapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/opsview"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// CodeDisabled is the error code when the operator API has no secret configured.
const CodeDisabled = "ADMIN_DISABLED"

// tokenLen is the length of a holder token: 128 random bits in lowercase hex.
const tokenLen = 32

// revokeBody is the body of POST /internal/lease/admin/revoke: the holder by its public ID,
// or by its token (for a caller that has one); answers and logs name only the ID.
type revokeBody struct {
	// ID is the holder's public ID (as the live API and kubectl lease list show it).
	ID string `json:"id,omitempty"`
	// Token is the holder's token, instead of ID.
	Token string `json:"token,omitempty"`
	// Tenant, when set, restricts the revocation to a holder of that tenant: the binding is
	// in the store's delete filter.
	Tenant string `json:"tenant,omitempty"`
}

func (b revokeBody) validate() error {
	switch {
	case b.ID != "" && b.Token != "":
		return &lease.InvalidError{Field: "id", Detail: "give id or token, not both"}
	case b.ID != "":
		if !lease.ValidHolderID(b.ID) {
			// The value is not echoed: it may be a token given as an ID (docs/security.md, "Tokens").
			return &lease.InvalidError{Field: "id", Detail: fmt.Sprintf("is not a holder ID (want %s and 24 lowercase hex digits; a token goes in \"token\")", lease.HolderIDPrefix)}
		}
	default:
		if err := validToken(b.Token); err != nil {
			return err
		}
	}
	if b.Tenant != "" {
		if err := definition.ValidateScope(b.Tenant, definition.TenantProject); err != nil {
			return &lease.InvalidError{Field: "tenant", Detail: fmt.Sprintf("%q is not a valid tenant ID", lease.Clip(b.Tenant, 64))}
		}
	}
	return nil
}

// holderID is the public ID the body names.
func (b revokeBody) holderID() string {
	if b.ID != "" {
		return b.ID
	}
	return lease.HolderID(b.Token)
}

func validToken(token string) error {
	switch {
	case token == "":
		return &lease.InvalidError{Field: "token", Detail: "is required (or id)"}
	case len(token) != tokenLen || strings.IndexFunc(token, notLowerHex) >= 0:
		// The value is not echoed: a token in another case or with a space around it is
		// still a bearer secret (docs/security.md, "Tokens").
		return &lease.InvalidError{Field: "token", Detail: fmt.Sprintf("is not a lease token (want %d lowercase hex digits)", tokenLen)}
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

func reconcileView(r leasestore.ReconcileResult) opsview.ReconcileView {
	return opsview.ReconcileView{Corrected: r.Corrected, Deleted: r.Deleted, Repaired: r.Repaired, Skipped: r.Skipped, Unmarked: r.Unmarked}
}

func sweepView(r sweeper.Result) opsview.SweepView {
	return opsview.SweepView{Idle: r.Idle, Pod: r.Pod, Reconcile: reconcileView(r.Reconcile)}
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
