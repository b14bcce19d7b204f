// Package agentauth is the one way the manager authenticates a lease agent's request to its
// admission port (/internal/lease/definitions/…, /internal/lease/sweep, /internal/lease/reclaim;
// docs/security.md, "Agents ask the manager"), and the one way an agent signs one.
//
// Two checks make a request an agent's: the calling pod is the pod at the request's source
// address (the manager's pod informer, as on the admission API), and the request carries
// SignatureHeader, an HMAC of its path and body under the agent key of that pod's namespace
// (agentlink.AgentKey), which the webhook gives only to the agents it injects: an app
// container shares its pod's address, not its agent's key. A caller that is no pod is
// refused whatever the manager's development setting --allow-non-pod-callers says: that
// setting is the admission API's (tenancy.Binder), and nothing here reads it.
package agentauth

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
)

// SignatureHeader carries the hex HMAC-SHA256, under the caller namespace's agent key, of
// the request's path and body (Sign).
const SignatureHeader = "X-Lease-Agent-Signature"

// MaxBodyBytes bounds the body of an agent's request: a lease reference, a holder ID or a
// version. The body is read before it is verified, so the bound holds for anybody.
const MaxBodyBytes = 4 << 10

// domain starts every signed message. It keeps a signature from ever verifying as a forwarded
// revocation's (agentlink signs the bare JSON body with the same key: a JSON body starts with
// '{', a signed message here never does), and the path after it keeps one request from
// standing for another. The bytes are those deflink signed with before this package took its
// check over, so that agents injected earlier still verify during a rolling upgrade.
const domain = "lease-definitions\x00"

// Sign returns the SignatureHeader value of a request to path with body under key.
func Sign(key, path string, body []byte) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(domain + path + "\x00"))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// NewRequest returns a POST of the JSON body to baseURL+path, signed with key.
func NewRequest(ctx context.Context, key, baseURL, path string, body []byte) (*http.Request, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, baseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(SignatureHeader, Sign(key, path, body))
	return req, nil
}

// HTTPClient returns the agent's client to the manager: its connections leave from sourceIP
// when it is set. Only where several simulated pods share one host (make run, the e2e and
// robustness suites: pods on 127.0.0.x) does that matter; in a pod the pod's IP is the source
// anyway. It sets no overall timeout: each call bounds itself with its context.
func HTTPClient(sourceIP string) *http.Client {
	if sourceIP == "" {
		return &http.Client{}
	}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(sourceIP)}, Timeout: 5 * time.Second}
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.DialContext = d.DialContext
	return &http.Client{Transport: t}
}

// PodIdentity returns the pod that sent r, found by its source address: the zero PodRef when
// the caller is no pod, an error satisfying lease.ErrUnavailable when that cannot be decided
// now (liveness.ErrLookupLimited among them).
type PodIdentity func(r *http.Request) (lease.PodRef, error)

// Verifier checks agents' requests on the manager.
type Verifier struct {
	identify PodIdentity
	key      func(namespace string) string
	log      logr.Logger
}

// Option configures a Verifier.
type Option func(*Verifier)

// WithLogger sets the logger of the failures to identify a caller (default: discard).
func WithLogger(l logr.Logger) Option { return func(v *Verifier) { v.log = l } }

// NewVerifier accepts requests from the pods identify finds, signed with key(their
// namespace) (agentlink.AgentKey over the manager's internal secret). A key of "" refuses
// every request of that namespace.
func NewVerifier(identify PodIdentity, key func(namespace string) string, opts ...Option) *Verifier {
	v := &Verifier{identify: identify, key: key, log: logr.Discard()}
	for _, o := range opts {
		o(v)
	}
	return v
}

// Authenticate reads the body (at most MaxBodyBytes) and returns the calling pod and the body
// when the caller is a pod and the request is signed with the key of that pod's namespace.
// Otherwise it has answered and returns false: 400 for a body over the bound, 403
// TENANT_FORBIDDEN for a caller that is no pod, 401 UNAUTHORIZED for a missing or wrong
// signature, 503 LEASE_UNAVAILABLE when the caller cannot be identified now. The caller
// checks the method first.
func (v *Verifier) Authenticate(w http.ResponseWriter, r *http.Request) (lease.PodRef, []byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxBodyBytes))
	if err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalid, fmt.Sprintf("body: at most %d bytes", MaxBodyBytes))
		return lease.PodRef{}, nil, false
	}
	pod, ok := v.Caller(w, r)
	if !ok {
		return lease.PodRef{}, nil, false
	}
	key := v.key(pod.Namespace)
	if key == "" || !hmac.Equal([]byte(r.Header.Get(SignatureHeader)), []byte(Sign(key, r.URL.Path, body))) {
		httpjson.WriteError(w, http.StatusUnauthorized, httpjson.CodeUnauthorized,
			"missing or wrong "+SignatureHeader+" for an agent of namespace "+pod.Namespace)
		return lease.PodRef{}, nil, false
	}
	return pod, body, true
}

// Caller returns the pod at the request's source address; otherwise it has answered (403 for
// a caller that is no pod, 503 when that cannot be decided now) and returns false. It reads
// no body and checks no signature: Authenticate does both, and agentlink's receiver, whose
// messages are signed otherwise, uses Caller alone.
func (v *Verifier) Caller(w http.ResponseWriter, r *http.Request) (lease.PodRef, bool) {
	pod, err := v.identify(r)
	switch {
	case errors.Is(err, liveness.ErrLookupLimited):
		// Counted, and logged once a second, by the pod watcher: no line per refused caller.
		w.Header().Set("Retry-After", "1")
		httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.CodeUnavailable,
			"the calling pod cannot be identified now: "+liveness.ErrLookupLimited.Error())
		return lease.PodRef{}, false
	case errors.Is(err, lease.ErrUnavailable):
		v.log.Error(err, "Identifying an agent failed", "addr", r.RemoteAddr, "path", r.URL.Path)
		httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.CodeUnavailable, "the calling pod cannot be identified now")
		return lease.PodRef{}, false
	case err != nil || pod.Name == "":
		httpjson.Write(w, http.StatusForbidden, httpjson.ErrorBody{Error: httpjson.CodeTenantForbidden,
			Message: r.URL.Path + " answers only the agents of pods: " + r.RemoteAddr + " is no pod"})
		return lease.PodRef{}, false
	}
	return pod, true
}

// From returns a check that lets through only the pods of namespace; otherwise it has
// answered as Caller does, or 403 for a pod of another namespace. agentlink's receiver on the
// manager takes it (agentlink.WithSenders): there the senders are the manager's replicas.
func (v *Verifier) From(namespace string) func(http.ResponseWriter, *http.Request) bool {
	return func(w http.ResponseWriter, r *http.Request) bool {
		pod, ok := v.Caller(w, r)
		if ok && (namespace == "" || pod.Namespace != namespace) {
			httpjson.Write(w, http.StatusForbidden, httpjson.ErrorBody{Error: httpjson.CodeTenantForbidden,
				Message: r.URL.Path + " answers only pods of namespace " + namespace, CallerNamespace: pod.Namespace})
			return false
		}
		return ok
	}
}
