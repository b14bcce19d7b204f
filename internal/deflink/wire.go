// Package deflink hands lease definitions from the manager to the injected agents
// (docs/security.md, "Agents ask the manager"). The manager alone reads LeaseDefinitions,
// namespaces and the built-in layer from the Kubernetes API; an agent asks it, over the
// manager's admission port, for the merged definitions of its own pod's tenant and follows a
// version number that changes whenever the manager's view may have changed.
//
// Two checks make an answer the agent's own: the manager identifies the calling pod by its
// source address, as on the admission API, and answers only for the tenant of that pod's
// namespace; and every request is signed with the namespace's agent key
// (agentlink.AgentKey), which the webhook gives only to the agents it injects, so that an
// app container of the same pod cannot pose as its agent. Both checks are agentauth's, which
// the manager's other agent endpoints (the sweep and reclaim relays) share.
//
// Handler is the manager's side, Client the agent's; this file is the wire between them.
package deflink

import (
	"errors"
	"fmt"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

// Paths on the manager's admission port.
const (
	// ResolvePath answers the merged definition of one lease reference (POST ResolveRequest).
	ResolvePath = "/internal/lease/definitions/resolve"
	// WatchPath answers once the manager's version differs from the one the agent knows, or
	// after a hold (POST WatchRequest): a long-poll.
	WatchPath = "/internal/lease/definitions/watch"
)

// maxAnswerBytes bounds an answer the agent reads.
const maxAnswerBytes = 64 << 10

// ResolveRequest asks for the merged definition of Name in (Tenant, Project). Tenant must be
// the tenant of the calling pod's namespace.
type ResolveRequest struct {
	Tenant  string `json:"tenant"`
	Project string `json:"project"`
	Name    string `json:"name"`
}

// ResolveAnswer is the outcome of a resolution: exactly one of Definition, Invalid and
// Unavailable is set. Version is the manager's version when it resolved.
type ResolveAnswer struct {
	Version     string          `json:"version"`
	Definition  *Definition     `json:"definition,omitempty"`
	Invalid     *InvalidAnswer  `json:"invalid,omitempty"`
	Unavailable *Unavailability `json:"unavailable,omitempty"`
}

// InvalidAnswer is a *lease.InvalidError of the resolver (a bad name or scope).
type InvalidAnswer struct {
	Field  string `json:"field"`
	Detail string `json:"detail"`
}

// Unavailability is a *definition.UnavailableError of the resolver: Source names the broken
// layer, Message is its cause. Both are about the caller's own tenant's scope or the
// operator's layers of the lease it named; the agent logs them and its caller sees neither
// (docs/security.md, "Errors without internal detail").
type Unavailability struct {
	Source  string `json:"source"`
	Message string `json:"message"`
	// Invalid is the *lease.InvalidError among the causes (a broken document's field), if
	// any; Conflict and Read say that the causes include definition.ErrConflict and
	// definition.ErrLayerRead. The agent rebuilds an error that errors.Is and errors.As
	// classify as the manager's.
	Invalid  *InvalidAnswer `json:"invalid,omitempty"`
	Conflict bool           `json:"conflict,omitempty"`
	Read     bool           `json:"read,omitempty"`
}

// unavailability is ue on the wire.
func unavailability(ue *definition.UnavailableError) *Unavailability {
	u := &Unavailability{Source: ue.Source, Message: fmt.Sprint(ue.Err),
		Conflict: errors.Is(ue.Err, definition.ErrConflict), Read: errors.Is(ue.Err, definition.ErrLayerRead)}
	var invalid *lease.InvalidError
	if errors.As(ue.Err, &invalid) {
		u.Invalid = &InvalidAnswer{Field: invalid.Field, Detail: invalid.Detail}
	}
	return u
}

// cause rebuilds the cause of an unavailability: its message, wrapping what the manager's
// cause wrapped.
func (u Unavailability) cause() error {
	c := remoteCause{msg: u.Message}
	if u.Invalid != nil {
		c.wrapped = append(c.wrapped, &lease.InvalidError{Field: u.Invalid.Field, Detail: u.Invalid.Detail})
	}
	if u.Conflict {
		c.wrapped = append(c.wrapped, definition.ErrConflict)
	}
	if u.Read {
		c.wrapped = append(c.wrapped, definition.ErrLayerRead)
	}
	return c
}

// remoteCause is an error of the manager, as its message and the errors it wrapped.
type remoteCause struct {
	msg     string
	wrapped []error
}

func (e remoteCause) Error() string   { return e.msg }
func (e remoteCause) Unwrap() []error { return e.wrapped }

// Definition is definition.Definition on the wire.
type Definition struct {
	Name     string `json:"name"`
	Resource string `json:"resource"`
	Global   int    `json:"global,omitempty"`
	Tenant   int    `json:"tenant,omitempty"`
	Project  int    `json:"project,omitempty"`
	User     int    `json:"user,omitempty"`
	TTLMs    int64  `json:"ttlMs"`
	WaitMs   int64  `json:"waitMs"`
	Inline   bool   `json:"inline,omitempty"`
	Fairness string `json:"fairness,omitempty"`
	// MaxPriority and PriorityAgeMs: docs/waiting.md, "Priority".
	MaxPriority   int   `json:"maxPriority,omitempty"`
	PriorityAgeMs int64 `json:"priorityAgeMs,omitempty"`
	// Borrow: docs/borrowing.md; absent when borrowing is off.
	Borrow *Borrowing `json:"borrow,omitempty"`
}

// Borrowing is a definition's borrowing on the wire.
type Borrowing struct {
	MaxBorrowed int   `json:"maxBorrowed,omitempty"`
	GraceMs     int64 `json:"graceMs"`
}

// WireDefinition is d on the wire.
func WireDefinition(d definition.Definition) *Definition {
	w := &Definition{
		Name: d.Name, Resource: d.Resource,
		Global: d.Caps.Global, Tenant: d.Caps.Tenant, Project: d.Caps.Project, User: d.Caps.User,
		TTLMs: d.TTL.Milliseconds(), WaitMs: d.Wait.Milliseconds(), Inline: d.Inline, Fairness: string(d.Fairness),
		MaxPriority: d.MaxPriority, PriorityAgeMs: d.PriorityAgeBound.Milliseconds(),
	}
	if d.Borrowing.Enabled {
		w.Borrow = &Borrowing{MaxBorrowed: d.Borrowing.MaxBorrowed, GraceMs: d.Borrowing.Grace.Milliseconds()}
	}
	return w
}

// Definition is the wire form back as a definition.Definition.
func (w Definition) Definition() definition.Definition {
	d := definition.Definition{
		Name: w.Name, Resource: w.Resource,
		Caps: definition.Caps{Global: w.Global, Tenant: w.Tenant, Project: w.Project, User: w.User},
		TTL:  time.Duration(w.TTLMs) * time.Millisecond, Wait: time.Duration(w.WaitMs) * time.Millisecond,
		Inline: w.Inline, Fairness: definition.Fairness(w.Fairness),
		MaxPriority: w.MaxPriority, PriorityAgeBound: time.Duration(w.PriorityAgeMs) * time.Millisecond,
	}
	if b := w.Borrow; b != nil {
		d.Borrowing = definition.Borrowing{Enabled: true, MaxBorrowed: b.MaxBorrowed, Grace: time.Duration(b.GraceMs) * time.Millisecond}
	}
	return d
}

// WatchRequest waits for a version other than Version ("" answers at once).
type WatchRequest struct {
	Version string `json:"version"`
}

// WatchAnswer is the manager's current version and what it knows of the calling pod's
// namespace: the tenant it belongs to (Tenant empty and Labelled false when none) and the
// system namespace.
type WatchAnswer struct {
	Version         string `json:"version"`
	Tenant          string `json:"tenant,omitempty"`
	Labelled        bool   `json:"labelled"`
	SystemNamespace string `json:"systemNamespace"`
}
