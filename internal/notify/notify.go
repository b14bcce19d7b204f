// Package notify delivers revocation events to whoever waits on a lease token in this
// process: the agent's long-poll (GET /v1/leases/{token}/events) waits here, and the
// revocation handlers that run in the holder's pod publish here.
package notify

import (
	"context"
	"sync"
	"time"

	"k8s.io/utils/clock"
)

// Event tells a holder that its lease is gone.
type Event struct {
	Token string `json:"token"`
	// Reason is idle, pod or revoke.
	Reason string `json:"reason"`
	Type   string `json:"type"`
	// Resource is the lease's resource.
	Resource string    `json:"resource"`
	At       time.Time `json:"at"`
}

// Hub keeps the latest event per token for a while, so a waiter that arrives after the
// revocation still hears of it, and wakes waiters when one is published.
type Hub struct {
	mu      sync.Mutex
	events  map[string]Event
	waiters map[string][]chan Event
	keep    time.Duration
	clock   clock.PassiveClock
}

// NewHub returns a hub that keeps delivered events for keep, so a poll that arrives after
// the revocation still sees it.
func NewHub(keep time.Duration, clk clock.PassiveClock) *Hub {
	return &Hub{events: map[string]Event{}, waiters: map[string][]chan Event{}, keep: keep, clock: clk}
}

// Publish records ev for its token and wakes every waiter on that token.
func (h *Hub) Publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.gc()
	if ev.At.IsZero() {
		ev.At = h.clock.Now()
	}
	h.events[ev.Token] = ev
	for _, w := range h.waiters[ev.Token] {
		w <- ev
	}
	delete(h.waiters, ev.Token)
}

// Wait returns the event for token, waiting until one is published or ctx is done
// (ok=false).
func (h *Hub) Wait(ctx context.Context, token string) (Event, bool) {
	h.mu.Lock()
	if ev, ok := h.events[token]; ok {
		h.mu.Unlock()
		return ev, true
	}
	ch := make(chan Event, 1)
	h.waiters[token] = append(h.waiters[token], ch)
	h.mu.Unlock()
	select {
	case ev := <-ch:
		return ev, true
	case <-ctx.Done():
		h.mu.Lock()
		ws := h.waiters[token]
		for i, w := range ws {
			if w == ch {
				h.waiters[token] = append(ws[:i], ws[i+1:]...)
				break
			}
		}
		if len(h.waiters[token]) == 0 {
			delete(h.waiters, token)
		}
		h.mu.Unlock()
		select { // published between Done and the lock
		case ev := <-ch:
			return ev, true
		default:
			return Event{}, false
		}
	}
}

// gc drops events older than keep; called with the lock held.
func (h *Hub) gc() {
	cutoff := h.clock.Now().Add(-h.keep)
	for tok, ev := range h.events {
		if ev.At.Before(cutoff) {
			delete(h.events, tok)
		}
	}
}
