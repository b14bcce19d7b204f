package definition

import (
	"errors"
	"fmt"

	"github.com/vancetope/lease-operator/internal/lease"
)

// ErrConflict marks an UnavailableError caused by two documents for the same
// (leaseName, tenant, project).
var ErrConflict = errors.New("conflicting lease definitions")

// UnavailableError is LEASE_UNAVAILABLE for a definition: a layer the resolution depends on is
// broken (unparseable, invalid, unreadable, or in conflict with another document for the same
// scope), so the lease must not be used. It reports why the definition of a lease is unavailable in a scope.
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

// Is reports lease.ErrUnavailable.
func (e *UnavailableError) Is(target error) bool { return target == lease.ErrUnavailable }

// Unwrap returns the cause.
func (e *UnavailableError) Unwrap() error { return e.Err }
