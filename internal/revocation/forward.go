package revocation

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/settings"
)

// ReceiverPath is where the agent serves forwarded revocations.
const ReceiverPath = "/internal/lease/revoked"

// SecretHeader carries the shared secret of forwarded revocations (see NewReceiver).
const SecretHeader = "X-Lease-Secret"

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
func MessageFor(r Revocation) Message {
	return Message{
		Token: r.Token, Type: r.Type, Resource: r.Resource, LeaseName: r.LeaseName, HolderRef: r.HolderRef,
		Reason: r.Reason, Payload: r.Payload, PodBound: r.PodBound,
		Pod: MessagePod{Namespace: r.Pod.Namespace, Name: r.Pod.Name, UID: r.Pod.UID},
	}
}

// Revocation converts the message to the revocation a handler sees at site.
func (m Message) Revocation(site Site) Revocation {
	return Revocation{
		Token: m.Token, Type: m.Type, Resource: m.Resource, LeaseName: m.LeaseName, HolderRef: m.HolderRef,
		Reason: m.Reason, Payload: m.Payload, PodBound: m.PodBound,
		Pod:  lease.PodRef{Namespace: m.Pod.Namespace, Name: m.Pod.Name, UID: m.Pod.UID},
		Site: site,
	}
}

// Forwarder delivers a revocation to the agent of a live holder pod at ip. Any error counts
// as "unreachable": the dispatcher then takes the dead path.
type Forwarder interface {
	Forward(ctx context.Context, ip string, msg Message) error
}

// HTTPForwarder POSTs the message to http://<ip>:<Port>/internal/lease/revoked.
type HTTPForwarder struct {
	client *http.Client
	port   int
	secret string
}

var _ Forwarder = (*HTTPForwarder)(nil)

// NewHTTPForwarder returns a forwarder to agents on port (0: DefaultAgentPort) that sends
// secret in the X-Lease-Secret header when it is not empty. client nil: a client with a 5 s
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

// Forward POSTs msg to the agent at ip; only a 2xx answer is a delivery.
func (f *HTTPForwarder) Forward(ctx context.Context, ip string, msg Message) error {
	body, err := json.Marshal(msg)
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
		req.Header.Set(SecretHeader, f.secret)
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
