package lease

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"
)

// The outcomes of an acquisition and of the calls on a held lease, checked with errors.Is.
// Each has one typed error that carries its diagnosis; see docs/api.md for how they appear on
// the wire.
var (
	// ErrBusy: a level was full (after the wait, if any); the error is a *BusyError.
	ErrBusy = errors.New("LEASE_BUSY")
	// ErrUnavailable: the store or a definition failed; the resource must not be used
	// unprotected (fail closed). The error is usually an *UnavailableError.
	ErrUnavailable = errors.New("LEASE_UNAVAILABLE")
	// ErrLost: the holder is gone (released, reaped or revoked).
	ErrLost = errors.New("LEASE_LOST")
	// ErrInvalid: the request is malformed and nothing was written; the error is an
	// *InvalidError naming the field.
	ErrInvalid = errors.New("INVALID_REQUEST")
	// ErrTenantForbidden: the caller may not act for the tenant it named (a pod speaks only
	// for the tenant of its own namespace) and nothing was written; the error is a
	// *TenantForbiddenError.
	ErrTenantForbidden = errors.New("TENANT_FORBIDDEN")
)

// BusyError is LEASE_BUSY with its diagnosis: the first level, narrow to wide, that was full.
type BusyError struct {
	// Lease names the part that is full, for an acquisition of several resources; "" for
	// one of a single resource.
	Lease    string
	Resource string
	Level    Level
	Scope    string
	Count    int
	Cap      int
	// Waited is how long the acquisition waited for a slot (zero for a single attempt).
	Waited time.Duration
	// Err is why a wait ended early (the caller's context), or nil when it ran out.
	Err error
	// Explained: Position and EstimatedWait are known. Position is the number of live
	// waiters ahead at the level when the answer was given (all of its line for an
	// acquisition that did not wait in it); EstimatedWait is EstimateWait from there (0:
	// no estimate, the resource has no recent hold times).
	Explained     bool
	Position      int
	EstimatedWait time.Duration
}

// Error describes the full level and the wait.
func (e *BusyError) Error() string {
	msg := fmt.Sprintf("%s: resource %s is full at level %s (scope %s): %d of %d in use",
		ErrBusy, e.Resource, e.Level, e.Scope, e.Count, e.Cap)
	if e.Lease != "" {
		msg += fmt.Sprintf(" (part %s)", e.Lease)
	}
	if e.Waited > 0 {
		msg += fmt.Sprintf(", waited %s", e.Waited.Round(time.Millisecond))
	}
	if e.Explained {
		msg += fmt.Sprintf(", %d waiting ahead", e.Position)
		if e.EstimatedWait > 0 {
			msg += fmt.Sprintf(", a slot in about %s", e.EstimatedWait.Round(time.Millisecond))
		}
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

// Is makes errors.Is(err, ErrBusy) hold.
func (e *BusyError) Is(target error) bool { return target == ErrBusy }

// Unwrap returns the cause of an early end, if any.
func (e *BusyError) Unwrap() error { return e.Err }

// UnavailableError is LEASE_UNAVAILABLE: Op says what failed ("acquiring tex2pdf",
// "resolving lease tex"), Err why.
type UnavailableError struct {
	Op  string
	Err error
}

// Error describes what failed.
func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s: %s: %v", ErrUnavailable, e.Op, e.Err)
}

// Is makes errors.Is(err, ErrUnavailable) hold.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Unavailable wraps err as an *UnavailableError unless it already is one.
func Unavailable(op string, err error) error {
	var ue *UnavailableError
	if errors.As(err, &ue) {
		return err
	}
	return &UnavailableError{Op: op, Err: err}
}

// InvalidError is the one field error of the project: Field names the offending field as the
// caller spelled it ("tenant", "payload", "inline.levels.global", "spec.levels.user"),
// Detail what is wrong with it.
type InvalidError struct {
	Field  string
	Detail string
}

// Error names the field and the problem.
func (e *InvalidError) Error() string { return e.Field + ": " + e.Detail }

// Is makes errors.Is(err, ErrInvalid) hold.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// TenantForbiddenError is TENANT_FORBIDDEN: who the caller is and which tenant, if any, it
// speaks for (docs/tenancy.md, "Who may acquire for a tenant").
type TenantForbiddenError struct {
	// Pod is the calling pod; zero when the caller is no pod.
	Pod PodRef
	// Addr is the caller's source address, set when the caller is no pod.
	Addr string
	// NamespaceTenant is the tenant of the pod's namespace; empty when the namespace carries
	// no tenant label.
	NamespaceTenant string
	// Label is the namespace label that names a namespace's tenant.
	Label string
	// Requested is the tenant the request named; empty when it named none.
	Requested string
}

// Error says where the caller is and what it may speak for.
func (e *TenantForbiddenError) Error() string {
	asked := "a tenant"
	if e.Requested != "" {
		asked = fmt.Sprintf("tenant %q", Clip(e.Requested, 64))
	}
	switch {
	case e.Pod.Name == "":
		return fmt.Sprintf("%s: the caller %s is no running pod this server can see; callers that are not pods are refused here (a pod acts for the tenant of its namespace)",
			ErrTenantForbidden, Clip(e.Addr, 64))
	case e.NamespaceTenant == "":
		return fmt.Sprintf("%s: the calling pod %s is in namespace %q, which has no %s label and so speaks for no tenant; it may not act for %s",
			ErrTenantForbidden, e.Pod, e.Pod.Namespace, e.Label, asked)
	default:
		return fmt.Sprintf("%s: the calling pod %s is in namespace %q, which speaks for tenant %q (label %s); it may not act for %s",
			ErrTenantForbidden, e.Pod, e.Pod.Namespace, e.NamespaceTenant, e.Label, asked)
	}
}

// Is makes errors.Is(err, ErrTenantForbidden) hold.
func (e *TenantForbiddenError) Is(target error) bool { return target == ErrTenantForbidden }

// Invalid builds an *InvalidError with a formatted detail.
func Invalid(field, format string, args ...any) error {
	return &InvalidError{Field: field, Detail: fmt.Sprintf(format, args...)}
}

// Clip shortens a caller-supplied or remote value for an error message or an Event: at most n
// bytes, cut on a rune boundary, with an ellipsis when cut.
func Clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}

// CorrelationID returns a random id that ties an answer without internal detail (an HTTP
// error body, a pod's condition, an Event) to the server's log line that carries the cause
// (docs/security.md, "Errors without internal detail").
func CorrelationID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (Go 1.24)
	return hex.EncodeToString(b)
}
