package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"

	"github.com/vancetope/lease-operator/internal/adminapi"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
)

// maxResponseBytes bounds an answer of the manager (a revoke-pod lists every revoked holder).
const maxResponseBytes = 16 << 20

// adminClient calls the manager's operator API.
type adminClient struct {
	base   string
	secret string
	http   *http.Client
}

// errNoManager is returned when a command needs the manager and none is configured.
var errNoManager = errors.New("no manager: set --manager-url or $" + EnvManagerURL +
	" (e.g. kubectl -n lease-operator-system port-forward svc/lease-operator-admission 8082, then http://127.0.0.1:8082)")

// adminClient returns the client of the configured manager.
func (o *options) adminClient() (*adminClient, error) {
	raw := o.manager()
	if raw == "" {
		return nil, errNoManager
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("manager URL %q: want http(s)://host:port of the manager's API", raw)
	}
	secret := o.secret()
	if secret == "" {
		return nil, fmt.Errorf("no admin secret: set $%s (or --admin-secret) to the manager's admin secret (Secret lease-admin, key secret)", EnvAdminSecret)
	}
	return &adminClient{base: strings.TrimRight(u.String(), "/"), secret: secret, http: &http.Client{}}, nil
}

// managerError is a failed call of the operator API.
type managerError struct {
	URL    string
	Status int
	Body   httpjson.ErrorBody
	// Partial reports that the manager did part of the work before failing.
	Partial bool
}

func (e *managerError) Error() string {
	var what string
	switch {
	case e.Status == http.StatusUnauthorized:
		what = fmt.Sprintf("unauthorized: the manager rejected the admin secret (%s); check $%s or --admin-secret", e.Body.Message, EnvAdminSecret)
	case e.Status == http.StatusForbidden && e.Body.Error == adminapi.CodeDisabled:
		what = "forbidden: the manager's operator API is disabled: it runs without an admin secret (Secret lease-admin, key secret, or --admin-secret)"
	case e.Status == http.StatusForbidden:
		what = "forbidden: " + e.Body.Message
	case e.Body.Error == httpjson.CodeUnknownRoute:
		what = "the manager does not serve this operator route (an older manager?): " + e.Body.Message
	case e.Body.Error == httpjson.CodeNotFound:
		what = e.Body.Message
	case e.Body.Error == httpjson.CodeInvalid:
		what = "the manager rejected the request: " + e.Body.Message
	case e.Body.Error == httpjson.CodeUnavailable:
		what = "the manager cannot use the lease store (LEASE_UNAVAILABLE): " + e.Body.Message
	case e.Body.Error != "":
		what = e.Body.Error + ": " + e.Body.Message
	default:
		what = fmt.Sprintf("unexpected answer (%s): %s; is %s the manager's API port?", http.StatusText(e.Status), e.Body.Message, e.URL)
	}
	msg := fmt.Sprintf("manager %s: HTTP %d %s", e.URL, e.Status, what)
	if e.Partial {
		msg += " (part of the work was done before the failure, see above)"
	}
	return msg
}

// post sends body (nil for none) to the route and decodes a 200 answer into out. A failed
// answer is a *managerError; when it carries a partial result, that is decoded into out too
// and the error says so.
func (c *adminClient) post(ctx context.Context, route string, body, out any) error {
	endpoint := c.base + route
	var reader io.Reader
	if body != nil {
		data, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("encoding the request: %w", err)
		}
		reader = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, reader)
	if err != nil {
		return fmt.Errorf("manager %s: %w", endpoint, err)
	}
	req.Header.Set("Authorization", "Bearer "+c.secret)
	req.Header.Set("User-Agent", "kubectl-lease")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return fmt.Errorf("cannot reach the manager at %s: %w; check --manager-url or $%s", c.base, err, EnvManagerURL)
	}
	defer func() { _ = resp.Body.Close() }() // the body was read to the end or is discarded
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponseBytes))
	if err != nil {
		return fmt.Errorf("manager %s: reading the answer: %w", endpoint, err)
	}
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("manager %s: decoding the answer: %w (is this the lease manager's API?)", endpoint, err)
		}
		return nil
	}
	merr := &managerError{URL: endpoint, Status: resp.StatusCode}
	var raw struct {
		httpjson.ErrorBody
		Result json.RawMessage `json:"result"`
	}
	if json.Unmarshal(data, &raw) == nil && raw.Error != "" {
		merr.Body = raw.ErrorBody
		merr.Body.Result = nil
		if len(raw.Result) > 0 && string(raw.Result) != "null" && json.Unmarshal(raw.Result, out) == nil {
			merr.Partial = true
		}
	} else {
		merr.Body.Message = strings.TrimSpace(lease.Clip(string(data), 200))
	}
	return merr
}
