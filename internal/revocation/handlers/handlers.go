// Package handlers holds the revocation handlers that ship with the operator (tex, mcp,
// notify) and what they need: the notify hub they publish to in the holder pod, and the
// Secret reads and HTTP client of the mcp session DELETE on a reaper.
package handlers

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"

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

// Payload keys read by the mcp handler on a reaper. The payload is written by the app: it
// says which session to end and which configuration to look it up in, never where to send
// the request (docs/operations.md, "MCP session cleanup").
const (
	// PayloadEndpoint is the MCP server's URL that the session was opened against. The
	// DELETE is sent only when it is the endpoint of the configuration Secret.
	PayloadEndpoint = "endpoint"
	// PayloadSessionID is the session's Mcp-Session-Id.
	PayloadSessionID = "sessionId"
	// PayloadAuthSecret names the tool's configuration Secret: "name" or "namespace/name";
	// the namespace must be the holder pod's namespace.
	PayloadAuthSecret = "authSecret"
	// PayloadAuthSecretKey is the token's key in that Secret (default "token"); its value
	// is sent as "Authorization: Bearer <value>".
	PayloadAuthSecretKey = "authSecretKey"
)

// MCPAuthSecretLabel must be "true" on a Secret before the mcp handler reads it. The
// payload is written by the app, so without this opt-in any app could make the manager
// read any Secret of its namespace.
const MCPAuthSecretLabel = "lease.vancetope.io/mcp-auth"

// MCPSecretEndpointKey is the key of the configuration Secret that names the MCP server
// the tool talks to (one URL per line). Only these URLs are ever sent a DELETE: the
// manager does not send requests from its network position to an address an app chose.
const MCPSecretEndpointKey = "endpoint"

// DefaultAuthSecretKey is the Secret key used when the payload names none. A Secret
// without it serves an unauthenticated MCP server.
const DefaultAuthSecretKey = "token"

// EndpointNotConfiguredError reports that the session DELETE was not sent, because the payload's
// endpoint is not one the holder namespace's configuration names (or there is none).
type EndpointNotConfiguredError struct {
	Endpoint string
	Reason   string
}

func (e *EndpointNotConfiguredError) Error() string {
	return fmt.Sprintf("MCP endpoint %s not contacted: %s", e.Endpoint, e.Reason)
}

// Publisher delivers a revocation event to the waiters in this process (*notify.Hub).
type Publisher interface {
	Publish(ev notify.Event)
}

var _ Publisher = (*notify.Hub)(nil)

// +kubebuilder:rbac:groups="",resources=secrets,verbs=get

// SecretReader reads the data of a Secret. Back it with an uncached reader (k8ssecret.Reader
// over the manager's GetAPIReader()): a cached client would start an informer over every
// Secret in the cluster. RBAC: get on secrets.
type SecretReader interface {
	ReadSecret(ctx context.Context, namespace, name string) (Secret, error)
}

// Secret is what the handlers read of a Secret.
type Secret struct {
	Labels map[string]string
	Data   map[string][]byte
}

// NewDefaultRegistry returns a registry with the shipped handlers: tex, mcp and notify.
// hub is this process's notify hub (nil: nothing is published, e.g. a manager that serves
// no long-poll); secrets and httpClient serve the mcp session DELETE on a reaper (nil
// secrets: a payload naming an auth Secret fails; nil client: DefaultMCPClient()).
func NewDefaultRegistry(hub Publisher, secrets SecretReader, httpClient *http.Client, mcpEndpoints ...string) *revocation.Registry {
	r := revocation.NewRegistry()
	// The types are distinct constants: Register cannot fail here.
	_ = r.Register(TypeTex, TexHandler{Hub: hub})
	_ = r.Register(TypeMCP, &MCPHandler{Hub: hub, Secrets: secrets, Client: httpClient, Allowed: mcpEndpoints})
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
	logr.FromContextOrDiscard(ctx).V(1).Info("Tex job cannot be cancelled, it expires server-side", "holder", r.HolderID)
	return nil
}

// MCPHandler handles MCP sessions. In the holder pod it publishes to the hub: the app
// compares the token with its pooled session's and closes that session (a late revocation
// for a session re-opened since then closes nothing). On a reaper (dead holder pod, HTTP
// transport) it terminates the remote session: DELETE <endpoint> with Mcp-Session-Id:
// <payload sessionId>, where the endpoint is the one the tool's configuration Secret (named
// by the payload, in the holder pod's namespace) names and equals the payload's; a payload
// endpoint the configuration does not name is not contacted.
type MCPHandler struct {
	Hub     Publisher
	Secrets SecretReader
	// Client sends the DELETE (nil: DefaultMCPClient()).
	Client *http.Client
	// Allowed are the operator's MCP endpoints (the manager's --mcp-endpoints): the only
	// ones the handler ever contacts. A tenant's Secret supplies credentials for them and can
	// only narrow the list, never extend it (docs/security.md). Empty: none.
	Allowed []string
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
		log.V(1).Info("MCP payload has no endpoint or session, nothing to delete", "holder", r.HolderID)
		return nil
	}
	u, err := parseHTTPURL(endpoint)
	if err != nil {
		return fmt.Errorf("mcp payload endpoint: %w", err)
	}
	target, auth, err := h.configured(ctx, r, u)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodDelete, target.String(), nil)
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
		// The dial error stays in this log: the returned error reaches the pod's Event,
		// which a tenant reads, and must not tell it what answers where. The holder is
		// named by its ID: its token is a bearer secret (docs/security.md, "Tokens").
		log.Error(err, "Deleting the MCP session failed", "holder", r.HolderID, "endpoint", target.Redacted())
		return fmt.Errorf("deleting MCP session at %s failed (details in the manager's log)", target.Redacted())
	}
	_ = resp.Body.Close()
	switch {
	case resp.StatusCode/100 == 2:
	case resp.StatusCode == http.StatusNotFound:
		// The session is already gone (expired, or deleted by someone else).
	case resp.StatusCode == http.StatusMethodNotAllowed:
		// The server does not let clients terminate sessions (allowed by the MCP spec).
	default:
		return fmt.Errorf("deleting MCP session at %s: %s", target.Redacted(), resp.Status)
	}
	log.Info("Deleted MCP session of dead holder pod", "holder", r.HolderID, "endpoint", target.Redacted(), "status", resp.StatusCode)
	return nil
}

// configured loads the configuration Secret the payload names and returns the configured
// endpoint that equals the payload's (the DELETE goes there, never to the payload's text)
// and the Authorization header value ("" without a token).
func (h *MCPHandler) configured(ctx context.Context, r revocation.Revocation, payloadURL *url.URL) (*url.URL, string, error) {
	if matchEndpoint(strings.Join(h.Allowed, "\n"), payloadURL) == nil {
		return nil, "", &EndpointNotConfiguredError{Endpoint: payloadURL.Redacted(),
			Reason: "not among the operator's MCP endpoints (--mcp-endpoints)"}
	}
	ref := r.Payload[PayloadAuthSecret]
	if ref == "" {
		return nil, "", &EndpointNotConfiguredError{Endpoint: payloadURL.Redacted(),
			Reason: "the payload names no configuration Secret (" + PayloadAuthSecret + ")"}
	}
	ns, name, found := strings.Cut(ref, "/")
	if !found {
		ns, name = r.Pod.Namespace, ref
	}
	switch {
	case r.Pod.Namespace == "":
		return nil, "", fmt.Errorf("mcp auth secret %q: the holder records no pod namespace", ref)
	case ns != r.Pod.Namespace:
		return nil, "", fmt.Errorf("mcp auth secret %q: not in the holder pod's namespace %s", ref, r.Pod.Namespace)
	case name == "":
		return nil, "", fmt.Errorf("mcp auth secret %q: empty name", ref)
	case h.Secrets == nil:
		return nil, "", errors.New("mcp auth secret named, but this process has no secret reader")
	}
	s, err := h.Secrets.ReadSecret(ctx, ns, name)
	if err != nil {
		return nil, "", err
	}
	if s.Labels[MCPAuthSecretLabel] != "true" {
		return nil, "", fmt.Errorf("secret %s/%s is not labelled %s=true", ns, name, MCPAuthSecretLabel)
	}
	target := matchEndpoint(string(s.Data[MCPSecretEndpointKey]), payloadURL)
	if target == nil {
		return nil, "", &EndpointNotConfiguredError{Endpoint: payloadURL.Redacted(),
			Reason: fmt.Sprintf("secret %s/%s key %q does not name it", ns, name, MCPSecretEndpointKey)}
	}
	key := r.Payload[PayloadAuthSecretKey]
	v, ok := s.Data[cmp.Or(key, DefaultAuthSecretKey)]
	switch {
	case ok && len(v) > 0:
		return target, "Bearer " + strings.TrimSpace(string(v)), nil
	case key != "":
		return nil, "", fmt.Errorf("secret %s/%s has no key %q", ns, name, key)
	default:
		return target, "", nil
	}
}

// matchEndpoint returns the URL of the configured list (one per line) that is the same
// endpoint as u, nil when none is.
func matchEndpoint(list string, u *url.URL) *url.URL {
	for line := range strings.Lines(list) {
		c, err := parseHTTPURL(strings.TrimSpace(line))
		if err == nil && sameEndpoint(c, u) {
			return c
		}
	}
	return nil
}

// sameEndpoint compares scheme, host and path (case-insensitive host, trailing slash
// ignored) and query; user info never matches.
func sameEndpoint(a, b *url.URL) bool {
	return a.User == nil && b.User == nil &&
		strings.EqualFold(a.Scheme, b.Scheme) && strings.EqualFold(a.Host, b.Host) &&
		strings.TrimSuffix(a.EscapedPath(), "/") == strings.TrimSuffix(b.EscapedPath(), "/") &&
		a.RawQuery == b.RawQuery
}

func parseHTTPURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("%q is not an http(s) URL", s)
	}
	u.Fragment = ""
	return u, nil
}
