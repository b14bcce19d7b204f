package admission

import (
	"errors"
	"fmt"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// The outcomes of specification §3, checked with errors.Is. ErrBusy, ErrUnavailable and
// ErrLost are the store's sentinels, so an error satisfies errors.Is for either package.
var (
	// ErrBusy: no slot became free within the wait; the error is a *BusyError.
	ErrBusy = leasestore.ErrBusy
	// ErrUnavailable: the store or the definition failed; the resource must not be used
	// unprotected (fail closed). The error is an *UnavailableError.
	ErrUnavailable = leasestore.ErrUnavailable
	// ErrLost: the lease is gone (released, reaped or revoked).
	ErrLost = leasestore.ErrLost
	// ErrInvalid: the request is malformed; nothing was written. The error is an
	// *InvalidError naming the field.
	ErrInvalid = errors.New("INVALID_REQUEST")
)

// BusyError is LEASE_BUSY with its diagnosis: the first level, narrow to wide, that was
// full when the wait ended.
type BusyError struct {
	Resource string
	Level    leasestore.Level
	Scope    string
	Count    int
	Cap      int
	// Waited is how long the acquisition waited for a slot.
	Waited time.Duration
	// Err is why the wait ended early (the caller's context), or nil when it ran out.
	Err error
}

// Error describes the full level and the wait.
func (e *BusyError) Error() string {
	msg := fmt.Sprintf("lease busy: resource %s is full at level %s (scope %s): %d of %d in use, waited %s",
		e.Resource, e.Level, e.Scope, e.Count, e.Cap, e.Waited.Round(time.Millisecond))
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is reports ErrBusy.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Unwrap returns the cause of an early end, if any.
func (e *BusyError) Unwrap() error { return e.Err }

// UnavailableError is LEASE_UNAVAILABLE: the store could not be reached or failed, or the
// lease definition is broken. The caller must not use the resource.
type UnavailableError struct {
	// Op says what failed, e.g. "acquiring tex2pdf" or "resolving lease tex".
	Op  string
	Err error
}

// Error describes what failed.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("lease unavailable: %s: %v", e.Op, e.Err)
}

// Is reports ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// InvalidError is INVALID_REQUEST: Field names the offending request field as the HTTP API
// spells it (e.g. "tenant", "payload", "inline.levels.global").
type InvalidError struct {
	Field  string
	Detail string
}

// Error names the field and the problem.
func (e *InvalidError) Error() string { return "invalid request: " + e.Field + ": " + e.Detail }

// Is reports ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

func invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// unavailable wraps err as an *UnavailableError unless it already is one.
func unavailable(op string, err error) error {
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return err
	}
	return &UnavailableError{Op: op, Err: err}
}

// definitionError maps an error of the definition resolver to the admission outcomes: a bad
// reference or inline definition is invalid (the field is kept), anything else fails closed.
func definitionError(op string, err error) error {
	var inv *definition.InvalidError
	if errors.As(err, &inv) {
		return &InvalidError{Field: inv.Field, Detail: inv.Detail}
	}
	return &UnavailableError{Op: op, Err: err}
}

// storeError maps an error of a store call: ErrLost and ErrBusy pass through, the store's
// own validation becomes an *InvalidError for field, and everything else fails closed.
func storeError(op, field string, err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, ErrLost), errors.Is(err, ErrBusy):
		return fmt.Errorf("%s: %w", op, err)
	case errors.Is(err, leasestore.ErrInvalid):
		return &InvalidError{Field: field, Detail: err.Error()}
	default:
		return unavailable(op, err)
	}
}
