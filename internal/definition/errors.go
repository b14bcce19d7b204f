package definition

import (
	"errors"
	"fmt"
)

// ErrUnavailable is the outcome LEASE_UNAVAILABLE: a layer the resolution depends on is broken
// (unparseable, invalid, unreadable, or in conflict with another document for the same scope),
// so the lease must not be used. Check with errors.Is; the error is an *UnavailableError.
var ErrUnavailable = errors.New("lease definition unavailable")

// ErrConflict marks an UnavailableError caused by two documents for the same
// (leaseName, tenant, project).
var ErrConflict = errors.New("conflicting lease definitions")

// ErrInvalid is the outcome INVALID_REQUEST: the caller passed a bad lease name, scope or
// inline definition. Check with errors.Is; the error is an *InvalidError naming the field.
var ErrInvalid = errors.New("invalid lease request")

// UnavailableError reports why the definition of a lease is unavailable in a scope.
type UnavailableError struct {
	// Name, Tenant and Project are the scope of the failed resolution (empty when unknown).
	Name, Tenant, Project string
	// Source names the broken layer, e.g. "built-in tex.yaml" or "LeaseDefinition ns/obj".
	Source string
	// Err is the cause.
	Err error
}

func (e *UnavailableError) Error() string {
	scope := ""
	if e.Tenant != "" || e.Project != "" {
		scope = " in " + e.Tenant + "/" + e.Project
	}
	return fmt.Sprintf("lease definition %q unavailable%s: %s: %v", e.Name, scope, e.Source, e.Err)
}

// Is reports ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }

// InvalidError is a bad request: Field names the offending field as the caller spelled it
// (e.g. "lease", "tenant", "inline.levels.global").
type InvalidError struct {
	Field  string
	Detail string
}

func (e *InvalidError) Error() string { return e.Field + ": " + e.Detail }

// Is reports ErrInvalid.
func (e *InvalidError) Is(target error) bool { return target == ErrInvalid }

// FieldError is a validation failure of one field of a layer document. A layer with field
// errors is broken; resolutions that depend on it fail with an *UnavailableError wrapping the
// joined field errors.
type FieldError struct {
	Field  string
	Detail string
}

func (e *FieldError) Error() string { return e.Field + ": " + e.Detail }
