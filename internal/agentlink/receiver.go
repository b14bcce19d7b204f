package agentlink

import (
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/go-logr/logr"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/revocation"
)

// Error codes of the receiver's own refusals; the common ones are httpjson's.
const (
	ErrCodeNotHolderPod = "NOT_HOLDER_POD"
	ErrCodeHandler      = "HANDLER_FAILED"
	ErrCodeStillHeld    = "STILL_HELD"
)

// validReasons are the reasons a revocation can carry.
var validReasons = map[string]bool{metrics.ReapIdle: true, metrics.ReapPod: true, metrics.ReapRevoke: true, metrics.ReapReclaim: true}

// Receiver is the agent's endpoint for revocations forwarded by a reaper:
// POST /internal/lease/revoked with a Message. It runs the type's handler locally (in the
// holder pod: the handlers publish to the notify hub, which ends the app's long-poll).
//
// Answers: 200 {"outcome":"delivered"}; 400 INVALID_REQUEST (malformed JSON, a missing
// field, a token not of a token's form, an unknown reason or type); 401 UNAUTHORIZED (an
// agent key is configured and the X-Lease-Signature header is not the body's signature); 403
// or 503 from the senders' check (WithSenders); 405 for another method; 409 NOT_HOLDER_POD
// (the message names another pod: the IP was reused); 409 STILL_HELD; 500 HANDLER_FAILED;
// 503 LEASE_UNAVAILABLE (the store could not be read: a fixed text and a correlation id, the
// cause in the log). Any non-2xx makes the sender fall back to the dead path.
type Receiver struct {
	self     lease.PodRef
	handlers *revocation.Registry
	key      string
	timeout  time.Duration
	log      logr.Logger
	held     HeldFunc
	senders  func(http.ResponseWriter, *http.Request) bool
}

var _ http.Handler = (*Receiver)(nil)

// HeldFunc reports whether the holder of token still exists in the store.
type HeldFunc func(ctx context.Context, token string) (bool, error)

// WithHolderCheck makes the receiver confirm, before it runs a handler, that the holder is
// really gone from the store: a forged revocation of a lease that is still held is refused
// with 409 STILL_HELD (a store error answers 503). The agent's internal port is reachable
// from the pod network, so this is what makes an unauthenticated POST harmless.
func WithHolderCheck(f HeldFunc) ReceiverOption { return func(r *Receiver) { r.held = f } }

// ReceiverOption configures a Receiver.
type ReceiverOption func(*Receiver)

// WithAgentKey requires the X-Lease-Signature header to be the body's HMAC under key, the
// namespace's AgentKey. Without a key (or with an empty one) every message is refused:
// unsigned revocations are never accepted (docs/security.md). The agent port is reachable from the whole pod
// network; the signature (with the holder check) keeps anybody there from making an app
// believe its lease was revoked.
func WithAgentKey(key string) ReceiverOption { return func(r *Receiver) { r.key = key } }

// WithSenders lets through, after the signature, only the requests check passes; check has
// answered the others. The manager passes agentauth.Verifier.From(its namespace): on its
// admission port the only senders are its own replicas, pods it can identify by address,
// while a pod of a tenant's namespace, whose agent key signs that namespace's forwards only,
// has no reason to post there. An agent identifies no pods and takes no check.
func WithSenders(check func(http.ResponseWriter, *http.Request) bool) ReceiverOption {
	return func(r *Receiver) { r.senders = check }
}

// WithReceiverLogger sets the logger (default: discard).
func WithReceiverLogger(l logr.Logger) ReceiverOption { return func(r *Receiver) { r.log = l } }

// WithHandlerTimeout bounds the local handler (default 10 s).
func WithHandlerTimeout(d time.Duration) ReceiverOption { return func(r *Receiver) { r.timeout = d } }

// NewReceiver returns the endpoint for the pod self (the agent's own identity; a zero self
// skips the pod check) with the handlers of registry.
func NewReceiver(self lease.PodRef, registry *revocation.Registry, opts ...ReceiverOption) *Receiver {
	r := &Receiver{self: self, handlers: registry, timeout: 10 * time.Second, log: logr.Discard()}
	for _, o := range opts {
		o(r)
	}
	return r
}

// ServeHTTP handles one forwarded revocation.
func (rc *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed, "only POST is allowed")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxMessageBytes))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			err = fmt.Errorf("body larger than %d bytes", maxMessageBytes)
		}
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalid, err.Error())
		return
	}
	// No key means no way to tell a reaper from anybody on the pod network: refuse
	// everything (fail closed; the sender falls back to the dead path).
	if rc.key == "" || !hmac.Equal([]byte(req.Header.Get(SignatureHeader)), []byte(sign(rc.key, body))) {
		httpjson.WriteError(w, http.StatusUnauthorized, httpjson.CodeUnauthorized, "missing or wrong "+SignatureHeader)
		return
	}
	// After the signature, which costs nothing: an unsigned flood makes no pod lookups.
	if rc.senders != nil && !rc.senders(w, req) {
		return
	}
	msg, err := decodeMessage(body)
	if err != nil {
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalid, err.Error())
		return
	}
	if rc.self.Name != "" {
		pod := lease.PodRef{Namespace: msg.Pod.Namespace, Name: msg.Pod.Name, UID: msg.Pod.UID}
		if !liveness.IsSelf(pod, rc.self) {
			httpjson.WriteError(w, http.StatusConflict, ErrCodeNotHolderPod,
				fmt.Sprintf("this is pod %s, not the holder pod %s", rc.self, pod))
			return
		}
	}
	h, ok := rc.handlers.Handler(msg.Type)
	if !ok {
		httpjson.WriteError(w, http.StatusBadRequest, httpjson.CodeInvalid, fmt.Sprintf("type: no handler for lease type %q", msg.Type))
		return
	}
	log := rc.log.WithValues("holder", lease.HolderID(msg.Token), "type", msg.Type, "resource", msg.Resource, "reason", msg.Reason)
	ctx, cancel := req.Context(), context.CancelFunc(func() {})
	if rc.timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, rc.timeout)
	}
	defer cancel()
	if rc.held != nil {
		held, err := rc.held(ctx, msg.Token)
		switch {
		case err != nil:
			id := lease.CorrelationID()
			log.Error(err, "Reading the revoked holder from the store failed", "correlationId", id)
			httpjson.WriteUnavailable(w, "the lease store is unavailable", id)
			return
		case held:
			httpjson.WriteError(w, http.StatusConflict, ErrCodeStillHeld, "the lease "+lease.HolderID(msg.Token)+" is still held: nothing was revoked")
			return
		}
	}
	if err := h.OnRevoked(logr.NewContext(ctx, log), msg.Revocation(revocation.SiteHolderPod)); err != nil {
		log.Error(err, "Revocation handler failed")
		httpjson.WriteError(w, http.StatusInternalServerError, ErrCodeHandler, err.Error())
		return
	}
	log.Info("Lease revoked by a reaper, handler ran in the holder pod")
	w.Header().Set("Content-Type", "application/json")
	_, _ = io.WriteString(w, `{"outcome":"delivered"}`)
}

func decodeMessage(body []byte) (Message, error) {
	var msg Message
	if err := json.Unmarshal(body, &msg); err != nil {
		return msg, fmt.Errorf("malformed JSON: %w", err)
	}
	switch {
	case msg.Token == "":
		return msg, errors.New("token: required")
	case !lease.ValidToken(msg.Token):
		return msg, errors.New("token: not a lease token")
	case msg.Type == "":
		return msg, errors.New("type: required")
	case !validReasons[msg.Reason]:
		return msg, fmt.Errorf("reason: %q is not idle, pod, revoke or reclaim", msg.Reason)
	case msg.Pod.Name == "" || msg.Pod.Namespace == "":
		return msg, errors.New("pod: namespace and name required")
	}
	return msg, checkSizes(msg)
}

// Size limits of a message's fields: a signed message comes from a reaper, but the
// receiver bounds what it hands to handlers and the notify hub all the same.
const (
	maxTypeLen     = 63
	maxNameLen     = 253 // resource, lease name, pod namespace, name and UID
	maxHolderRef   = 512
	maxPayloadKeys = 32
	maxPayloadLen  = 4096 // one payload key or value
)

func checkSizes(msg Message) error {
	for _, f := range []struct {
		name string
		v    string
		max  int
	}{
		{"type", msg.Type, maxTypeLen}, {"resource", msg.Resource, maxNameLen}, {"leaseName", msg.LeaseName, maxNameLen},
		{"holderRef", msg.HolderRef, maxHolderRef}, {"pod.namespace", msg.Pod.Namespace, maxNameLen},
		{"pod.name", msg.Pod.Name, maxNameLen}, {"pod.uid", msg.Pod.UID, maxNameLen},
	} {
		if len(f.v) > f.max {
			return fmt.Errorf("%s: longer than %d bytes", f.name, f.max)
		}
	}
	if len(msg.Payload) > maxPayloadKeys {
		return fmt.Errorf("payload: more than %d keys", maxPayloadKeys)
	}
	for k, v := range msg.Payload {
		if len(k) > maxPayloadLen || len(v) > maxPayloadLen {
			return fmt.Errorf("payload: a key or value longer than %d bytes", maxPayloadLen)
		}
	}
	return nil
}
