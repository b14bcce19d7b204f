package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// acquireBody is the body of POST /v1/leases.
type acquireBody struct {
	Type      string                 `json:"type"`
	Lease     string                 `json:"lease,omitempty"`
	Leases    []string               `json:"leases,omitempty"` // several at once: leasing.Request.Leases
	Inline    *definition.InlineSpec `json:"inline,omitempty"`
	Tenant    string                 `json:"tenant,omitempty"`
	Project   string                 `json:"project"`
	User      string                 `json:"user,omitempty"`
	HolderRef string                 `json:"holderRef,omitempty"`
	PodBound  bool                   `json:"podBound,omitempty"`
	Payload   map[string]string      `json:"payload,omitempty"`
	WaitMs    *int64                 `json:"waitMs,omitempty"`
	// Priority: docs/waiting.md, "Priority"; the lease's maxPriority bounds it (leasing).
	Priority int `json:"priority,omitempty"`
}

func (b acquireBody) request() (leasing.Request, error) {
	req := leasing.Request{
		Type: b.Type, Lease: b.Lease, Leases: b.Leases, Inline: b.Inline,
		Tenant: b.Tenant, Project: b.Project, User: b.User,
		HolderRef: b.HolderRef, PodBound: b.PodBound, Payload: b.Payload, Priority: b.Priority,
	}
	if b.WaitMs != nil {
		if *b.WaitMs < 0 || *b.WaitMs > leasing.MaxWait.Milliseconds() {
			return req, &lease.InvalidError{Field: "waitMs",
				Detail: fmt.Sprintf("must be between 0 and %d", leasing.MaxWait.Milliseconds())}
		}
		d := time.Duration(*b.WaitMs) * time.Millisecond
		req.Wait = &d
	}
	return req, nil
}

// payloadBody is the body of PUT /v1/leases/{token}/payload.
type payloadBody struct {
	Payload map[string]string `json:"payload"`
}

// levelBody is one booked level in a lease response.
type levelBody struct {
	Level string `json:"level"`
	Scope string `json:"scope"`
	Cap   int    `json:"cap"`
}

// leaseBody is the 200 answer of POST /v1/leases for a booked lease.
type leaseBody struct {
	Token      string      `json:"token"`
	NoOp       bool        `json:"noop"`
	Lease      string      `json:"lease"`
	Resource   string      `json:"resource"`
	Levels     []levelBody `json:"levels"`
	TTLSeconds int64       `json:"ttlSeconds"`
	Fence      int64       `json:"fence"`
}

// noopBody is the 200 answer of POST /v1/leases when no lease applies.
type noopBody struct {
	NoOp bool `json:"noop"`
}

// leasesBody is the 200 answer of POST /v1/leases for a booked acquisition of several
// leases: a lease's answer with its parts in place of lease, resource, levels and fence.
type leasesBody struct {
	Token      string     `json:"token"`
	NoOp       bool       `json:"noop"`
	Leases     []partBody `json:"leases"`
	TTLSeconds int64      `json:"ttlSeconds"`
}

// partBody is one lease of an acquisition of several, in the order of their resources. Its
// fence is absent only in a dry run's answer: a grant's fence is at least 1.
type partBody struct {
	Lease    string      `json:"lease"`
	Resource string      `json:"resource"`
	Levels   []levelBody `json:"levels"`
	Fence    int64       `json:"fence,omitempty"`
}

func partsBody(parts []leasing.PartLease) []partBody {
	out := make([]partBody, len(parts))
	for i, p := range parts {
		out[i] = partBody{Lease: p.Name, Resource: p.Resource, Levels: levelsBody(p.Levels), Fence: p.Fence}
	}
	return out
}

func leaseResponse(l leasing.Lease) any {
	if l.NoOp {
		return noopBody{NoOp: true}
	}
	if len(l.Parts) > 0 {
		return leasesBody{Token: l.Token, Leases: partsBody(l.Parts), TTLSeconds: int64(l.TTL / time.Second)}
	}
	return leaseBody{Token: l.Token, Lease: l.Name, Resource: l.Resource, Levels: levelsBody(l.Levels),
		TTLSeconds: int64(l.TTL / time.Second), Fence: l.Fence}
}

func levelsBody(levels []leasing.LevelInfo) []levelBody {
	out := []levelBody{}
	for _, lv := range levels {
		out = append(out, levelBody{Level: string(lv.Level), Scope: lv.Scope, Cap: lv.Cap})
	}
	return out
}

// ParamDryRun is the query parameter that makes POST /v1/leases a dry run.
const ParamDryRun = "dryRun"

// dryRunOf reads ?dryRun: absent is a real acquisition, "true" or "1" a dry run. Any other
// value is refused rather than read as false, so that a misspelt dry run never books a slot.
func dryRunOf(r *http.Request) (bool, error) {
	values, ok := r.URL.Query()[ParamDryRun]
	if !ok {
		return false, nil
	}
	if len(values) == 1 && (values[0] == "true" || values[0] == "1") {
		return true, nil
	}
	return false, &lease.InvalidError{Field: ParamDryRun,
		Detail: fmt.Sprintf("%q: want true or 1, or no %s for a real acquisition", lease.Clip(strings.Join(values, ","), 32), ParamDryRun)}
}

// dryRunBody is the 200 answer of a dry run that would be granted now: a lease's answer
// without token and fence.
type dryRunBody struct {
	DryRun     bool        `json:"dryRun"`
	NoOp       bool        `json:"noop"`
	Lease      string      `json:"lease"`
	Resource   string      `json:"resource"`
	Levels     []levelBody `json:"levels"`
	TTLSeconds int64       `json:"ttlSeconds"`
}

// dryRunNoopBody is the 200 answer of a dry run when no lease applies.
type dryRunNoopBody struct {
	NoOp   bool `json:"noop"`
	DryRun bool `json:"dryRun"`
}

// dryRunLeasesBody is the 200 answer of a dry run of several leases that would be granted
// now: leasesBody without token and fences.
type dryRunLeasesBody struct {
	DryRun     bool       `json:"dryRun"`
	NoOp       bool       `json:"noop"`
	Leases     []partBody `json:"leases"`
	TTLSeconds int64      `json:"ttlSeconds"`
}

func dryRunResponse(l leasing.Lease) any {
	if l.NoOp {
		return dryRunNoopBody{NoOp: true, DryRun: true}
	}
	if len(l.Parts) > 0 {
		// The service answers a dry run without fences: nothing was granted.
		return dryRunLeasesBody{DryRun: true, Leases: partsBody(l.Parts), TTLSeconds: int64(l.TTL / time.Second)}
	}
	return dryRunBody{DryRun: true, Lease: l.Name, Resource: l.Resource, Levels: levelsBody(l.Levels),
		TTLSeconds: int64(l.TTL / time.Second)}
}

type outcomeBody struct {
	Outcome string `json:"outcome"`
}

// checkBody is the 200 answer of POST /v1/leases/{token}/check. Fence is the lease's, or
// for a holder of several resources the first part's; Leases, only for such a holder, are
// its parts with their fences.
type checkBody struct {
	Outcome string          `json:"outcome"`
	Fence   int64           `json:"fence"`
	Leases  []checkPartBody `json:"leases,omitempty"`
}

// checkPartBody is one part of a holder of several resources in a check's answer.
type checkPartBody struct {
	Lease    string `json:"lease"`
	Resource string `json:"resource"`
	Fence    int64  `json:"fence"`
}

func checkResponse(fence int64, parts []lease.Part) checkBody {
	body := checkBody{Outcome: "ok", Fence: fence}
	for _, p := range parts {
		body.Leases = append(body.Leases, checkPartBody{Lease: p.LeaseName, Resource: p.Resource, Fence: p.Fence})
	}
	return body
}

// decode reads a JSON body strictly (see httpjson.Decode).
func (h *handler) decode(w http.ResponseWriter, r *http.Request, dst any) error {
	if fe := httpjson.Decode(w, r, h.maxBody, dst, true); fe != nil {
		return &lease.InvalidError{Field: fe.Field, Detail: fe.Detail}
	}
	return nil
}

// writeError answers err with its status and JSON error body.
func writeError(w http.ResponseWriter, r *http.Request, err error) {
	var (
		inv       *lease.InvalidError
		busy      *lease.BusyError
		forbidden *lease.TenantForbiddenError
	)
	switch {
	case errors.As(err, &inv):
		httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Error: httpjson.CodeInvalid, Message: err.Error(), Field: inv.Field})
	case errors.As(err, &busy):
		waited := busy.Waited.Milliseconds()
		body := httpjson.ErrorBody{Error: httpjson.CodeBusy, Message: err.Error(),
			Lease: busy.Lease, Resource: busy.Resource, Level: string(busy.Level), Scope: busy.Scope,
			Count: &busy.Count, Cap: &busy.Cap, WaitedMs: &waited}
		if busy.Explained {
			body.Position = &busy.Position
			if est := busy.EstimatedWait.Milliseconds(); est > 0 {
				body.EstimatedWaitMs = &est
			}
		}
		httpjson.Write(w, http.StatusConflict, body)
	case errors.As(err, &forbidden):
		httpjson.Write(w, http.StatusForbidden, httpjson.ErrorBody{Error: httpjson.CodeTenantForbidden, Message: err.Error(),
			CallerNamespace: forbidden.Pod.Namespace, CallerTenant: forbidden.NamespaceTenant})
	case errors.Is(err, lease.ErrLost):
		httpjson.Write(w, http.StatusGone, httpjson.ErrorBody{Error: httpjson.CodeLost, Message: err.Error()})
	case errors.Is(err, liveness.ErrLookupLimited):
		// Nothing internal to hide and nothing to find in the log: the pod watcher logs these
		// refusals once a second, and counts each (docs/operations.md, "Pod identity").
		w.Header().Set("Retry-After", "1")
		httpjson.Write(w, http.StatusServiceUnavailable, httpjson.ErrorBody{Error: httpjson.CodeUnavailable,
			Message: errCallerUnidentified.Error() + ": " + liveness.ErrLookupLimited.Error()})
	default:
		// Unavailable, and anything unexpected: fail closed. The cause (store host names and
		// topology, the documents of a definition) stays in the log; the caller gets its kind
		// and the correlation id that finds it there (docs/security.md).
		id := lease.CorrelationID()
		logf.FromContext(r.Context()).Error(err, "Lease request failed", requestKeys(r, "correlationId", id)...)
		httpjson.WriteUnavailable(w, unavailableMessage(err), id)
	}
}

// requestKeys names a request in a log line by its route, never by its path: the path of
// check, payload, release and events carries the holder's token, a bearer secret, so the
// holder is named by its public ID (docs/security.md, "Tokens").
func requestKeys(r *http.Request, kv ...any) []any {
	keys := []any{"route", r.Pattern}
	if token := r.PathValue("token"); token != "" {
		keys = append(keys, "holder", lease.HolderID(token))
	}
	return append(keys, kv...)
}

// errCallerUnidentified marks an unavailable answer of the PodIdentity: what cannot be known
// now is the calling pod, not the store (the API server cannot be read, two pods claim the
// address, or too many unknown callers; docs/operations.md, "Pod identity").
var errCallerUnidentified = errors.New("the calling pod cannot be identified now")

// unavailableMessage says what kind of thing is unavailable, without internal detail.
func unavailableMessage(err error) string {
	var ue *definition.UnavailableError
	if errors.As(err, &ue) {
		return fmt.Sprintf("the definition of lease %q is unavailable (broken, in conflict, refused or unreadable)", ue.Name)
	}
	if errors.Is(err, errCallerUnidentified) {
		return errCallerUnidentified.Error()
	}
	if errors.Is(err, tenancy.ErrNotSynced) {
		return "the tenant of the calling pod is not known yet (the server has not yet learnt which namespace belongs to which tenant)"
	}
	return "the lease store is unavailable"
}
