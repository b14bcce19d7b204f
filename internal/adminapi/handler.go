// Package adminapi serves the manager's operator API (docs/api.md, "Operator API")
// that the kubectl lease plugin calls: revoke a holder, revoke every holder of a pod, run a
// reaper round now, reconcile the counters.
//
// Revocation is a reap on the operator's decision, not a release: the holder document is
// removed, its booked levels are returned, and then the holder goes to the revocation
// listener (the dispatcher) with reason "revoke", which runs the type's handler through the
// same podBound matrix as a sweep does and counts vance_lease_reap_total{reason="revoke"}.
// Only freeing the slot would let the resource run on; the holder itself learns of it at its
// next check (LEASE_LOST).
//
// Every route needs "Authorization: Bearer <secret>". With no secret configured the whole
// API is off (403 ADMIN_DISABLED): a manager without a secret is closed, not open.
package adminapi

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/opsview"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

// Routes of the admin API; all are POST. Mount the handler at PathPrefix.
const (
	PathPrefix    = "/internal/lease/admin/"
	PathRevoke    = PathPrefix + "revoke"
	PathRevokePod = PathPrefix + "revoke-pod"
	PathSweep     = PathPrefix + "sweep"
	PathReconcile = PathPrefix + "reconcile"
)

// ReasonRevoke is the reason the listener receives revoked holders with (the reap metric's
// reason label).
const ReasonRevoke = metrics.ReapRevoke

// Defaults of the options.
const (
	// DefaultMaxBodyBytes bounds a request body; the bodies are a token or a pod name.
	DefaultMaxBodyBytes = 16 << 10
	// DefaultTimeout bounds one admin request. Every store call has its own, shorter
	// deadline; this one bounds a whole sweep or a revoke-pod of many holders, and stays
	// below the manager API server's 90 s write timeout so that the answer gets out.
	DefaultTimeout = 60 * time.Second
)

// Store is the part of the lease store the admin API uses (*leasestore.Store).
type Store interface {
	// Revoke deletes one holder by token, with a tenant only a holder of that tenant, and
	// returns its levels; ok is false when nothing matched.
	RevokeByID(ctx context.Context, id, tenant string) (lease.Holder, bool, error)
	// RevokePod deletes every holder of the pod namespace/name, whatever its UID.
	RevokePod(ctx context.Context, namespace, name string) ([]lease.Holder, error)
	// Reconcile corrects counter drift.
	Reconcile(ctx context.Context) (leasestore.ReconcileResult, error)
}

// Listener receives the revoked holders (the revocation dispatcher). It must not block: it
// counts the reap and queues the handlers.
type Listener interface {
	Revoked(ctx context.Context, reason string, holders []lease.Holder)
}

// Sweeper runs one reaper round now, dispatching what it reaps itself (*sweeper.Sweeper).
type Sweeper interface {
	Sweep(ctx context.Context) (sweeper.Result, error)
}

var (
	_ Store    = (*leasestore.Store)(nil)
	_ Listener = (*revocation.Dispatcher)(nil)
	_ Sweeper  = (*sweeper.Sweeper)(nil)
)

// Option configures the handler.
type Option func(*handler)

// WithMaxBodyBytes bounds request bodies (default DefaultMaxBodyBytes).
func WithMaxBodyBytes(n int64) Option { return func(h *handler) { h.maxBody = n } }

// WithTimeout bounds one request (default DefaultTimeout). Keep it below the server's write
// timeout so that the answer, success or not, reaches the operator.
func WithTimeout(d time.Duration) Option { return func(h *handler) { h.timeout = d } }

// WithMetrics sets the metrics (default: metrics.Default()). Only reconcile is counted here:
// revocations are counted by the listener, sweeps by the sweeper.
func WithMetrics(m *metrics.Metrics) Option { return func(h *handler) { h.metrics = m } }

// WithLogger sets the logger of the audit lines (default: discard).
func WithLogger(l logr.Logger) Option { return func(h *handler) { h.log = l } }

type handler struct {
	store    Store
	listener Listener
	sweeper  Sweeper
	enabled  bool
	secret   [sha256.Size]byte
	maxBody  int64
	timeout  time.Duration
	metrics  *metrics.Metrics
	log      logr.Logger
	mux      *http.ServeMux
}

// NewHandler returns the admin API over store, handing revoked holders to listener and
// running rounds on sweeps:
//
//	POST /internal/lease/admin/revoke      {"id" or "token", "tenant"?} → {"revoked": true, "holder"}
//	POST /internal/lease/admin/revoke-pod  {"namespace", "name"} → {"revoked": n, "holders"}
//	POST /internal/lease/admin/sweep                              → the round's counts
//	POST /internal/lease/admin/reconcile                          → the reconcile counts
//
// Answers are JSON; errors are {"error": CODE, "message"}: 400 INVALID_REQUEST (with
// "field"), 401 UNAUTHORIZED, 403 ADMIN_DISABLED (empty secret), 404 NOT_FOUND (no holder
// matched) or UNKNOWN_ROUTE, 405 METHOD_NOT_ALLOWED, 503 LEASE_UNAVAILABLE (store error),
// 500 INTERNAL. A 5xx that did part of the work carries it in "result": holders revoked
// before the failure were handed to the listener all the same.
//
// A nil listener only logs the revocations (no handler runs); store and sweeps are
// required.
func NewHandler(store Store, listener Listener, sweeps Sweeper, secret string, opts ...Option) http.Handler {
	h := &handler{
		store:    store,
		listener: listener,
		sweeper:  sweeps,
		enabled:  secret != "",
		secret:   sha256.Sum256([]byte(secret)),
		maxBody:  DefaultMaxBodyBytes,
		timeout:  DefaultTimeout,
		log:      logr.Discard(),
		mux:      http.NewServeMux(),
	}
	for _, o := range opts {
		o(h)
	}
	if h.metrics == nil {
		h.metrics = metrics.Default()
	}
	if h.maxBody <= 0 {
		h.maxBody = DefaultMaxBodyBytes
	}
	if h.timeout <= 0 {
		h.timeout = DefaultTimeout
	}
	routes := map[string]http.HandlerFunc{
		PathRevoke:    h.revoke,
		PathRevokePod: h.revokePod,
		PathSweep:     h.sweep,
		PathReconcile: h.reconcile,
	}
	for path, f := range routes {
		h.mux.HandleFunc(http.MethodPost+" "+path, f)
		h.mux.HandleFunc(path, methodNotAllowed)
	}
	h.mux.HandleFunc("/", unknownRoute)
	return h
}

// ServeHTTP checks that the API is enabled and the caller authorized before it routes, so
// that an unauthenticated caller learns nothing, not even which routes exist.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.enabled {
		httpjson.Write(w, http.StatusForbidden, httpjson.ErrorBody{Error: CodeDisabled,
			Message: "the admin API is disabled: the manager has no admin secret configured"})
		return
	}
	if msg, ok := h.authorize(r); !ok {
		w.Header().Set("WWW-Authenticate", `Bearer realm="lease-admin"`)
		httpjson.Write(w, http.StatusUnauthorized, httpjson.ErrorBody{Error: httpjson.CodeUnauthorized, Message: msg})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), h.timeout)
	defer cancel()
	h.mux.ServeHTTP(w, r.WithContext(ctx))
}

// authorize checks the bearer credential. Both sides are hashed before the constant-time
// comparison, so that not even the secret's length leaks through timing.
func (h *handler) authorize(r *http.Request) (string, bool) {
	header := r.Header.Get("Authorization")
	if header == "" {
		return "missing Authorization header; want Bearer <admin secret>", false
	}
	scheme, cred, _ := strings.Cut(header, " ")
	cred = strings.TrimLeft(cred, " ")
	if !strings.EqualFold(scheme, "Bearer") || cred == "" {
		return "Authorization header is not Bearer <admin secret>", false
	}
	sum := sha256.Sum256([]byte(cred))
	if subtle.ConstantTimeCompare(sum[:], h.secret[:]) != 1 {
		return "wrong admin secret", false
	}
	return "", true
}

func (h *handler) revoke(w http.ResponseWriter, r *http.Request) {
	var body revokeBody
	if err := h.decode(w, r, &body, true); err != nil {
		writeInvalid(w, err)
		return
	}
	if err := body.validate(); err != nil {
		writeInvalid(w, err)
		return
	}
	ctx := r.Context()
	id := body.holderID()
	holder, ok, err := h.store.RevokeByID(ctx, id, body.Tenant)
	if ok {
		// Deleted is revoked: the handler must run even if returning the levels failed.
		h.revoked(ctx, r, []lease.Holder{holder})
	}
	if err != nil {
		var partial any
		if ok {
			partial = opsview.RevokeResult{Revoked: true, Holder: opsview.HolderViewOf(holder)}
		}
		h.fail(w, r, err, partial, "revoking holder %s", id)
		return
	}
	if !ok {
		msg := "no holder " + id
		if body.Tenant != "" {
			msg += " in tenant " + body.Tenant
		}
		httpjson.Write(w, http.StatusNotFound, httpjson.ErrorBody{Error: httpjson.CodeNotFound, Message: msg + " (released, reaped or revoked already?)"})
		return
	}
	httpjson.Write(w, http.StatusOK, opsview.RevokeResult{Revoked: true, Holder: opsview.HolderViewOf(holder)})
}

func (h *handler) revokePod(w http.ResponseWriter, r *http.Request) {
	var body revokePodBody
	if err := h.decode(w, r, &body, true); err != nil {
		writeInvalid(w, err)
		return
	}
	if err := body.validate(); err != nil {
		writeInvalid(w, err)
		return
	}
	ctx := r.Context()
	holders, err := h.store.RevokePod(ctx, body.Namespace, body.Name)
	h.revoked(ctx, r, holders)
	res := opsview.RevokePodResult{Revoked: len(holders), Holders: opsview.HolderViews(holders)}
	if err != nil {
		h.fail(w, r, err, res, "revoking the holders of pod %s/%s", body.Namespace, body.Name)
		return
	}
	h.audit(r).Info("Operator revoked the holders of a pod", "pod", body.Namespace+"/"+body.Name, "holders", len(holders))
	httpjson.Write(w, http.StatusOK, res)
}

func (h *handler) sweep(w http.ResponseWriter, r *http.Request) {
	if err := h.decode(w, r, &emptyBody{}, false); err != nil {
		writeInvalid(w, err)
		return
	}
	// The sweeper dispatches (and so counts) what it reaps itself.
	res, err := h.sweeper.Sweep(r.Context())
	view := sweepView(res)
	if err != nil {
		h.fail(w, r, err, view, "sweeping")
		return
	}
	h.audit(r).Info("Operator ran a sweep", "idle", res.Idle, "pod", res.Pod,
		"corrected", res.Reconcile.Corrected, "repaired", res.Reconcile.Repaired, "deleted", res.Reconcile.Deleted)
	httpjson.Write(w, http.StatusOK, view)
}

func (h *handler) reconcile(w http.ResponseWriter, r *http.Request) {
	if err := h.decode(w, r, &emptyBody{}, false); err != nil {
		writeInvalid(w, err)
		return
	}
	res, err := h.store.Reconcile(r.Context())
	// As the sweeper counts it: corrected and recreated counters both had a wrong count.
	if fixed := res.Corrected; fixed > 0 {
		h.metrics.Reconcile.WithLabelValues(metrics.ReconcileCorrected).Add(float64(fixed))
	}
	view := reconcileView(res)
	if err != nil {
		h.fail(w, r, err, view, "reconciling")
		return
	}
	h.audit(r).Info("Operator ran a reconcile", "corrected", res.Corrected, "repaired", res.Repaired,
		"deleted", res.Deleted, "skipped", res.Skipped)
	httpjson.Write(w, http.StatusOK, view)
}

// revoked logs and hands revoked holders to the listener. The listener only queues, and
// its work outlives the request: it gets the request's values without its cancellation.
func (h *handler) revoked(ctx context.Context, r *http.Request, holders []lease.Holder) {
	if len(holders) == 0 {
		return
	}
	log := h.audit(r)
	for _, hd := range holders {
		log.Info("Operator revoked a lease", "holder", hd.ID, "tenant", hd.Tenant, "resource", hd.Resource,
			"type", hd.Type, "pod", hd.Pod.String(), "podBound", hd.PodBound)
	}
	if h.listener == nil {
		log.Info("No revocation listener: handlers do not run", "holders", len(holders))
		return
	}
	h.listener.Revoked(context.WithoutCancel(ctx), ReasonRevoke, holders)
}

func (h *handler) audit(r *http.Request) logr.Logger {
	return h.log.WithValues("route", r.URL.Path, "remote", r.RemoteAddr)
}
