package sweeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// RelayPath is the manager's endpoint where lease agents ask for the lazy idle sweep of the
// resource of one of their tenant's leases. The manager reaps and dispatches through its own
// matrix: an agent watches no pods and could not tell a live holder pod from a dead one.
//
// Only an agent may ask (agentauth: a pod, signed with its namespace's agent key), and it
// names a lease reference, not a resource: the manager resolves the reference for the tenant
// of the calling pod's namespace (an inline lease's resource is built from that tenant), so a
// pod sweeps, and learns the idle expiry of, only resources its own tenant's leases use. A
// reference that leads to no resource is answered as a resource with nothing to sweep, and
// costs no store read (docs/security.md, "The sweep relay").
const RelayPath = "/internal/lease/sweep"

// IdleStore is the part of the store the relay uses (*leasestore.Store).
type IdleStore interface {
	SweepIdle(ctx context.Context, resource string) (leasestore.IdleSweep, error)
}

// Authenticator accepts the requests of lease agents (*agentauth.Verifier): it returns the
// calling pod and the body, or answers itself.
type Authenticator interface {
	Authenticate(w http.ResponseWriter, r *http.Request) (lease.PodRef, []byte, bool)
}

// Tenants knows each namespace's tenant (tenancy.Map).
type Tenants interface {
	TenantOf(namespace string) (tenant string, ok bool)
}

// Resolver resolves a lease reference of a tenant (*definition.Resolver: from its cache and
// the informers' documents, never the store).
type Resolver interface {
	Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error)
}

var (
	_ IdleStore     = (*leasestore.Store)(nil)
	_ Authenticator = (*agentauth.Verifier)(nil)
	_ Resolver      = (*definition.Resolver)(nil)
)

// relayRequest names the lease reference of an acquisition that found its resource full.
type relayRequest struct {
	Project string `json:"project"`
	Lease   string `json:"lease"`
	// Inline: Lease names an inline definition of the project.
	Inline bool `json:"inline,omitempty"`
}

type relayResponse struct {
	Reaped int `json:"reaped"`
	// NextExpiryMs is when the next holder of the resource goes idle, from the sweep's read
	// (0: none, or no sweep ran).
	NextExpiryMs int64 `json:"nextExpiryMs,omitempty"`
}

// unavailableStore is the whole text of a 503 of the relays: the cause is in the log.
const unavailableStore = "the lease store is unavailable"

// RelayOption configures the relay handlers.
type RelayOption func(*relayConfig)

type relayConfig struct {
	clock    clock.PassiveClock
	interval time.Duration
	log      logr.Logger
}

// WithRelayClock sets the clock of the relays' gates (default the real clock).
func WithRelayClock(c clock.PassiveClock) RelayOption { return func(rc *relayConfig) { rc.clock = c } }

// WithSweepInterval sets how often one resource may be swept for the agents (default
// leasing.DefaultSweepInterval, an acquisition's own gate).
func WithSweepInterval(d time.Duration) RelayOption { return func(rc *relayConfig) { rc.interval = d } }

// WithRelayLogger sets the logger of the relays' store failures (default: discard).
func WithRelayLogger(l logr.Logger) RelayOption { return func(rc *relayConfig) { rc.log = l } }

func relayConfigOf(opts []RelayOption) relayConfig {
	rc := relayConfig{clock: clock.RealClock{}, interval: leasing.DefaultSweepInterval, log: logr.Discard()}
	for _, o := range opts {
		o(&rc)
	}
	return rc
}

// sweepRelay serves RelayPath.
type sweepRelay struct {
	store    IdleStore
	listener Listener
	auth     Authenticator
	tenants  Tenants
	resolver Resolver
	cfg      relayConfig
	gate     *gate // per resource
}

// RelayHandler serves RelayPath on the manager: for an agent that auth accepts, it resolves
// the named lease for the tenant of the agent's namespace (tenants, resolver), reaps the idle
// holders of its resource and hands them to listener (reason idle), at most once per sweep
// interval per resource. Answers: 200 {"reaped":N,"nextExpiryMs":M} ({"reaped":0} as well for
// a reference that leads to no resource, and for a resource swept within the interval); 400
// for a malformed request; 401, 403 and 503 from auth; 403 for a pod of a namespace of no
// tenant; 503 with a fixed text and a correlation id when the store fails (the cause in the
// log).
func RelayHandler(store IdleStore, listener Listener, auth Authenticator, tenants Tenants, resolver Resolver, opts ...RelayOption) http.Handler {
	cfg := relayConfigOf(opts)
	return &sweepRelay{store: store, listener: listener, auth: auth, tenants: tenants, resolver: resolver,
		cfg: cfg, gate: newGate(gateSize, cfg.interval)}
}

func (h *sweepRelay) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	var req relayRequest
	pod, ok := agentRequest(w, r, h.auth, &req)
	if !ok {
		return
	}
	tenant, ok := h.tenants.TenantOf(pod.Namespace)
	if !ok {
		httpjson.Write(w, http.StatusForbidden, httpjson.ErrorBody{Error: httpjson.CodeTenantForbidden,
			Message:         "pod " + pod.String() + " is in a namespace of no tenant: it holds no lease to sweep",
			CallerNamespace: pod.Namespace})
		return
	}
	resource, invalid := h.resourceOf(r.Context(), tenant, req)
	if invalid != nil {
		writeInvalid(w, invalid)
		return
	}
	var out relayResponse
	if resource != "" && h.gate.allow(resource, h.cfg.clock.Now()) {
		sw, err := h.store.SweepIdle(r.Context(), resource)
		if len(sw.Reaped) > 0 && h.listener != nil {
			h.listener.Revoked(context.WithoutCancel(r.Context()), metrics.ReapIdle, sw.Reaped)
		}
		if err != nil {
			id := lease.CorrelationID()
			h.cfg.log.Error(err, "Relayed idle sweep failed", "pod", pod.String(), "resource", resource,
				"reaped", len(sw.Reaped), "correlationId", id)
			httpjson.WriteUnavailable(w, unavailableStore, id)
			return
		}
		out = relayResponse{Reaped: len(sw.Reaped), NextExpiryMs: sw.NextExpiry.Milliseconds()}
	}
	httpjson.Write(w, http.StatusOK, out)
}

// resourceOf is the resource of req for tenant: "" when it leads to none, which the relay
// answers as a resource with nothing to sweep. A lease unknown to the tenant, one whose
// definition cannot be resolved now, and one that caps nothing all lead to none: the answer
// is the same whatever other tenants define.
func (h *sweepRelay) resourceOf(ctx context.Context, tenant string, req relayRequest) (string, *lease.InvalidError) {
	var invalid *lease.InvalidError
	if err := definition.ValidateScope(tenant, req.Project); errors.As(err, &invalid) {
		return "", invalid
	}
	if !definition.ValidName(req.Lease) {
		return "", &lease.InvalidError{Field: "lease", Detail: fmt.Sprintf("%q is not a valid lease name", req.Lease)}
	}
	if req.Inline {
		return definition.InlineResource(tenant, req.Project, req.Lease), nil
	}
	d, err := h.resolver.Resolve(ctx, tenant, req.Project, req.Lease)
	if err != nil || d.NoOp() {
		return "", nil
	}
	return d.Resource, nil
}

// RelayReaper returns an idle reaper for the agent's admission service: it asks the manager
// at managerURL, signing with key (the agent key of the pod's namespace), to sweep the
// target's lease and returns how many holders the manager reaped (and dispatched), so that a
// busy acquisition retries at once. When the manager cannot be asked, or does not answer 200,
// it falls back to reaping with local, returning the holders for the agent's own dispatcher.
// client's connections must leave from the pod's address (agentauth.HTTPClient).
func RelayReaper(client *http.Client, managerURL, key string, local IdleStore) leasing.IdleReaper {
	if client == nil {
		client = &http.Client{}
	}
	base := strings.TrimRight(managerURL, "/")
	return func(ctx context.Context, target leasing.SweepTarget) (leasestore.IdleSweep, int, error) {
		rctx, cancel := context.WithTimeout(ctx, relayTimeout)
		resp, err := postSigned(rctx, client, key, base, RelayPath,
			relayRequest{Project: target.Project, Lease: target.Lease, Inline: target.Inline})
		if err == nil {
			var out relayResponse
			derr := json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&out)
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
			_ = resp.Body.Close()
			cancel()
			switch {
			case resp.StatusCode == http.StatusOK && derr == nil:
				next := time.Duration(max(out.NextExpiryMs, 0)) * time.Millisecond
				return leasestore.IdleSweep{NextExpiry: next}, max(out.Reaped, 0), nil
			case resp.StatusCode == http.StatusOK:
				// Swept, but the count was lost: no retry at once, the wait loop polls on.
				return leasestore.IdleSweep{}, 0, nil
			}
			err = fmt.Errorf("manager answered %s", resp.Status)
		}
		cancel()
		sw, lerr := local.SweepIdle(ctx, target.Resource)
		return sw, 0, errors.Join(fmt.Errorf("asking the manager to sweep %s (swept here instead): %w", target.Resource, err), lerr)
	}
}

// relayTimeout bounds one relayed sweep asked of the manager.
const relayTimeout = 5 * time.Second

// agentRequest reads a relay's request: a POST that auth accepts, whose JSON body decodes
// into dst. It returns the calling pod; otherwise it has answered (405, auth's 401, 403 or 503,
// or 400 naming the field at fault) and returns false.
func agentRequest(w http.ResponseWriter, r *http.Request, auth Authenticator, dst any) (lease.PodRef, bool) {
	if !postOnly(w, r) {
		return lease.PodRef{}, false
	}
	pod, body, ok := auth.Authenticate(w, r)
	if !ok {
		return lease.PodRef{}, false
	}
	if fe := httpjson.DecodeBytes(body, dst); fe != nil {
		writeInvalid(w, fe)
		return lease.PodRef{}, false
	}
	return pod, true
}

// postOnly answers 405 for any method but POST and returns false.
func postOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed, "only POST is allowed")
		return false
	}
	return true
}

// writeInvalid answers 400 INVALID_REQUEST naming the field at fault.
func writeInvalid(w http.ResponseWriter, fe *lease.InvalidError) {
	httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Error: httpjson.CodeInvalid, Message: fe.Error(), Field: fe.Field})
}

// postSigned posts in as JSON to base+path, signed with key (agentauth).
func postSigned(ctx context.Context, client *http.Client, key, base, path string, in any) (*http.Response, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	req, err := agentauth.NewRequest(ctx, key, base, path, body)
	if err != nil {
		return nil, err
	}
	return client.Do(req)
}
