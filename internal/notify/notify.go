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

// DefaultMaxEvents bounds the events a hub keeps. Forwarded revocations arrive from the
// pod network; a flood of them must not grow the agent's memory without end.
const DefaultMaxEvents = 10000

// DefaultMaxBytes bounds the bytes of the events a hub keeps (their strings plus a fixed
// overhead each, see eventSize), whatever their count.
const DefaultMaxBytes = 4 << 20

// MaxFieldLen is the longest token, reason, type or resource an event keeps; longer values
// are cut, so that one event costs at most a few hundred bytes.
const MaxFieldLen = 256

// eventOverhead approximates the fixed cost of one kept event (map entry, order entry,
// time values).
const eventOverhead = 128

func eventSize(ev Event) int {
	return eventOverhead + len(ev.Token) + len(ev.Reason) + len(ev.Type) + len(ev.Resource)
}

func truncate(s string) string {
	if len(s) > MaxFieldLen {
		return s[:MaxFieldLen]
	}
	return s
}

// Hub keeps the latest event per token for a while, so a waiter that arrives after the
// revocation still hears of it, and wakes waiters when one is published. It keeps at most
// maxEvents events, dropping the oldest first.
type Hub struct {
	mu       sync.Mutex
	events   map[string]kept
	order    []published // publish order; order[head:] are live entries (maybe superseded)
	head     int
	seq      uint64
	waiters  map[string][]chan Event
	keep     time.Duration
	max      int
	maxBytes int
	bytes    int // eventSize of the kept events
	clock    clock.PassiveClock
}

// kept is a token's latest event and the sequence number of its publish.
type kept struct {
	ev  Event
	seq uint64
}

// published is one entry of the hub's publish order.
type published struct {
	token string
	at    time.Time
	seq   uint64
}

// HubOption configures a Hub.
type HubOption func(*Hub)

// WithMaxEvents bounds the kept events (default DefaultMaxEvents).
func WithMaxEvents(n int) HubOption { return func(h *Hub) { h.max = max(n, 1) } }

// WithMaxBytes bounds the bytes of the kept events (default DefaultMaxBytes).
func WithMaxBytes(n int) HubOption { return func(h *Hub) { h.maxBytes = max(n, 1) } }

// NewHub returns a hub that keeps delivered events for keep, so a poll that arrives after
// the revocation still sees it.
func NewHub(keep time.Duration, clk clock.PassiveClock, opts ...HubOption) *Hub {
	h := &Hub{events: map[string]kept{}, waiters: map[string][]chan Event{}, keep: keep, max: DefaultMaxEvents, maxBytes: DefaultMaxBytes, clock: clk}
	for _, o := range opts {
		o(h)
	}
	return h
}

// Len is the number of events kept.
func (h *Hub) Len() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.events)
}

// Bytes is the size of the events kept, as the hub counts it against its byte bound.
func (h *Hub) Bytes() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.bytes
}

// Publish records ev for its token and wakes every waiter on that token. Fields longer
// than MaxFieldLen are cut; the oldest events are dropped beyond the count and byte bounds.
func (h *Hub) Publish(ev Event) {
	h.mu.Lock()
	defer h.mu.Unlock()
	now := h.clock.Now()
	h.gc(now)
	if ev.At.IsZero() {
		ev.At = now
	}
	ev.Token, ev.Reason, ev.Type, ev.Resource = truncate(ev.Token), truncate(ev.Reason), truncate(ev.Type), truncate(ev.Resource)
	h.seq++
	if old, ok := h.events[ev.Token]; ok {
		h.bytes -= eventSize(old.ev)
	}
	h.events[ev.Token] = kept{ev: ev, seq: h.seq}
	h.bytes += eventSize(ev)
	h.order = append(h.order, published{token: ev.Token, at: now, seq: h.seq})
	for len(h.events) > h.max || (h.bytes > h.maxBytes && len(h.events) > 1) {
		h.dropOldest()
	}
	for _, w := range h.waiters[ev.Token] {
		w <- ev
	}
	delete(h.waiters, ev.Token)
}

// Waiting is the number of polls waiting for token's event (tests publish once one waits).
func (h *Hub) Waiting(token string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.waiters[token])
}

// Wait returns the event for token, waiting until one is published or ctx is done
// (ok=false).
func (h *Hub) Wait(ctx context.Context, token string) (Event, bool) {
	h.mu.Lock()
	if k, ok := h.events[token]; ok {
		h.mu.Unlock()
		return k.ev, true
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

// gc drops events published more than keep ago, oldest first, so a publish costs O(1)
// amortised; called with the lock held.
func (h *Hub) gc(now time.Time) {
	cutoff := now.Add(-h.keep)
	for h.head < len(h.order) && h.order[h.head].at.Before(cutoff) {
		h.dropOldest()
	}
}

// dropOldest forgets the oldest entry of the publish order (its event, unless a later
// publish of the same token superseded it); called with the lock held.
func (h *Hub) dropOldest() {
	p := h.order[h.head]
	h.order[h.head] = published{}
	h.head++
	if k, ok := h.events[p.token]; ok && k.seq == p.seq {
		h.bytes -= eventSize(k.ev)
		delete(h.events, p.token)
	}
	if h.head > len(h.order)/2 { // compact, keeping the slice proportional to what is live
		h.order = append(h.order[:0], h.order[h.head:]...)
		h.head = 0
	}
}
