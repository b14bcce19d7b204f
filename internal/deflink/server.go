package deflink

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/go-logr/logr"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// Versions numbers the manager's view of definitions and tenancy: Bump on every change
// (a resolver invalidation, a namespace's tenant), and the agents' long-polls answer. A
// version is this process's random ID and a counter, so that an agent that reaches another
// replica (or a restarted manager) sees a new version and drops its cache: a spurious
// change costs one re-resolution, a missed one would keep a stale cap.
type Versions struct {
	id string

	mu      sync.Mutex
	n       uint64
	changed chan struct{} // closed and replaced by Bump
}

// NewVersions starts at version 1 with a random process ID.
func NewVersions() *Versions {
	b := make([]byte, 6)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return &Versions{id: hex.EncodeToString(b), n: 1, changed: make(chan struct{})}
}

// Bump records a change and wakes every waiting long-poll. It never blocks.
func (v *Versions) Bump() {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.n++
	close(v.changed)
	v.changed = make(chan struct{})
}

// Current returns the version and a channel closed at the next Bump.
func (v *Versions) Current() (string, <-chan struct{}) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.id + "-" + strconv.FormatUint(v.n, 10), v.changed
}

// Resolver is what the manager resolves with: *definition.Resolver.
type Resolver interface {
	Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error)
}

var _ Resolver = (*definition.Resolver)(nil)

// DefaultHold is how long a watch waits for a change before it answers the same version.
// Well below the admission server's write timeout.
const DefaultHold = 20 * time.Second

// Handler serves ResolvePath and WatchPath to the agents.
type Handler struct {
	resolver Resolver
	tenants  tenancy.Map
	auth     *agentauth.Verifier
	versions *Versions
	hold     time.Duration
	log      logr.Logger
}

// HandlerOption configures a Handler.
type HandlerOption func(*Handler)

// WithHold sets how long a watch waits for a change (default DefaultHold).
func WithHold(d time.Duration) HandlerOption { return func(h *Handler) { h.hold = d } }

// WithLogger sets the logger of resolution failures.
func WithLogger(l logr.Logger) HandlerOption { return func(h *Handler) { h.log = l } }

// NewHandler serves resolver's definitions and tenants' tenancy to the agents auth accepts:
// pods whose requests are signed with their namespace's agent key (agentauth).
func NewHandler(resolver Resolver, tenants tenancy.Map, auth *agentauth.Verifier, versions *Versions, opts ...HandlerOption) *Handler {
	h := &Handler{resolver: resolver, tenants: tenants, auth: auth, versions: versions, hold: DefaultHold, log: logr.Discard()}
	for _, o := range opts {
		o(h)
	}
	return h
}

// ServeHTTP answers one agent's request.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != ResolvePath && r.URL.Path != WatchPath {
		httpjson.WriteError(w, http.StatusNotFound, httpjson.CodeUnknownRoute, "no route "+r.URL.Path)
		return
	}
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed, "only POST is allowed")
		return
	}
	pod, body, ok := h.auth.Authenticate(w, r)
	if !ok {
		return
	}
	tenant, labelled := h.tenants.TenantOf(pod.Namespace)
	if r.URL.Path == WatchPath {
		h.watch(w, r, body, pod, tenant, labelled)
		return
	}
	h.resolve(w, r, body, pod, tenant, labelled)
}

func (h *Handler) watch(w http.ResponseWriter, r *http.Request, body []byte, pod lease.PodRef, tenant string, labelled bool) {
	var req WatchRequest
	if err := json.Unmarshal(body, &req); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalid, "body: "+err.Error())
		return
	}
	version, changed := h.versions.Current()
	if version == req.Version {
		timer := time.NewTimer(h.hold)
		defer timer.Stop()
		select {
		case <-changed:
		case <-timer.C:
		case <-r.Context().Done():
			return
		}
		version, _ = h.versions.Current()
		// The tenancy may be what changed.
		tenant, labelled = h.tenants.TenantOf(pod.Namespace)
	}
	httpjson.Write(w, http.StatusOK, WatchAnswer{Version: version, Tenant: tenant, Labelled: labelled,
		SystemNamespace: h.tenants.SystemNamespace()})
}

func (h *Handler) resolve(w http.ResponseWriter, r *http.Request, body []byte, pod lease.PodRef, tenant string, labelled bool) {
	var req ResolveRequest
	if err := json.Unmarshal(body, &req); err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalid, "body: "+err.Error())
		return
	}
	// A pod acts only for its own tenant (docs/tenancy.md), and so does its agent.
	if !labelled || req.Tenant != tenant {
		httpjson.Write(w, http.StatusForbidden, httpjson.ErrorBody{Error: httpjson.CodeTenantForbidden,
			Message:         fmt.Sprintf("pod %s may ask only for the definitions of its namespace's tenant, not of %q", pod, req.Tenant),
			CallerNamespace: pod.Namespace, CallerTenant: tenant})
		return
	}
	version, _ := h.versions.Current()
	d, err := h.resolver.Resolve(r.Context(), req.Tenant, req.Project, req.Name)
	ans := ResolveAnswer{Version: version}
	var (
		invalid     *lease.InvalidError
		unavailable *definition.UnavailableError
	)
	switch {
	case err == nil:
		ans.Definition = WireDefinition(d)
	case errors.As(err, &unavailable): // first: a broken document's cause may be an InvalidError
		ans.Unavailable = unavailability(unavailable)
	case errors.As(err, &invalid):
		ans.Invalid = &InvalidAnswer{Field: invalid.Field, Detail: invalid.Detail}
	default:
		h.log.Error(err, "Resolving for an agent failed", "pod", pod.String(), "lease", req.Name)
		ans.Unavailable = &Unavailability{Source: "manager", Message: "resolving failed; see the manager's log"}
	}
	httpjson.Write(w, http.StatusOK, ans)
}
