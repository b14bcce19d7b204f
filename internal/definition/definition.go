package definition

import "time"

// Defaults for fields no layer sets.
const (
	// DefaultTTL is the idle TTL when no layer sets ttlSeconds.
	DefaultTTL = 120 * time.Second
	// DefaultWait is the wait for a free slot when no layer sets waitMs.
	DefaultWait = 10 * time.Second
)

// NoneReference is the lease reference that disables the lease ("none" or empty means no
// lease; docs/design.md, "NOOP").
const NoneReference = "none"

// InlineResourcePrefix starts the project-private resource of an inline definition:
// mcp-inline:<tenant>/<project>/<name>.
const InlineResourcePrefix = "mcp-inline:"

// Caps are the merged caps of the four levels; 0 means the level is not capped.
type Caps struct {
	Global, Tenant, Project, User int
}

// Definition is the merged, effective definition of a lease in one scope.
type Definition struct {
	// Name is the lease name; empty for the reference "none".
	Name string
	// Resource is the counter key: the lease name unless a layer sets it; the project-private
	// mcp-inline:<tenant>/<project>/<name> for an inline definition.
	Resource string
	// Caps are the caps; all zero makes the definition a NOOP.
	Caps Caps
	// TTL is the idle time after the last check after which a holder is reaped.
	TTL time.Duration
	// Wait is how long an acquisition waits for a free slot.
	Wait time.Duration
	// Inline is true for a definition carried inline by the consumer.
	Inline bool
}

// NoOp reports whether the definition caps no level: acquisitions succeed without any store
// traffic (docs/design.md, "NOOP").
func (d Definition) NoOp() bool { return d.Caps == Caps{} }
