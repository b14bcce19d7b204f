package leaseclient

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"sync"
	"time"
)

// Lease is a held lease, or a NOOP lease (NoOp true) whose calls do nothing. The methods of
// a nil *Lease also do nothing, so `defer l.Release(ctx)` is safe before the error of
// Acquire is checked. A Lease is safe for concurrent use.
type Lease struct {
	// Token identifies the holder; empty for a NOOP lease.
	Token string
	// NoOp is true when no lease applies: nothing was booked.
	NoOp bool
	// Name is the lease definition's name; Resource the counter key.
	Name, Resource string
	// Levels are the booked levels, narrow to wide.
	Levels []Level
	// TTL is the idle time after the last Check after which the lease may be reaped: call
	// Check more often than that.
	TTL time.Duration
	// Fence is the grant's fencing token: it strictly increases with every grant of the
	// resource. Send it with the work to a guarded service, which refuses a lower one
	// (Guard). 0 for a NOOP lease, and for a grant of several leases: use each part's.
	Fence int64
	// Parts are, for Request.Leases, the leases granted under the one token, in the order
	// of their resources, each with its levels and its own fence; a lease that caps nothing
	// books nothing and is not among them. Name then joins their names with "+", and
	// Resource, Levels and Fence are empty. Check, UpdatePayload, Release and Revoked act on
	// all of them at once. Nil for a single lease.
	Parts []Part

	c *Client

	mu       sync.Mutex
	released bool
	revoked  chan Event
	stop     context.CancelFunc
}

func (l *Lease) inert() bool { return l == nil || l.NoOp || l.c == nil }

func (l *Lease) path(suffix string) string {
	return pathLeases + "/" + url.PathEscape(l.Token) + suffix
}

// Check is the check at use: call it at every step that uses the resource. It also renews
// the lease (the TTL runs from the last check). Errors: ErrLost (stop using the resource),
// *UnavailableError (the lease could not be confirmed: fail closed).
func (l *Lease) Check(ctx context.Context) error {
	if l.inert() {
		return nil
	}
	return l.c.callIdempotent(ctx, "check", http.MethodPost, l.path("/check"), nil, nil)
}

// UpdatePayload replaces the payload that a revocation handler receives (e.g. the job id,
// known only after the acquisition). Errors: ErrLost, *InvalidError, *UnavailableError.
func (l *Lease) UpdatePayload(ctx context.Context, payload map[string]string) error {
	if l.inert() {
		return nil
	}
	if payload == nil {
		payload = map[string]string{}
	}
	return l.c.callIdempotent(ctx, "payload", http.MethodPut, l.path("/payload"), payloadBody{Payload: payload}, nil)
}

// Release returns the slot. It is idempotent: a lease already released, reaped or revoked
// releases without error, and a second call sends nothing. It stops the revocation
// long-poll. Pass a context that is not already cancelled (context.WithoutCancel in a
// defer) so that the slot is returned even when the work ended by cancellation.
func (l *Lease) Release(ctx context.Context) error {
	if l.inert() {
		return nil
	}
	l.mu.Lock()
	if l.stop != nil {
		l.stop()
	}
	done := l.released
	l.mu.Unlock()
	if done {
		return nil
	}
	// The answer's outcome is "ok" or "already-released"; both mean the slot is free.
	if err := l.c.callIdempotent(ctx, "release", http.MethodDelete, l.path(""), nil, &outcomeBody{}); err != nil {
		return err
	}
	l.mu.Lock()
	l.released = true
	l.mu.Unlock()
	return nil
}

// Revoked returns a channel that receives one Event when the lease is revoked or reaped
// while held, as early as the server learns of it. The first call starts a long-poll on
// GET /v1/leases/{token}/events that reconnects after errors until Release; the channel is
// never closed. The notice is a hint: Check still answers ErrLost in any case. For a NOOP
// lease the channel never receives.
func (l *Lease) Revoked() <-chan Event {
	if l == nil {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.revoked != nil {
		return l.revoked
	}
	l.revoked = make(chan Event, 1)
	if l.inert() || l.released {
		return l.revoked
	}
	ctx, cancel := context.WithCancel(context.Background())
	l.stop = cancel
	go l.poll(ctx)
	return l.revoked
}

// poll long-polls the events route until an event arrives, the server says the route or
// token is not served (404, 400), or Release stops it. Failures back off and reconnect.
func (l *Lease) poll(ctx context.Context) {
	delay := l.c.reconnectDelay
	q := "?timeout=" + url.QueryEscape(l.c.eventTimeout.String())
	for ctx.Err() == nil {
		rctx, cancel := context.WithTimeout(ctx, l.c.eventTimeout+10*time.Second)
		status, raw, err := l.c.send(rctx, http.MethodGet, l.path("/events")+q, nil)
		cancel()
		switch {
		case err == nil && status == http.StatusOK:
			var ev Event
			if json.Unmarshal(raw, &ev) == nil {
				l.revoked <- ev
				return
			}
		case err == nil && status == http.StatusNoContent:
			delay = l.c.reconnectDelay
			continue
		case err == nil && (status == http.StatusNotFound || status == http.StatusBadRequest):
			// This server serves no events (the manager without a hub) or refuses the
			// token: Check remains the authority.
			return
		}
		t := time.NewTimer(delay)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		delay = min(2*delay, MaxReconnectDelay)
	}
}
