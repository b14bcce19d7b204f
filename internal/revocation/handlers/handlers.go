// Package handlers holds the revocation handlers that ship with the operator (tex, mcp,
// notify) and what they need: the notify hub they publish to in the holder pod, and the
// Secret reads and HTTP client of the mcp session DELETE on a reaper.
package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
)

// The lease types whose handlers ship with the operator.
const (
	// TypeTex: a tex2pdf compile; podBound (the poll loop lives in the holder pod).
	TypeTex = "tex"
	// TypeMCP: an MCP session; podBound follows the transport (stdio: yes; HTTP: no, the
	// session lives in the remote server).
	TypeMCP = "mcp"
	// TypeNotify: a generic type whose only cleanup is telling the app in the holder pod.
	TypeNotify = "notify"
)

// Payload keys read by the mcp handler on a reaper.
const (
	// PayloadEndpoint is the MCP server's URL that the session was opened against.
	PayloadEndpoint = "endpoint"
	// PayloadSessionID is the session's Mcp-Session-Id.
	PayloadSessionID = "sessionId"
	// PayloadAuthSecret names the Secret with the credentials of the session's requests:
	// "name" or "namespace/name"; the namespace must be the holder pod's namespace.
	PayloadAuthSecret = "authSecret"
	// PayloadAuthSecretKey is the key in that Secret (default "token"); its value is sent
	// as "Authorization: Bearer <value>".
	PayloadAuthSecretKey = "authSecretKey"
)

// MCPAuthSecretLabel must be "true" on a Secret before the mcp handler reads it. The
// payload is written by the app, so without this opt-in any app could make the manager
// read any Secret of its namespace and send it to an endpoint of its choice.
const MCPAuthSecretLabel = "lease.vancetope.io/mcp-auth"

// DefaultAuthSecretKey is the Secret key used when the payload names none.
const DefaultAuthSecretKey = "token"

// Publisher delivers a revocation event to the waiters in this process (*notify.Hub).
type Publisher interface {
	Publish(ev notify.Event)
}

var _ Publisher = (*notify.Hub)(nil)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// SecretReader reads a Secret. Back it with an uncached reader (the manager's
// GetAPIReader()): a cached client would start an informer over every Secret in the
// cluster. RBAC: get on secrets.
type SecretReader interface {
	ReadSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error)
}

// ClientSecretReader is a SecretReader over a controller-runtime reader.
type ClientSecretReader struct {
	Reader client.Reader
}

var _ SecretReader = ClientSecretReader{}

// ReadSecret gets the Secret namespace/name.
func (c ClientSecretReader) ReadSecret(ctx context.Context, namespace, name string) (*corev1.Secret, error) {
	s := &corev1.Secret{}
	if err := c.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s); err != nil {
		return nil, fmt.Errorf("reading secret %s/%s: %w", namespace, name, err)
	}
	return s, nil
}

// NewDefaultRegistry returns a registry with the shipped handlers: tex, mcp and notify.
// hub is this process's notify hub (nil: nothing is published, e.g. a manager that serves
// no long-poll); secrets and httpClient serve the mcp session DELETE on a reaper (nil
// secrets: a payload naming an auth Secret fails; nil client: DefaultMCPClient()).
func NewDefaultRegistry(hub Publisher, secrets SecretReader, httpClient *http.Client) *revocation.Registry {
	r := revocation.NewRegistry()
	// The types are distinct constants: Register cannot fail here.
	_ = r.Register(TypeTex, TexHandler{Hub: hub})
	_ = r.Register(TypeMCP, &MCPHandler{Hub: hub, Secrets: secrets, Client: httpClient})
	_ = r.Register(TypeNotify, NotifyHandler{Hub: hub})
	return r
}

func publish(hub Publisher, r revocation.Revocation) {
	if hub == nil {
		return
	}
	hub.Publish(notify.Event{Token: r.Token, Reason: r.Reason, Type: r.Type, Resource: r.Resource})
}

// NotifyHandler is the generic handler: in the holder pod it publishes the revocation to
// the hub, ending the app's long-poll on the agent; on a reaper there is nothing to do.
type NotifyHandler struct {
	Hub Publisher
}

// OnRevoked publishes in the holder pod.
func (h NotifyHandler) OnRevoked(_ context.Context, r revocation.Revocation) error {
	if r.Site == revocation.SiteHolderPod {
		publish(h.Hub, r)
	}
	return nil
}

// TexHandler handles tex2pdf compiles (podBound: the poll state lives in the holder pod).
// In the holder pod it publishes to the hub, so the app's long-poll ends with the event and
// the app aborts its running poll loop (a revocation after the loop ended leaves nothing:
// nobody waits for that token any more). The remote job has no cancel endpoint and expires
// server-side, so on a reaper (a holder recorded as not podBound) nothing can be done.
type TexHandler struct {
	Hub Publisher
}

// OnRevoked publishes in the holder pod.
func (h TexHandler) OnRevoked(ctx context.Context, r revocation.Revocation) error {
	if r.Site == revocation.SiteHolderPod {
		publish(h.Hub, r)
		return nil
	}
	logr.FromContextOrDiscard(ctx).V(1).Info("Tex job cannot be cancelled, it expires server-side", "token", r.Token)
	return nil
}

// MCPHandler handles MCP sessions. In the holder pod it publishes to the hub: the app
// compares the token with its pooled session's and closes that session (a late revocation
// for a session re-opened since then closes nothing). On a reaper (dead holder pod, HTTP
// transport) it terminates the remote session: DELETE <payload endpoint> with
// Mcp-Session-Id: <payload sessionId>, authenticated with the Secret the payload names.
type MCPHandler struct {
	Hub     Publisher
	Secrets SecretReader
	// Client sends the DELETE (nil: DefaultMCPClient()).
	Client *http.Client
}

// DefaultMCPClient returns the client for session DELETEs: a 10 s timeout and no redirects
// (a redirect must not carry the credentials elsewhere).
func DefaultMCPClient() *http.Client {
	return &http.Client{
		Timeout:       10 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

// OnRevoked publishes in the holder pod and deletes the remote session on a reaper.
func (h *MCPHandler) OnRevoked(ctx context.Context, r revocation.Revocation) error {
	if r.Site == revocation.SiteHolderPod {
		publish(h.Hub, r)
		return nil
	}
	return h.deleteSession(ctx, r)
}

func (h *MCPHandler) deleteSession(ctx context.Context, r revocation.Revocation) error {
	log := logr.FromContextOrDiscard(ctx)
	endpoint, session := r.Payload[PayloadEndpoint], r.Payload[PayloadSessionID]
	if endpoint == "" || session == "" {
		// Revoked before the payload update: the session was never initialised.
		log.V(1).Info("MCP payload has no endpoint or session, nothing to delete", "token", r.Token)
		return nil
	}
	u, err := url.Parse(endpoint)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("mcp payload endpoint %q is not an http(s) URL", endpoint)
	}
	auth, err := h.authorization(ctx, r)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, u.String(), nil)
	if err != nil {
		return fmt.Errorf("building session DELETE: %w", err)
	}
	req.Header.Set("Mcp-Session-Id", session)
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	c := h.Client
	if c == nil {
		c = DefaultMCPClient()
	}
	resp, err := c.Do(req)
	if err != nil {
		return fmt.Errorf("deleting MCP session at %s: %w", u.Redacted(), err)
	}
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
	case resp.StatusCode == http.StatusNotFound:
		// The session is already gone (expired, or deleted by someone else).
	case resp.StatusCode == http.StatusMethodNotAllowed:
		// The server does not let clients terminate sessions (allowed by the MCP spec).
	default:
		return fmt.Errorf("deleting MCP session at %s: %s", u.Redacted(), resp.Status)
	}
	log.Info("Deleted MCP session of dead holder pod", "token", r.Token, "endpoint", u.Redacted(), "status", resp.StatusCode)
	return nil
}

// authorization returns the Authorization header value from the payload's auth Secret, ""
// when the payload names none.
func (h *MCPHandler) authorization(ctx context.Context, r revocation.Revocation) (string, error) {
	ref := r.Payload[PayloadAuthSecret]
	if ref == "" {
		return "", nil
	}
	ns, name, found := strings.Cut(ref, "/")
	if !found {
		ns, name = r.Pod.Namespace, ref
	}
	switch {
	case r.Pod.Namespace == "":
		return "", fmt.Errorf("mcp auth secret %q: the holder records no pod namespace", ref)
	case ns != r.Pod.Namespace:
		return "", fmt.Errorf("mcp auth secret %q: not in the holder pod's namespace %s", ref, r.Pod.Namespace)
	case name == "":
		return "", fmt.Errorf("mcp auth secret %q: empty name", ref)
	case h.Secrets == nil:
		return "", errors.New("mcp auth secret named, but this process has no secret reader")
	}
	s, err := h.Secrets.ReadSecret(ctx, ns, name)
	if err != nil {
		return "", err
	}
	if s.Labels[MCPAuthSecretLabel] != "true" {
		return "", fmt.Errorf("secret %s/%s is not labelled %s=true", ns, name, MCPAuthSecretLabel)
	}
	key := r.Payload[PayloadAuthSecretKey]
	if key == "" {
		key = DefaultAuthSecretKey
	}
	v, ok := s.Data[key]
	if !ok || len(v) == 0 {
		return "", fmt.Errorf("secret %s/%s has no key %q", ns, name, key)
	}
	return "Bearer " + strings.TrimSpace(string(v)), nil
}
