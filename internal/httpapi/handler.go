// Package httpapi serves the admission API over HTTP (docs/api.md, "Admission
// API"): acquire, check, payload update, release and the revocation long-poll. The agent
// (sidecar) serves it on 127.0.0.1 with its own pod as identity; the manager serves it behind
// a Service and identifies the calling pod itself. Requests are validated before anything is
// written: malformed JSON, unknown fields, bad names, unknown types and oversized payloads
// are 400 INVALID_REQUEST naming the field.
package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// PathPrefix is where the admission API is mounted: every route of NewHandler but
// PathOpenAPI is below it.
const PathPrefix = "/v1/"

// Defaults of the options.
const (
	// DefaultMaxBodyBytes bounds a request body.
	DefaultMaxBodyBytes = 64 << 10
	// DefaultEventTimeout is the long-poll timeout when the request names none.
	DefaultEventTimeout = 30 * time.Second
	// MaxEventTimeout is the longest long-poll a request may ask for.
	MaxEventTimeout = 60 * time.Second
)

// PodIdentity returns the pod of the caller of a request. An error satisfying
// lease.ErrUnavailable is answered 503 (e.g. the pod informer has not synced); any other
// error 400 INVALID_REQUEST with field "pod". A zero PodRef means "no pod".
type PodIdentity func(*http.Request) (lease.PodRef, error)

// TenantBinder decides which tenant a request acts for from its caller (the pod PodIdentity
// found, zero for no pod; addr the source address) and the tenant the body named, empty when
// it named none. An error satisfying lease.ErrTenantForbidden is answered 403, one satisfying
// lease.ErrUnavailable 503; nothing is written for either (docs/tenancy.md, "Who may acquire
// for a tenant"). ctx is the request's. tenancy.Binder.Bind is the implementation.
type TenantBinder func(ctx context.Context, caller tenancy.Caller, requested string) (string, error)

// Option configures the handler.
type Option func(*handler)

// WithPodIdentity sets how the holder's pod is determined. Without it holders have no pod:
// only the idle reap applies to them.
func WithPodIdentity(f PodIdentity) Option { return func(h *handler) { h.identity = f } }

// WithTenantBinder binds every acquisition to the tenant its caller may act for. Without it
// the tenant is whatever the body names (tests of the library only: both servers set it).
func WithTenantBinder(b TenantBinder) Option { return func(h *handler) { h.binder = b } }

// WithEvents serves GET /v1/leases/{token}/events, a long-poll on the hub. Without it the
// route is not served.
func WithEvents(hub *notify.Hub) Option { return func(h *handler) { h.hub = hub } }

// WithMaxWait caps the wait of every acquisition served here (it shortens, never lengthens,
// the definition's waitMs), so that an answer always fits in the server's write timeout. Set
// it below http.Server.WriteTimeout; without it a wait may last up to leasing.MaxWait.
func WithMaxWait(d time.Duration) Option { return func(h *handler) { h.maxWait = &d } }

// WithMaxBodyBytes bounds request bodies (default DefaultMaxBodyBytes).
func WithMaxBodyBytes(n int64) Option { return func(h *handler) { h.maxBody = n } }

type handler struct {
	svc      *leasing.Service
	identity PodIdentity
	binder   TenantBinder
	hub      *notify.Hub
	maxBody  int64
	maxWait  *time.Duration
	mux      *http.ServeMux
}

// NewHandler returns the HTTP admission API:
//
//	POST   /v1/leases                   acquire (?dryRun=true: what it would answer now)
//	POST   /v1/leases/{token}/check     check-at-use (touch)
//	PUT    /v1/leases/{token}/payload   replace the payload
//	DELETE /v1/leases/{token}           release (idempotent)
//	GET    /v1/leases/{token}/events    long-poll for a revocation (WithEvents)
//	GET    /openapi.json                this API's OpenAPI document
//
// (the route table is table(), from the Path constants; mount the handler at "/").
// A server running it needs a write timeout above the longest wait (waitMs, at most
// leasing.MaxWait, or WithMaxWait) and the long-poll bound (MaxEventTimeout).
func NewHandler(svc *leasing.Service, opts ...Option) http.Handler {
	h := &handler{svc: svc, maxBody: DefaultMaxBodyBytes, mux: http.NewServeMux()}
	for _, o := range opts {
		o(h)
	}
	for _, r := range h.table() {
		if r.Path == PathEvents && h.hub == nil {
			continue
		}
		h.mux.HandleFunc(r.Method+" "+r.Path, r.serve)
	}
	return h.mux
}

func (h *handler) acquire(w http.ResponseWriter, r *http.Request) {
	dryRun, err := dryRunOf(r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	req, err := h.acquisition(w, r)
	if err != nil {
		writeError(w, r, err)
		return
	}
	if dryRun {
		l, err := h.svc.DryRun(r.Context(), req)
		if err != nil {
			writeError(w, r, err)
			return
		}
		httpjson.Write(w, http.StatusOK, dryRunResponse(l))
		return
	}
	lease, err := h.svc.Acquire(r.Context(), req)
	if err != nil {
		writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, leaseResponse(lease))
}

// acquisition reads the request of POST /v1/leases, with its caller's pod and the tenant
// that caller acts for: what an acquisition and a dry run both check before anything else.
func (h *handler) acquisition(w http.ResponseWriter, r *http.Request) (leasing.Request, error) {
	var body acquireBody
	if err := h.decode(w, r, &body); err != nil {
		return leasing.Request{}, err
	}
	req, err := body.request()
	if err != nil {
		return leasing.Request{}, err
	}
	if h.maxWait != nil && (req.Wait == nil || *req.Wait > *h.maxWait) {
		req.Wait = h.maxWait
	}
	if h.identity != nil {
		pod, err := h.identity(r)
		if err != nil {
			if errors.Is(err, lease.ErrUnavailable) {
				err = fmt.Errorf("%w: %w", errCallerUnidentified, err)
			} else {
				err = &lease.InvalidError{Field: "pod", Detail: "the calling pod is not known: " + err.Error()}
			}
			return leasing.Request{}, err
		}
		req.Pod = pod
	}
	if h.binder != nil {
		tenant, err := h.binder(r.Context(), tenancy.Caller{Pod: req.Pod, Addr: remoteHost(r)}, req.Tenant)
		if err != nil {
			return leasing.Request{}, err
		}
		req.Tenant = tenant
	}
	return req, nil
}

func (h *handler) check(w http.ResponseWriter, r *http.Request) {
	fence, parts, err := h.svc.CheckParts(r.Context(), r.PathValue("token"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, checkResponse(fence, parts))
}

func (h *handler) updatePayload(w http.ResponseWriter, r *http.Request) {
	token := r.PathValue("token")
	if !leasing.ValidToken(token) {
		writeError(w, r, &lease.InvalidError{Field: "token", Detail: "is not a valid lease token"})
		return
	}
	var body payloadBody
	if err := h.decode(w, r, &body); err != nil {
		writeError(w, r, err)
		return
	}
	if err := h.svc.UpdatePayload(r.Context(), token, body.Payload); err != nil {
		writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, outcomeBody{Outcome: "ok"})
}

func (h *handler) release(w http.ResponseWriter, r *http.Request) {
	outcome, err := h.svc.Release(r.Context(), r.PathValue("token"))
	if err != nil {
		writeError(w, r, err)
		return
	}
	httpjson.Write(w, http.StatusOK, outcomeBody{Outcome: outcome})
}
