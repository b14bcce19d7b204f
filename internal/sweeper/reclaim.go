package sweeper

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
)

// ReclaimRelayPath is the manager's endpoint where lease agents ask for a borrowing reclaim
// for one of their waiters (docs/borrowing.md). The manager revokes and dispatches through its
// own matrix, so the revoked holder's handler runs and an Event is recorded; an agent's
// dispatcher knows no pod but its own. Only the waiter's own pod may ask (by its source
// address, as on the admission API), and the manager checks from the store that the waiter is
// owed a reclaim; a waiter is asked for at most once per reclaimInterval.
const ReclaimRelayPath = "/internal/lease/reclaim"

// reclaimInterval is the least time between two reclaims for one waiter: its own process asks
// about once a second (each look), jittered by a quarter.
const reclaimInterval = 500 * time.Millisecond

// Reclaimer runs a relayed reclaim (leasing.Service.ReclaimFor).
type Reclaimer interface {
	ReclaimFor(ctx context.Context, caller lease.PodRef, waiter string) (revoked bool, err error)
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
// malformed request, 503 when the caller or the store could not be read. A revocation is
// answered as one even if a later step failed, so that the agent never reclaims a second time
// for it. The gate counts asks per calling pod and waiter, so that another pod naming the
// waiter cannot use up the waiter's own asks.
func ReclaimRelayHandler(r Reclaimer, identify func(*http.Request) (lease.PodRef, error), notOwed error,
	clk clock.PassiveClock, log logr.Logger) http.Handler {
	gate := newGate(gateSize, reclaimInterval)
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
		// A caller that is no pod (the zero PodRef) is the pod of no waiter: owed nothing.
		caller, err := identify(req)
		if err != nil {
			httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.CodeUnavailable, "identifying the calling pod")
			return
		}
		if !gate.allow(string(caller.UID)+"/"+caller.String()+"/"+in.Waiter, clk.Now()) {
			httpjson.Write(w, http.StatusOK, reclaimResponse{NotOwed: "asked for less than " + reclaimInterval.String() + " ago"})
			return
		}
		revoked, err := r.ReclaimFor(context.WithoutCancel(req.Context()), caller, in.Waiter)
		switch {
		case revoked || err == nil:
			if err != nil {
				log.Error(err, "Reclaim revoked a holder, then failed", "waiter", in.Waiter)
			}
			httpjson.Write(w, http.StatusOK, reclaimResponse{Revoked: revoked})
		case errors.Is(err, notOwed):
			httpjson.Write(w, http.StatusOK, reclaimResponse{NotOwed: err.Error()})
		default:
			log.Error(err, "Reclaim failed", "waiter", in.Waiter)
			httpjson.WriteError(w, http.StatusServiceUnavailable, httpjson.CodeUnavailable, "reclaim failed; the store could not be read")
		}
	})
}

// RelayReclaim returns the lease agent's reclaim relay (leasing.WithReclaimRelay): it asks the
// manager at managerURL to reclaim for a waiter. Only when the manager cannot be reached (no
// connection: the request was never received) is the error unreachable, wrapped around
// leasing's ErrRelayUnreachable, and the agent reclaims itself, releasing the holder only;
// after a timeout or an error answer the manager may have reclaimed, and the waiter's next
// look asks again.
func RelayReclaim(client *http.Client, managerURL string, unreachable error) func(ctx context.Context, waiter string) (bool, error) {
	if client == nil {
		client = &http.Client{Timeout: 30 * time.Second}
	}
	url := strings.TrimRight(managerURL, "/") + ReclaimRelayPath
	return func(ctx context.Context, waiter string) (bool, error) {
		resp, err := postJSON(ctx, client, url, reclaimRequest{Waiter: waiter})
		if err != nil {
			if op := (*net.OpError)(nil); errors.As(err, &op) && op.Op == "dial" {
				return false, fmt.Errorf("%w: %w", unreachable, err)
			}
			return false, fmt.Errorf("asking the manager to reclaim for %s: %w", waiter, err)
		}
		defer func() { _ = resp.Body.Close() }()
		var out reclaimResponse
		derr := json.NewDecoder(io.LimitReader(resp.Body, 4<<10)).Decode(&out)
		switch {
		case resp.StatusCode != http.StatusOK:
			return false, fmt.Errorf("asking the manager to reclaim for %s: manager answered %s", waiter, resp.Status)
		case derr != nil:
			return false, fmt.Errorf("asking the manager to reclaim for %s: reading its answer: %w", waiter, derr)
		}
		return out.Revoked, nil
	}
}
