// Package leaseclient is the Go client of the lease admission API: acquire a lease before
// using a scarce resource, check it at every use, store what a revocation handler needs in
// its payload, release it when done, and stop at once when it is revoked. It imports only
// the standard library, so an application depends on nothing else of the operator.
//
// The API is served by the lease agent injected next to the application
// ($LEASE_AGENT_URL, usually http://127.0.0.1:8090) and by the manager. The contract is
// described in docs/client.md and, for other languages, in api/openapi/lease-api.yaml.
//
//	l, err := leaseclient.Acquire(ctx, leaseclient.Request{Type: "tex", Lease: "tex",
//		Tenant: t, Project: p, User: u, HolderRef: jobRef, PodBound: true})
//	if err != nil {
//		return err // errors.Is(err, leaseclient.ErrBusy), errors.As(err, &busy), ...
//	}
//	defer l.Release(context.WithoutCancel(ctx))
//	... l.UpdatePayload(ctx, map[string]string{"jobId": id})
//	for { if err := l.Check(ctx); err != nil { return err } ... }
package leaseclient

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

// EnvURL is the environment variable holding the API's base URL; the injection webhook sets
// it in every container of an annotated pod.
const EnvURL = "LEASE_AGENT_URL"

// Paths of the admission API.
const (
	pathLeases = "/v1/leases"
)

// Defaults of the options.
const (
	// DefaultEventTimeout is the long-poll timeout of one events request.
	DefaultEventTimeout = 30 * time.Second
	// DefaultReconnectDelay is the first pause before a failed long-poll is retried; it
	// doubles up to MaxReconnectDelay.
	DefaultReconnectDelay = 200 * time.Millisecond
	// MaxReconnectDelay bounds the pause between two failed long-polls.
	MaxReconnectDelay = 5 * time.Second
	// maxAnswerBytes bounds an answer body read by the client.
	maxAnswerBytes = 1 << 20
	// MaxWait is the longest wait the server accepts in a request (ten minutes).
	MaxWait = 10 * time.Minute
	// idempotentAttempts is how often check, payload and release are tried when no answer
	// arrives or the server answers 503: repeating them is harmless.
	idempotentAttempts = 3
)

// Client talks to one admission API. It is safe for concurrent use.
type Client struct {
	base           *url.URL
	http           *http.Client
	eventTimeout   time.Duration
	reconnectDelay time.Duration
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient sets the HTTP client (default: a client without overall timeout; every
// call is bounded by its context).
func WithHTTPClient(c *http.Client) Option { return func(cl *Client) { cl.http = c } }

// WithEventTimeout sets the long-poll timeout of one events request (at most 60s, the
// server's bound).
func WithEventTimeout(d time.Duration) Option { return func(cl *Client) { cl.eventTimeout = d } }

// WithReconnectDelay sets the first pause before a failed long-poll is retried.
func WithReconnectDelay(d time.Duration) Option {
	return func(cl *Client) { cl.reconnectDelay = d }
}

// New returns a client of the API at baseURL (e.g. "http://127.0.0.1:8090").
func New(baseURL string, opts ...Option) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, &InvalidError{Field: "url", Message: fmt.Sprintf("lease API URL %q is not an http(s) URL", baseURL)}
	}
	c := &Client{base: u, http: &http.Client{}, eventTimeout: DefaultEventTimeout, reconnectDelay: DefaultReconnectDelay}
	for _, o := range opts {
		o(c)
	}
	if c.reconnectDelay <= 0 {
		c.reconnectDelay = DefaultReconnectDelay
	}
	if c.eventTimeout <= 0 || c.eventTimeout > 60*time.Second {
		c.eventTimeout = DefaultEventTimeout
	}
	return c, nil
}

// NewFromEnv returns a client of the API at $LEASE_AGENT_URL. Without it the error is an
// *InvalidError naming "url": an application that expects a lease must not run
// unprotected because its pod was not injected.
func NewFromEnv(opts ...Option) (*Client, error) {
	u := os.Getenv(EnvURL)
	if u == "" {
		return nil, &InvalidError{Field: "url", Message: EnvURL + " is not set (is the pod annotated for the lease agent?)"}
	}
	return New(u, opts...)
}

// Acquire obtains a lease from the API at $LEASE_AGENT_URL; see Client.Acquire.
func Acquire(ctx context.Context, req Request) (*Lease, error) {
	c, err := NewFromEnv()
	if err != nil {
		return nil, err
	}
	return c.Acquire(ctx, req)
}

// Request is one acquisition.
type Request struct {
	// Type is the handler type of the consumer (e.g. "tex", "mcp"); the server rejects a
	// type without a revocation handler.
	Type string
	// Lease is the name of the lease definition; "" or "none" means no lease (NOOP).
	// Exclusive with Inline and Leases.
	Lease string
	// Leases names several lease definitions (at most 8) to be granted all together or not
	// at all, under one token: Lease.Parts holds each with its fence (docs/client.md, "Several
	// leases at once", and docs/waiting.md). Exclusive with Lease and Inline; a name twice, "none", or two leases
	// of one resource is an *InvalidError naming "leases".
	Leases []string
	// Inline is a definition carried by the request (project-private counter).
	Inline *Inline
	// Tenant is the tenant to act for; leave it empty to act for the tenant of the calling
	// pod's namespace, the only one a pod may name (TENANT_FORBIDDEN otherwise). Project is
	// required; User is required when the definition caps the user level.
	Tenant, Project, User string
	// HolderRef is the consumer's own reference (job, process, session), shown to operators.
	HolderRef string
	// PodBound tells the reaper the resource dies with this pod.
	PodBound bool
	// Payload is what the revocation handler needs for cleanup; update it later with
	// Lease.UpdatePayload.
	Payload map[string]string
	// Wait, when positive, shortens the definition's wait for a slot. The wait is also
	// shortened so that the server answers before ctx's deadline.
	Wait time.Duration
	// Priority orders the acquisition among the waiters of a full level: highest first,
	// oldest first within a priority. 0 by default; above the definition's maxPriority the
	// server answers *InvalidError (field priority). It never takes a slot from a holder.
	Priority int
}

// Inline is an inline lease definition: only the project and user caps, the TTL and the
// wait may be set (zero: not set).
type Inline struct {
	Name       string       `json:"name"`
	Levels     InlineLevels `json:"levels,omitzero"`
	TTLSeconds int32        `json:"ttlSeconds,omitempty"`
	WaitMs     int32        `json:"waitMs,omitempty"`
}

// InlineLevels are the caps of an inline definition (zero: no cap).
type InlineLevels struct {
	Project int32 `json:"project,omitempty"`
	User    int32 `json:"user,omitempty"`
}

// Part is one lease of an acquisition of several (Request.Leases).
type Part struct {
	// Name is the lease definition's name; Resource the counter key.
	Name, Resource string
	// Levels are the booked levels (for a dry run: those a grant would book), narrow to wide.
	Levels []Level
	// Fence is the part's fence: it strictly increases with every grant of its resource.
	// Key a Guard by the part's scope and admit the work on that resource with this fence.
	// 0 in a dry run's answer.
	Fence int64
}

func partsOf(parts []partBody) []Part {
	if len(parts) == 0 {
		return nil
	}
	out := make([]Part, len(parts))
	for i, p := range parts {
		out[i] = Part{Name: p.Lease, Resource: p.Resource, Levels: levelsOf(p.Levels), Fence: p.Fence}
	}
	return out
}

// partNames is the name of a grant of several leases: their names joined by "+".
func partNames(parts []Part) string {
	names := make([]string, len(parts))
	for i, p := range parts {
		names[i] = p.Name
	}
	return strings.Join(names, "+")
}

func levelsOf(levels []levelBody) []Level {
	var out []Level
	for _, lv := range levels {
		out = append(out, Level(lv))
	}
	return out
}

// Level is one booked level of a lease.
type Level struct {
	// Level is user, project, tenant or global.
	Level string
	// Scope is the level's scope ("acme/alice", "acme/p1", "acme", "*").
	Scope string
	Cap   int
}

// deadlineMargin is kept between the wait asked of the server and ctx's deadline, so that
// the answer (LEASE_BUSY with its diagnosis) arrives before the caller gives up.
func deadlineMargin(left time.Duration) time.Duration {
	return min(left/10, 500*time.Millisecond)
}

// Acquire obtains a lease, waiting for a slot as long as the definition allows (shortened
// by req.Wait and ctx's deadline). A NOOP answer (no lease applies) gives a Lease whose
// calls do nothing. It is never retried: a second attempt could book a second slot.
// Errors: *BusyError, *InvalidError, *UnavailableError (also for ctx ending before the
// answer; errors.Is(err, context.DeadlineExceeded) tells that case apart).
func (c *Client) Acquire(ctx context.Context, req Request) (*Lease, error) {
	body := bodyOf(req)
	setWait := func(d time.Duration) {
		ms := min(max(d, 0), MaxWait).Milliseconds()
		body.WaitMs = &ms
	}
	if req.Wait > 0 {
		setWait(req.Wait)
	}
	if dl, ok := ctx.Deadline(); ok {
		left := time.Until(dl)
		left -= deadlineMargin(left)
		if req.Wait <= 0 || left < req.Wait {
			setWait(left)
		}
	}
	var out leaseBody
	if err := c.call(ctx, "acquire", http.MethodPost, pathLeases, body, &out); err != nil {
		return nil, err
	}
	if out.NoOp {
		return &Lease{NoOp: true}, nil
	}
	if out.Token == "" {
		return nil, &UnavailableError{Op: "acquire", Status: http.StatusOK, Err: errors.New("the answer carries no token")}
	}
	l := &Lease{Token: out.Token, Name: out.Lease, Resource: out.Resource, Levels: levelsOf(out.Levels),
		TTL: time.Duration(out.TTLSeconds) * time.Second, Fence: out.Fence, Parts: partsOf(out.Leases), c: c}
	if l.Parts != nil {
		l.Name = partNames(l.Parts)
	}
	return l, nil
}

func bodyOf(req Request) acquireBody {
	return acquireBody{Type: req.Type, Lease: req.Lease, Leases: req.Leases, Inline: req.Inline, Tenant: req.Tenant,
		Project: req.Project, User: req.User, HolderRef: req.HolderRef, PodBound: req.PodBound,
		Payload: req.Payload, Priority: req.Priority}
}

// DryRunResult is what an acquisition would be granted now: the levels it would book, or
// NoOp when no lease applies. Nothing was booked: there is no token, nothing to release.
type DryRunResult struct {
	// NoOp is true when no lease applies.
	NoOp bool
	// Name is the lease definition's name; Resource the counter key (empty for NoOp).
	Name, Resource string
	// Levels are the levels a grant would book, narrow to wide.
	Levels []Level
	// TTL is the idle TTL a grant would have.
	TTL time.Duration
	// Parts are, for Request.Leases, the leases a grant would book, as in Lease.Parts but
	// without fences; Name then joins their names with "+", and Resource and Levels are
	// empty.
	Parts []Part
}

// DryRun asks what Acquire would answer now, without booking and without waiting
// (docs/client.md, "Dry run"). A grant or a NOOP is a *DryRunResult; a full level is the
// same *BusyError Acquire returns (Waited 0); a refusal is Acquire's *InvalidError or
// *TenantForbiddenError; *UnavailableError fails closed. req.Wait is not used. The answer is
// a snapshot: a slot free now may be taken before the next Acquire.
//
// A server that predates dry runs would acquire instead. The request asks for no wait, so
// such a server answers at once, and a lease it grants is released again and reported as
// an *UnavailableError.
func (c *Client) DryRun(ctx context.Context, req Request) (*DryRunResult, error) {
	body := bodyOf(req)
	noWait := int64(0)
	body.WaitMs = &noWait
	var out leaseBody
	if err := c.call(ctx, "dry run", http.MethodPost, pathLeases+"?dryRun=true", body, &out); err != nil {
		return nil, err
	}
	if !out.DryRun {
		err := errors.New("the server does not know dry runs (dryRun=true) and answered as to an acquisition")
		if out.Token != "" {
			l := &Lease{Token: out.Token, c: c}
			if rerr := l.Release(context.WithoutCancel(ctx)); rerr != nil {
				err = fmt.Errorf("%w; releasing the lease it granted: %w", err, rerr)
			} else {
				err = fmt.Errorf("%w; the lease it granted is released", err)
			}
		}
		return nil, &UnavailableError{Op: "dry run", Status: http.StatusOK, Err: err}
	}
	res := &DryRunResult{NoOp: out.NoOp, Name: out.Lease, Resource: out.Resource, Levels: levelsOf(out.Levels),
		TTL: time.Duration(out.TTLSeconds) * time.Second, Parts: partsOf(out.Leases)}
	if res.Parts != nil {
		res.Name = partNames(res.Parts)
	}
	return res, nil
}

// call sends one request and decodes a 200 answer into out. Any other answer becomes the
// typed error of its code.
func (c *Client) call(ctx context.Context, op, method, path string, in, out any) error {
	status, raw, err := c.send(ctx, method, path, in)
	if err != nil {
		return &UnavailableError{Op: op, Err: err}
	}
	if status == http.StatusOK {
		if out == nil {
			return nil
		}
		if err := json.Unmarshal(raw, out); err != nil {
			return &UnavailableError{Op: op, Status: status, Err: fmt.Errorf("decoding the answer: %w", err)}
		}
		return nil
	}
	return answerError(op, status, raw)
}

// send performs the request and reads the answer body (bounded).
func (c *Client) send(ctx context.Context, method, path string, in any) (int, []byte, error) {
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return 0, nil, fmt.Errorf("encoding the request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base.String()+path, rd)
	if err != nil {
		return 0, nil, c.withRoute(err, path)
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return 0, nil, c.withRoute(err, path)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return resp.StatusCode, nil, fmt.Errorf("reading the answer: %w", err)
	}
	return resp.StatusCode, raw, nil
}

// withRoute makes the URL an error of the HTTP client names (Post "http://…/v1/leases/…/check":
// connection refused) the route, /v1/leases/{token}/check: the path of a lease carries its
// token, a bearer secret, and applications log such errors (docs/security.md, "Tokens").
func (c *Client) withRoute(err error, path string) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		ue.URL = c.base.String() + routeOf(path)
	}
	return err
}

// routeOf is path with the token of a lease's path replaced by {token}.
func routeOf(path string) string {
	rest, ok := strings.CutPrefix(path, pathLeases+"/")
	if !ok {
		return path
	}
	if i := strings.IndexAny(rest, "/?"); i >= 0 {
		return pathLeases + "/{token}" + rest[i:]
	}
	return pathLeases + "/{token}"
}

// answerError maps an error answer to its typed error: by the body's code when it has one,
// else by the status. Anything unexpected is LEASE_UNAVAILABLE (fail closed).
func answerError(op string, status int, raw []byte) error {
	var b errorBody
	_ = json.Unmarshal(raw, &b) // a body that is not an error body leaves the code empty
	code := b.Error
	if code == "" {
		switch status {
		case http.StatusBadRequest:
			code = CodeInvalid
		case http.StatusForbidden:
			code = CodeTenantForbidden
		case http.StatusConflict:
			code = CodeBusy
		case http.StatusGone:
			code = CodeLost
		}
	}
	switch code {
	case CodeInvalid:
		return &InvalidError{Field: b.Field, Message: b.Message}
	case CodeBusy:
		busy := &BusyError{Lease: b.Lease, Resource: b.Resource, Level: b.Level, Scope: b.Scope, Count: b.Count, Cap: b.Cap,
			Waited: time.Duration(b.WaitedMs) * time.Millisecond, Message: b.Message,
			EstimatedWait: time.Duration(b.EstimatedWaitMs) * time.Millisecond}
		if b.Position != nil {
			busy.Explained, busy.Position = true, *b.Position
		}
		return busy
	case CodeLost:
		return &LostError{Op: op, Message: b.Message}
	case CodeTenantForbidden:
		return &TenantForbiddenError{Namespace: b.CallerNamespace, NamespaceTenant: b.CallerTenant, Message: b.Message}
	default:
		return &UnavailableError{Op: op, Status: status, Message: b.Message}
	}
}

// retryable reports whether an idempotent call may be repeated after err: no answer
// arrived (and ctx is still live), or the server said 503.
func retryable(ctx context.Context, err error) bool {
	var ue *UnavailableError
	return ctx.Err() == nil && errors.As(err, &ue) && (ue.Status == 0 || ue.Status == http.StatusServiceUnavailable)
}

// callIdempotent is call for check, payload and release, repeated a few times when no
// answer arrived or the store was briefly unavailable.
func (c *Client) callIdempotent(ctx context.Context, op, method, path string, in, out any) error {
	delay := 100 * time.Millisecond
	var err error
	for attempt := 1; ; attempt++ {
		err = c.call(ctx, op, method, path, in, out)
		if err == nil || attempt == idempotentAttempts || !retryable(ctx, err) {
			return err
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
		delay *= 2
	}
}
