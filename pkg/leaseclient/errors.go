package leaseclient

import (
	"errors"
	"fmt"
	"time"
)

// The outcomes of the admission API, checked with errors.Is. Each is carried by one typed
// error (BusyError, UnavailableError, LostError, InvalidError, TenantForbiddenError) that can be read with
// errors.As. The codes are the "error" field of the API's error body.
var (
	// ErrBusy: a level was full after the wait; the error is a *BusyError.
	ErrBusy = errors.New(CodeBusy)
	// ErrUnavailable: the lease store or a definition failed, or the API could not be
	// reached or answered something unexpected. Do not use the resource unprotected.
	ErrUnavailable = errors.New(CodeUnavailable)
	// ErrLost: the lease is gone (released, reaped or revoked); the error is a *LostError.
	// Stop using the resource.
	ErrLost = errors.New(CodeLost)
	// ErrInvalid: the request was refused as malformed and nothing was written; the error
	// is an *InvalidError naming the field.
	ErrInvalid = errors.New(CodeInvalid)
	// ErrTenantForbidden: the caller may not act for the tenant it named (a pod acts only for
	// the tenant of its namespace); nothing was written. The error is a *TenantForbiddenError.
	ErrTenantForbidden = errors.New(CodeTenantForbidden)
)

// Error codes of the API's error body.
const (
	CodeInvalid     = "INVALID_REQUEST"
	CodeBusy        = "LEASE_BUSY"
	CodeLost        = "LEASE_LOST"
	CodeUnavailable = "LEASE_UNAVAILABLE"

	CodeTenantForbidden = "TENANT_FORBIDDEN"
)

// BusyError is LEASE_BUSY with the diagnosis the server sent: the first level, narrow to
// wide, that was full.
type BusyError struct {
	// Lease names, for an acquisition of several leases, the one that was full; the
	// others were not booked either. Empty for a single lease.
	Lease string
	// Resource is the counter key of the lease.
	Resource string
	// Level is user, project, tenant or global.
	Level string
	// Scope is the level's scope ("acme/p1", "*" for global).
	Scope string
	// Count and Cap are the occupancy the server saw.
	Count, Cap int
	// Waited is how long the server waited for a slot.
	Waited time.Duration
	// Explained: the server said how many waited ahead at the full level (Position) when it
	// answered. EstimatedWait is its estimate of the wait from there, from the resource's
	// recent hold times (0: none); an estimate, never a promise.
	Explained     bool
	Position      int
	EstimatedWait time.Duration
	// Message is the server's text.
	Message string
}

func (e *BusyError) Error() string {
	part := ""
	if e.Lease != "" {
		part = " (lease " + e.Lease + ")"
	}
	return fmt.Sprintf("lease busy: resource %s%s is full at level %s (scope %s): %d of %d in use, waited %s",
		e.Resource, part, e.Level, e.Scope, e.Count, e.Cap, e.Waited)
}

// Is makes errors.Is(err, ErrBusy) hold.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// UnavailableError is LEASE_UNAVAILABLE: the server said so (Status 503), or the call
// failed before an answer (Status 0, Err the transport error), or the answer was not one
// the API gives (Status as received).
type UnavailableError struct {
	// Op is the call: "acquire", "check", "payload", "release", "events".
	Op string
	// Status is the HTTP status, 0 when no answer arrived.
	Status int
	// Message is the server's text, when it sent one.
	Message string
	// Err is the transport or decoding error, if any.
	Err error
}

func (e *UnavailableError) Error() string {
	switch {
	case e.Err != nil:
		return fmt.Sprintf("lease unavailable: %s: %v", e.Op, e.Err)
	case e.Message != "":
		return fmt.Sprintf("lease unavailable: %s: %s", e.Op, e.Message)
	default:
		return fmt.Sprintf("lease unavailable: %s: unexpected HTTP status %d", e.Op, e.Status)
	}
}

// Is makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the transport error, so that errors.Is(err, context.DeadlineExceeded)
// tells a timeout of the caller's context apart.
func (e *UnavailableError) Unwrap() error { return e.Err }

// InvalidError is INVALID_REQUEST: Field names the offending request field as the server
// spelled it ("tenant", "payload", "inline.levels.global", "waitMs"); nothing was written.
type InvalidError struct {
	Field   string
	Message string
}

func (e *InvalidError) Error() string {
	return fmt.Sprintf("invalid lease request: %s", e.Message)
}

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// TenantForbiddenError is TENANT_FORBIDDEN: the calling pod is in Namespace, which speaks for
// NamespaceTenant (empty when the namespace has no tenant label, and both empty when the
// caller is no pod). Omit Request.Tenant to act for the namespace's tenant.
type TenantForbiddenError struct {
	Namespace       string
	NamespaceTenant string
	// Message is the server's text.
	Message string
}

func (e *TenantForbiddenError) Error() string {
	return fmt.Sprintf("tenant forbidden: %s", e.Message)
}

// Is makes errors.Is(err, ErrTenantForbidden) hold.
func (e *TenantForbiddenError) Is(target error) bool { return target == ErrTenantForbidden }

// LostError is LEASE_LOST: the lease was released, reaped or revoked. Op is the call that
// found it lost ("check", "payload"), Message the server's text.
type LostError struct {
	Op      string
	Message string
}

func (e *LostError) Error() string {
	return fmt.Sprintf("lease lost: %s: %s", e.Op, e.Message)
}

// Is makes errors.Is(err, ErrLost) hold.
func (e *LostError) Is(target error) bool { return target == ErrLost }
