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

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// ReclaimRelayPath is the manager's endpoint where lease agents ask for a borrowing reclaim
// for one of their waiters (docs/borrowing.md). The manager revokes and dispatches through its
// own matrix, so the revoked holder's handler runs and an Event is recorded; an agent's
// dispatcher knows no pod but its own. Only the agent of the waiter's own pod may ask
// (agentauth: the pod by its source address, the request signed with its namespace's agent
// key, so that an app container of the pod cannot pose as its agent), and the manager checks
// from the store that the waiter is owed a reclaim; a pod's ask for one waiter is passed on at
// most once per reclaimInterval.
const ReclaimRelayPath = "/internal/lease/reclaim"

// reclaimInterval is the least time between two reclaims for one waiter: its own process asks
// about once a second (each look), jittered by a quarter.
const reclaimInterval = 500 * time.Millisecond

// reclaimTimeout bounds one reclaim asked of the manager.
const reclaimTimeout = 30 * time.Second

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

// reclaimRelay serves ReclaimRelayPath.
type reclaimRelay struct {
	reclaimer Reclaimer
	auth      Authenticator
	notOwed   error
	cfg       relayConfig
	gate      *gate // per calling pod and waiter
}

// ReclaimRelayHandler serves ReclaimRelayPath on the manager: for an agent that auth accepts,
// 200 with whether a holder was revoked (and why not, when the waiter is owed nothing: errors
// matching notOwed), 400 for a malformed request, 401, 403 and 503 from auth, 503 with a fixed
// text and a correlation id when the store could not be read (the cause in the log). A
// revocation is answered as one even if a later step failed, so that the agent never reclaims
// a second time for it. The gate counts asks per calling pod and waiter, so that another pod
// naming the waiter cannot use up the waiter's own asks.
func ReclaimRelayHandler(r Reclaimer, auth Authenticator, notOwed error, opts ...RelayOption) http.Handler {
	return &reclaimRelay{reclaimer: r, auth: auth, notOwed: notOwed, cfg: relayConfigOf(opts), gate: newGate(gateSize, reclaimInterval)}
}

func (h *reclaimRelay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	var in reclaimRequest
	caller, ok := agentRequest(w, req, h.auth, &in)
	if !ok {
		return
	}
	if !lease.ValidHolderID(in.Waiter) {
		writeInvalid(w, &lease.InvalidError{Field: "waiter", Detail: "want a holder ID (lh- and 24 hex digits)"})
		return
	}
	if !h.gate.allow(string(caller.UID)+"/"+caller.String()+"/"+in.Waiter, h.cfg.clock.Now()) {
		httpjson.Write(w, http.StatusOK, reclaimResponse{NotOwed: "asked for less than " + reclaimInterval.String() + " ago"})
		return
	}
	revoked, err := h.reclaimer.ReclaimFor(context.WithoutCancel(req.Context()), caller, in.Waiter)
	switch {
	case revoked || err == nil:
		if err != nil {
			h.cfg.log.Error(err, "Reclaim revoked a holder, then failed", "pod", caller.String(), "waiter", in.Waiter)
		}
		httpjson.Write(w, http.StatusOK, reclaimResponse{Revoked: revoked})
	case errors.Is(err, h.notOwed):
		httpjson.Write(w, http.StatusOK, reclaimResponse{NotOwed: err.Error()})
	default:
		id := lease.CorrelationID()
		h.cfg.log.Error(err, "Reclaim failed", "pod", caller.String(), "waiter", in.Waiter, "correlationId", id)
		httpjson.WriteUnavailable(w, unavailableStore, id)
	}
}

// RelayReclaim returns the lease agent's reclaim relay (leasing.WithReclaimRelay): it asks the
// manager at managerURL to reclaim for a waiter, signing with key (the agent key of the pod's
// namespace); client's connections must leave from the pod's address (agentauth.HTTPClient). Only when the manager cannot be reached (no
// connection: the request was never received) is the error unreachable, wrapped around
// leasing's ErrRelayUnreachable, and the agent reclaims itself, releasing the holder only;
// after a timeout or an error answer the manager may have reclaimed, and the waiter's next
// look asks again.
func RelayReclaim(client *http.Client, managerURL, key string, unreachable error) leasing.ReclaimRelay {
	if client == nil {
		client = &http.Client{}
	}
	base := strings.TrimRight(managerURL, "/")
	return func(ctx context.Context, waiter string) (bool, error) {
		ctx, cancel := context.WithTimeout(ctx, reclaimTimeout)
		defer cancel()
		resp, err := postSigned(ctx, client, key, base, ReclaimRelayPath, reclaimRequest{Waiter: waiter})
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
