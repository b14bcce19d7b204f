package definition

import "time"

// Defaults for fields no layer sets.
const (
	// DefaultTTL is the idle TTL when no layer sets ttlSeconds.
	DefaultTTL = 120 * time.Second
	// DefaultWait is the wait for a free slot when no layer sets waitMs.
	DefaultWait = 10 * time.Second
	// DefaultFairness is the policy when no layer sets fairness: on the development server,
	// which runs one command at a time, the global queue's extra round trips cost a contended
	// resource most of its throughput (docs/waiting.md, "The fairness field").
	DefaultFairness = FairProcess
)

// Fairness is the definition's deprecated fairness field. Both values behave alike: the
// waiters of a full level are served oldest first across processes, through the level's line
// in the store (docs/waiting.md). It is still merged and shown, so that existing definitions
// keep validating.
type Fairness string

const (
	// FairProcess is the default value.
	FairProcess Fairness = "process"
	// FairGlobal is accepted for compatibility.
	FairGlobal Fairness = "global"
)

// Valid reports whether f is a known policy.
func (f Fairness) Valid() bool { return f == FairProcess || f == FairGlobal }

// NoneReference is the lease reference that disables the lease ("none" or empty means no
// lease; docs/design.md, "NOOP").
const NoneReference = "none"

// InlineResourcePrefix starts the project-private resource of an inline definition:
// mcp-inline:<tenant>/<project>/<name>.
const InlineResourcePrefix = "mcp-inline:"

// InlineResource is the resource of the inline definition name in (tenant, project): the
// tenant's own, since no two tenants' inline resources share a prefix.
func InlineResource(tenant, project, name string) string {
	return InlineResourcePrefix + tenant + "/" + project + "/" + name
}

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
	// Fairness is the order across processes in which waiters get freed slots.
	Fairness Fairness
	// MaxPriority is the highest priority an acquisition may ask for; 0 allows only 0
	// (docs/waiting.md, "Priority").
	MaxPriority int
	// PriorityAgeBound, when positive, serves a waiter that has waited that long as of the
	// highest priority (MaxPriority of the package), so that a steady stream of urgent
	// waiters cannot starve it; 0 is off.
	PriorityAgeBound time.Duration
	// Borrowing lets a tenant use idle capacity above its tenant cap (docs/borrowing.md).
	Borrowing Borrowing
}

// DefaultBorrowGrace is the reclaim's grace when no layer sets borrowing.graceSeconds.
const DefaultBorrowGrace = 5 * time.Second

// Borrowing is the merged borrowing of a definition.
type Borrowing struct {
	// Enabled: a tenant may take slots above its tenant cap while the global level has room
	// and no other tenant's waiter below its cap stands there.
	Enabled bool
	// MaxBorrowed bounds the slots one tenant holds above its cap; 0: the global cap only.
	MaxBorrowed int
	// Grace is how long a waiter of a tenant below its cap, blocked at the global level,
	// waits before a borrowed slot is revoked for it.
	Grace time.Duration
}

// Borrows reports whether acquisitions under d may borrow: borrowing is on and both the
// tenant and the global level are capped (there is something to exceed and a ceiling).
func (d Definition) Borrows() bool {
	return d.Borrowing.Enabled && d.Caps.Tenant > 0 && d.Caps.Global > 0
}

// NoOp reports whether the definition caps no level: acquisitions succeed without any store
// traffic (docs/design.md, "NOOP").
func (d Definition) NoOp() bool { return d.Caps == Caps{} }
