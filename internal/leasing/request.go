package leasing

import (
	"regexp"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Request is one acquisition (docs/design.md, "The consumer contract").
type Request struct {
	// Type is the handler type, set by consumer code; it must have a registered handler.
	Type string
	// Lease is a name reference; "none" or "" means no lease (NOOP). Exclusive with Inline.
	Lease string
	// Leases names several leases to be granted all together or not at all (docs/waiting.md,
	// "Several resources at once"); exclusive with Lease and Inline.
	Leases []string
	// Inline is an inline definition (no layers, project-private counter).
	Inline *definition.InlineSpec
	// Tenant and Project are required; User is required when the user level is capped.
	Tenant, Project, User string
	// HolderRef is the consumer's reference (process, job, session).
	HolderRef string
	// Pod is the holder's pod; empty when the server does not know it (only idle reap applies).
	Pod lease.PodRef
	// PodBound tells the reaper that the resource dies with the holder's pod.
	PodBound bool
	// Payload is what the handler needs for cleanup; updatable later.
	Payload map[string]string
	// Wait, when set, shortens the definition's wait; it never lengthens it.
	Wait *time.Duration
	// Priority orders the acquisition among the waiters of a full level: highest first,
	// oldest first within a priority (docs/waiting.md, "Priority"). 0 by default; at most the
	// definition's MaxPriority. It never revokes a holder.
	Priority int
	// WaitFor, when set, replaces the definition's wait and Wait: for callers inside the
	// manager that wait on a workload's behalf for as long as it exists (pod admission,
	// docs/pod-admission.md), ending the wait by cancelling ctx. The HTTP API never sets it.
	WaitFor *time.Duration
	// Queued, when set, is called when the acquisition has its place: after its first
	// attempt, which either put it in a line or answered. Callers that start acquisitions one
	// after another use it to keep their order in the line. It must not block.
	Queued func()
}

// Lease is the outcome of a successful acquisition.
type Lease struct {
	// Token identifies the holder; empty for a NOOP lease.
	Token string
	// NoOp is true when no lease applies: nothing was booked and Check/Release are not needed.
	NoOp bool
	// Name is the lease name of the definition.
	Name string
	// Resource is the counter key.
	Resource string
	// Levels are the booked levels, narrow to wide.
	Levels []LevelInfo
	// TTL is the idle time after the last check after which the lease may be reaped.
	TTL time.Duration
	// Fence strictly increases with every grant of the resource (docs/fencing.md).
	Fence int64
	// Parts are the leases of an acquisition of several (Request.Leases), in the order of
	// their resources, each with its levels and fence; Name then joins their names with "+",
	// and Resource, Levels and Fence are unset.
	Parts []PartLease
}

// PartLease is one lease of an acquisition of several.
type PartLease struct {
	Name     string
	Resource string
	Levels   []LevelInfo
	Fence    int64
}

// LevelInfo is one booked level of a lease.
type LevelInfo struct {
	Level lease.Level
	Scope string
	Cap   int
}

// Bounds of request fields.
const (
	// MaxPayloadEntries is the largest number of payload entries (the store's bound).
	MaxPayloadEntries = 32
	// MaxPayloadValueBytes bounds one payload value.
	MaxPayloadValueBytes = 2048
	// MaxHolderRefBytes bounds the holder reference.
	MaxHolderRefBytes = 256
	// MaxWait is the longest wait a request may ask for (the definitions' bound).
	MaxWait = definition.MaxWaitMs * time.Millisecond
)

var (
	typePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// Users are scoped per tenant (tenant/user): no '/' and no '|' (the counter ID separator).
	userPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.@+-]{0,127}$`)
	// Payload keys are stored as document field names: no '.', no '$'.
	payloadKeyPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	tokenPattern      = regexp.MustCompile(`^[A-Za-z0-9_-]{1,128}$`)
	// Pod namespace and name: DNS labels and subdomains, bounded.
	podPattern = regexp.MustCompile(`^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$`)
)

// ValidToken reports whether token is syntactically a lease token.
func ValidToken(token string) bool { return tokenPattern.MatchString(token) }

// validate checks a request before anything is resolved or written.
func (s *Service) validate(req Request) error {
	if err := s.validateType(req.Type); err != nil {
		return err
	}
	return validateFields(req)
}

// validateType checks the lease type: one with a registered revocation handler.
func (s *Service) validateType(leaseType string) error {
	switch {
	case leaseType == "":
		return lease.Invalid("type", "is required")
	case !typePattern.MatchString(leaseType):
		return lease.Invalid("type", "%q is not a valid lease type", lease.Clip(leaseType, 64))
	case s.types == nil || !s.types.Has(leaseType):
		return lease.Invalid("type", "no handler is registered for lease type %q", leaseType)
	}
	return nil
}

// validateFields checks every field of a request but its type.
func validateFields(req Request) error {
	if req.Inline != nil && req.Lease != "" {
		return lease.Invalid("inline", "lease and inline are mutually exclusive")
	}
	if err := validateLeases(req); err != nil {
		return err
	}
	if req.Lease != "" && req.Lease != definition.NoneReference && !definition.ValidName(req.Lease) {
		return lease.Invalid("lease", "%q is not a valid lease name (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", lease.Clip(req.Lease, 64))
	}
	if req.Tenant == "" {
		return lease.Invalid("tenant", "is required")
	}
	if req.Project == "" {
		return lease.Invalid("project", "is required")
	}
	// The definition layers' reserved scope names are no holder's: tenant _vance would book
	// the system scope, project _tenant would skip the project layer and level.
	if req.Tenant == definition.SystemTenant {
		return lease.Invalid("tenant", "%q is reserved for the system layer", req.Tenant)
	}
	if req.Project == definition.TenantProject {
		return lease.Invalid("project", "%q is reserved for the tenant layer", req.Project)
	}
	if err := definition.ValidateScope(req.Tenant, req.Project); err != nil {
		return definitionError("validating scope", err)
	}
	if req.User != "" && !userPattern.MatchString(req.User) {
		return lease.Invalid("user", "%q is not a valid user ID", lease.Clip(req.User, 64))
	}
	if len(req.HolderRef) > MaxHolderRefBytes || !printable(req.HolderRef) {
		return lease.Invalid("holderRef", "must be printable UTF-8 of at most %d bytes", MaxHolderRefBytes)
	}
	if err := validatePod(req.Pod); err != nil {
		return err
	}
	if err := validatePayload(req.Payload); err != nil {
		return err
	}
	if req.Priority < 0 {
		return lease.Invalid("priority", "must be between 0 and the lease's maxPriority, got %d", req.Priority)
	}
	if req.Wait != nil && (*req.Wait < 0 || *req.Wait > MaxWait) {
		return lease.Invalid("waitMs", "must be between 0 and %d", MaxWait.Milliseconds())
	}
	return nil
}

// validateLeases checks the names of an acquisition of several leases: one to
// leasestore.MaxParts names, each valid, none twice, and neither lease nor inline beside them.
func validateLeases(req Request) error {
	if req.Leases == nil {
		return nil
	}
	switch {
	case req.Lease != "" || req.Inline != nil:
		return lease.Invalid("leases", "is exclusive with lease and inline")
	case len(req.Leases) == 0 || len(req.Leases) > leasestore.MaxParts:
		return lease.Invalid("leases", "names %d leases, want 1 to %d", len(req.Leases), leasestore.MaxParts)
	}
	seen := map[string]bool{}
	for _, name := range req.Leases {
		switch {
		case name == definition.NoneReference:
			return lease.Invalid("leases", "%q names no lease: leave it out of the list", name)
		case !definition.ValidName(name):
			return lease.Invalid("leases", "%q is not a valid lease name (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", lease.Clip(name, 64))
		case seen[name]:
			return lease.Invalid("leases", "names %s twice", name)
		}
		seen[name] = true
	}
	return nil
}

func validatePod(p lease.PodRef) error {
	if p == (lease.PodRef{}) {
		return nil
	}
	if !podPattern.MatchString(p.Namespace) || !podPattern.MatchString(p.Name) || len(p.UID) > 128 || !printable(p.UID) {
		return lease.Invalid("pod", "%q (uid %q) is not a valid pod", lease.Clip(p.String(), 64), lease.Clip(p.UID, 64))
	}
	return nil
}

func validatePayload(payload map[string]string) error {
	if len(payload) > MaxPayloadEntries {
		return lease.Invalid("payload", "has %d entries, at most %d", len(payload), MaxPayloadEntries)
	}
	for k, v := range payload {
		if !payloadKeyPattern.MatchString(k) {
			return lease.Invalid("payload", "key %q is not valid (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", lease.Clip(k, 64))
		}
		if len(v) > MaxPayloadValueBytes || !utf8.ValidString(v) {
			return lease.Invalid("payload", "value of %q must be UTF-8 of at most %d bytes", k, MaxPayloadValueBytes)
		}
	}
	return nil
}

func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}

// truncate shortens a rejected value for an error message.
