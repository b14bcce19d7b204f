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

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
)

// ReclaimRelayPath is the manager's endpoint where lease agents ask for a borrowing reclaim
// for one of their waiters (docs/borrowing.md). The manager revokes and dispatches through its
// own matrix, so the revoked holder's handler runs and an Event is recorded; an agent's
// dispatcher knows no pod but its own. The request only names the waiter, and the manager
// checks from the store that the waiter is owed a reclaim, so the endpoint needs no secret.
const ReclaimRelayPath = "/internal/lease/reclaim"

// Reclaimer runs a relayed reclaim (leasing.Service.ReclaimFor).
type Reclaimer interface {
	ReclaimFor(ctx context.Context, waiter string) (revoked bool, err error)
}

type reclaimRequest struct {
	Waiter string `json:"waiter"`
}

type reclaimResponse struct {
	Revoked bool `json:"revoked"`
	// NotOwed says why nothing was revoked, when the waiter is owed nothing now.
	NotOwed string `json:"notOwed,omitempty"`
}

// ReclaimRelayHandler serves ReclaimRelayPath on the manager: 200 with whether a holder was
// revoked (and why not, when the waiter is owed nothing: errors matching notOwed), 400 for a
// malformed request, 503 when the store failed.
func ReclaimRelayHandler(r Reclaimer, notOwed error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		var in reclaimRequest
		if !decodePost(w, req, &in) {
			return
		}
		if !lease.ValidHolderID(in.Waiter) {
			httpjson.Write(w, http.StatusBadRequest, httpjson.ErrorBody{Error: httpjson.CodeInvalid,
				Message: "waiter: want a holder ID (lh- and 24 hex digits)", Field: "waiter"})
			return
		}
		revoked, err := r.ReclaimFor(context.WithoutCancel(req.Context()), in.Waiter)
		switch {
		case errors.Is(err, notOwed):
			httpjson.Write(w, http.StatusOK, reclaimResponse{Revoked: revoked, NotOwed: err.Error()})
		case err != nil:
			httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.CodeUnavailable, err.Error())
		default:
			httpjson.Write(w, http.StatusOK, reclaimResponse{Revoked: revoked})
		}
	})
}

// RelayReclaim returns the lease agent's reclaim relay (leasing.WithReclaimRelay): it asks the
// manager at managerURL to reclaim for a waiter. An error (the manager unreachable, or not
// answering 200) makes the agent reclaim itself, releasing the holder only.
func RelayReclaim(client *http.Client, managerURL string) func(ctx context.Context, waiter string) (bool, error) {
	if client == nil {
		client = &http.Client{Timeout: 5 * time.Second}
	}
	url := strings.TrimRight(managerURL, "/") + ReclaimRelayPath
	return func(ctx context.Context, waiter string) (bool, error) {
		resp, err := postJSON(ctx, client, url, reclaimRequest{Waiter: waiter})
		if err != nil {
			return false, fmt.Errorf("asking the manager to reclaim for %s: %w", waiter, err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out reclaimResponse
		derr := json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&out)
		if resp.StatusCode != http.StatusOK {
			return false, fmt.Errorf("asking the manager to reclaim for %s: manager answered %s", waiter, resp.Status)
		}
		if derr != nil {
			// It ran; only its answer was lost. Reclaiming here as well could revoke twice.
			return false, nil
		}
		return out.Revoked, nil
	}
}
