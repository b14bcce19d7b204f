package revocation

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Site says where a handler runs.
type Site string

// The two places a handler runs.
const (
	// SiteHolderPod: in the holder's own pod (locally, or in its agent after a forward). The
	// resource is here: tell the app (notify hub), so it stops using it.
	SiteHolderPod Site = "holder-pod"
	// SiteReaper: on a reaper, for a dead holder pod whose resource lives elsewhere (not
	// podBound). Only the payload is left to clean up with.
	SiteReaper Site = "reaper"
)

// Revocation is one revoked holder, as a handler sees it.
type Revocation struct {
	// Token is the holder's secret, for what must reach the holder itself (the notify
	// long-poll, the forward to its pod's agent); logs and Events name HolderID.
	Token string
	// HolderID is the public holder ID (lease.HolderID of Token).
	HolderID  string
	Type      string
	Resource  string
	LeaseName string
	HolderRef string
	// Reason is idle, pod, revoke or reclaim.
	Reason   string
	Pod      lease.PodRef
	PodBound bool
	// Payload is what the holder stored for cleanup (mcp: endpoint, sessionId, ...).
	Payload map[string]string
	Site    Site
}

// FromHolder builds the revocation of h for reason at site.
func FromHolder(h lease.Holder, reason string, site Site) Revocation {
	return Revocation{
		Token:     h.Token,
		HolderID:  holderID(h),
		Type:      h.Type,
		Resource:  h.Resource,
		LeaseName: h.LeaseName,
		HolderRef: h.HolderRef,
		Reason:    reason,
		Pod:       h.Pod,
		PodBound:  h.PodBound,
		Payload:   maps.Clone(h.Payload),
		Site:      site,
	}
}

// Handler cleans up after a revoked lease of one type. OnRevoked must honour ctx and be
// idempotent: a revocation can arrive late (after the holder released and re-acquired), or
// twice (a forward that timed out after delivery falls back to the dead path).
type Handler interface {
	OnRevoked(ctx context.Context, r Revocation) error
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, r Revocation) error

// OnRevoked calls f.
func (f HandlerFunc) OnRevoked(ctx context.Context, r Revocation) error { return f(ctx, r) }

// Registry maps lease types to handlers. Acquire rejects a type the registry does not have
// (the reaper must be able to dispatch later), so its Has is the admission library's
// TypeRegistry. Safe for concurrent use.
type Registry struct {
	mu       sync.RWMutex
	handlers map[string]Handler
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{handlers: map[string]Handler{}}
}

// Register adds the handler of typ. A type is registered once.
func (r *Registry) Register(typ string, h Handler) error {
	if typ == "" || h == nil {
		return fmt.Errorf("registering lease type %q: empty type or nil handler", typ)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, dup := r.handlers[typ]; dup {
		return fmt.Errorf("registering lease type %q: already registered", typ)
	}
	r.handlers[typ] = h
	return nil
}

// Has reports whether typ has a handler.
func (r *Registry) Has(typ string) bool {
	_, ok := r.Handler(typ)
	return ok
}

// Handler returns the handler of typ.
func (r *Registry) Handler(typ string) (Handler, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	h, ok := r.handlers[typ]
	return h, ok
}

// Types lists the registered types, sorted.
func (r *Registry) Types() []string {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return slices.Sorted(maps.Keys(r.handlers))
}

// holderID is h's public ID, derived when h came without one.
func holderID(h lease.Holder) string {
	if h.ID != "" {
		return h.ID
	}
	return lease.HolderID(h.Token)
}
