package sweeper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"

	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// RelayPath is the manager's endpoint where lease agents ask for the lazy idle sweep of one
// resource. The manager reaps and dispatches through its own matrix: an agent watches no
// pods and could not tell a live holder pod from a dead one. The request only names a
// resource; what is reaped is what the store finds idle, so the endpoint needs no secret.
const RelayPath = "/internal/lease/sweep"

// maxResourceLen bounds the resource named in a relay request.
const maxResourceLen = 256

// IdleStore is the part of the store the relay uses (*leasestore.Store).
type IdleStore interface {
	SweepIdle(ctx context.Context, resource string) (leasestore.IdleSweep, error)
}

var _ IdleStore = (*leasestore.Store)(nil)

type relayRequest struct {
	Resource string `json:"resource"`
}

type relayResponse struct {
	Reaped int `json:"reaped"`
	// NextExpiryMs is when the next holder of the resource goes idle, from the sweep's read
	// (0: none, or no sweep ran).
	NextExpiryMs int64 `json:"nextExpiryMs,omitempty"`
}

// RelayHandler serves RelayPath on the manager: it reaps the idle holders of the named
// resource and hands them to listener (reason idle), at most once per interval per resource.
func RelayHandler(store IdleStore, listener Listener, clk clock.PassiveClock, interval time.Duration) http.Handler {
	gate := newGate(gateSize, interval)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req relayRequest
		if !decodePost(w, r, &req) {
			return
		}
		if req.Resource == "" || len(req.Resource) > maxResourceLen {
			httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Error: httpjson.CodeInvalid,
				Message: "resource: want 1 to 256 characters", Field: "resource"})
			return
		}
		var out relayResponse
		if gate.allow(req.Resource, clk.Now()) {
			sw, err := store.SweepIdle(r.Context(), req.Resource)
			if len(sw.Reaped) > 0 && listener != nil {
				listener.Revoked(context.WithoutCancel(r.Context()), metrics.ReapIdle, sw.Reaped)
			}
			if err != nil {
				httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.CodeUnavailable, err.Error())
				return
			}
			out = relayResponse{Reaped: len(sw.Reaped), NextExpiryMs: sw.NextExpiry.Milliseconds()}
		}
		httpjson.Write(w, http.StatusOK, out)
	})
}

// RelayReaper returns an idle reaper for the agent's admission service: it asks the manager
// at managerURL to sweep and returns how many holders the manager reaped (and dispatched), so
// that a busy acquisition retries at once. When the manager cannot be reached it falls back
// to reaping with local, returning the holders for the agent's own dispatcher.
func RelayReaper(client *http.Client, managerURL string, local IdleStore) func(ctx context.Context, resource string) (leasestore.IdleSweep, int, error) {
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	url := strings.TrimRight(managerURL, "/") + RelayPath
	return func(ctx context.Context, resource string) (leasestore.IdleSweep, int, error) {
		resp, err := postJSON(ctx, client, url, relayRequest{Resource: resource})
		if err == nil {
			var out relayResponse
			derr := json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&out)
			_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
			_ = resp.Body.Close()
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
		sw, lerr := local.SweepIdle(ctx, resource)
		return sw, 0, errors.Join(fmt.Errorf("asking the manager to sweep %s (swept here instead): %w", resource, err), lerr)
	}
}

// decodePost decodes the JSON body of a POST into dst; otherwise it answers 405 or 400 and
// returns false.
func decodePost(w http.ResponseWriter, r *http.Request, dst any) bool {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		httpjson.WriteError(w, http.StatusMethodNotAllowed, httpjson.CodeMethodNotAllowed, "only POST is allowed")
		return false
	}
	if fe := httpjson.Decode(w, r, 4<<10, dst, true); fe != nil {
		httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Error: httpjson.CodeInvalid, Message: fe.Error(), Field: fe.Field})
		return false
	}
	return true
}

// postJSON posts in as JSON to url.
func postJSON(ctx context.Context, client *http.Client, url string, in any) (*http.Response, error) {
	body, err := json.Marshal(in)
	if err != nil {
		return nil, fmt.Errorf("encoding the request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("building the request: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	return client.Do(req)
}
