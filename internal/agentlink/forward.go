// Package agentlink is both ends of the manager-to-agent revocation protocol: the
// forwarder a reaper uses to hand a revoked holder to the agent of its live pod, and the
// receiver the agent mounts at /internal/lease/revoked, with the message between them.
package agentlink

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/settings"
)

// ReceiverPath is where the agent serves forwarded revocations.
const ReceiverPath = "/internal/lease/revoked"

// SignatureHeader carries the hex HMAC-SHA256 of the request body under the holder
// namespace's agent key (AgentKey). The key itself never travels with a forward: a forward
// that reaches the wrong listener (a reused IP, a pod without an agent) hands it nothing
// it could replay elsewhere.
const SignatureHeader = "X-Lease-Signature"

// AgentKey derives the key the agents of namespace verify forwards with from the manager's
// internal secret ("" when the secret is empty: no signing). One key per namespace: an
// agent's key, readable by whoever can read pods there, only forges revocations for pods of
// that namespace, which the receiver's holder check makes harmless anyway.
func AgentKey(secret, namespace string) string {
	if secret == "" {
		return ""
	}
	m := hmac.New(sha256.New, []byte(secret))
	m.Write([]byte("lease-agent-key\x00" + namespace))
	return hex.EncodeToString(m.Sum(nil))
}

// sign returns the SignatureHeader value of body under key.
func sign(key string, body []byte) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// DefaultAgentPort is the lease agent's internal port in a holder pod, where it receives
// forwarded revocations (its app API on 127.0.0.1:8090 is not reachable from other pods).
const DefaultAgentPort = settings.AgentInternalPort

// maxMessageBytes bounds a forwarded revocation body.
const maxMessageBytes = 64 << 10

// Message is the JSON body of POST /internal/lease/revoked.
type Message struct {
	Token     string            `json:"token"`
	Type      string            `json:"type"`
	Resource  string            `json:"resource"`
	LeaseName string            `json:"leaseName,omitempty"`
	HolderRef string            `json:"holderRef,omitempty"`
	Reason    string            `json:"reason"`
	Payload   map[string]string `json:"payload,omitempty"`
	PodBound  bool              `json:"podBound"`
	Pod       MessagePod        `json:"pod"`
}

// MessagePod is the holder's pod in a Message.
type MessagePod struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	UID       string `json:"uid,omitempty"`
}

// MessageFor builds the message of a revocation.
func MessageFor(r revocation.Revocation) Message {
	return Message{
		Token: r.Token, Type: r.Type, Resource: r.Resource, LeaseName: r.LeaseName, HolderRef: r.HolderRef,
		Reason: r.Reason, Payload: r.Payload, PodBound: r.PodBound,
		Pod: MessagePod{Namespace: r.Pod.Namespace, Name: r.Pod.Name, UID: r.Pod.UID},
	}
}

// Revocation converts the message to the revocation a handler sees at site.
func (m Message) Revocation(site revocation.Site) revocation.Revocation {
	return revocation.Revocation{
		Token: m.Token, HolderID: lease.HolderID(m.Token), Type: m.Type, Resource: m.Resource, LeaseName: m.LeaseName,
		HolderRef: m.HolderRef, Reason: m.Reason, Payload: m.Payload, PodBound: m.PodBound,
		Pod:  lease.PodRef{Namespace: m.Pod.Namespace, Name: m.Pod.Name, UID: m.Pod.UID},
		Site: site,
	}
}

// HTTPForwarder POSTs the message to http://<ip>:<Port>/internal/lease/revoked.
type HTTPForwarder struct {
	client *http.Client
	port   int
	secret string
}

var _ revocation.Forwarder = (*HTTPForwarder)(nil)

// NewHTTPForwarder returns a forwarder to agents on port (0: DefaultAgentPort) that signs
// each message with the holder namespace's AgentKey(secret, namespace) when secret is not
// empty. client nil: a client with a 5 s
// timeout; a slow agent must not hold the dispatcher, and the dead path is the fallback.
func NewHTTPForwarder(client *http.Client, port int, secret string) *HTTPForwarder {
	if client == nil {
		client = &http.Client{
			Timeout:       5 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	if port == 0 {
		port = DefaultAgentPort
	}
	return &HTTPForwarder{client: client, port: port, secret: secret}
}

// Forward POSTs the message of r to the agent at ip; only a 2xx answer is a delivery.
func (f *HTTPForwarder) Forward(ctx context.Context, ip string, r revocation.Revocation) error {
	body, err := json.Marshal(MessageFor(r))
	if err != nil {
		return fmt.Errorf("encoding revocation: %w", err)
	}
	u := "http://" + net.JoinHostPort(ip, strconv.Itoa(f.port)) + ReceiverPath
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, bytes.NewReader(body))
	if err != nil {
		return fmt.Errorf("building forward to %s: %w", u, err)
	}
	req.Header.Set("Content-Type", "application/json")
	if f.secret != "" {
		req.Header.Set(SignatureHeader, sign(AgentKey(f.secret, r.Pod.Namespace), body))
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("forwarding revocation to %s: %w", u, err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("forwarding revocation to %s: %s: %s", u, resp.Status, bytes.TrimSpace(b))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
	return nil
}
