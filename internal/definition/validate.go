package definition

import (
	"errors"
	"fmt"
	"regexp"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Bounds of the numeric fields; the CRD schema carries the same bounds.
const (
	// MaxTTLSeconds is the largest ttlSeconds (one day).
	MaxTTLSeconds = 86400
	// MaxWaitMs is the largest waitMs (ten minutes).
	MaxWaitMs = 600000
	// MaxPriority is the largest maxPriority, and so the highest priority a request may ask
	// for (docs/waiting.md, "Priority").
	MaxPriority = 1000
	// MaxPriorityAgeBoundSeconds is the largest priorityAgeBoundSeconds (one day).
	MaxPriorityAgeBoundSeconds = 86400
	// MaxBorrowed is the largest borrowing.maxBorrowed.
	MaxBorrowed = 100000
	// MaxBorrowGraceSeconds is the largest borrowing.graceSeconds (an hour).
	MaxBorrowGraceSeconds = 3600
)

var (
	// Lease names are path segments (docs/design.md, "What a definition says").
	namePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$`)
	// Tenant and project IDs; SystemTenant and TenantProject are checked separately.
	idPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)
	// Counter keys: no '|' (the counter ID separator) and no '/' (so no document can name the
	// project-private resource of an inline definition).
	resourcePattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$`)
)

// ValidName reports whether name is a valid lease name.
func ValidName(name string) bool { return namePattern.MatchString(name) }

// ValidateScope checks the tenant and project of a request. Tenant SystemTenant and project
// TenantProject are accepted: they resolve the system and the tenant-wide scope.
func ValidateScope(tenant, project string) error {
	if tenant != SystemTenant && !idPattern.MatchString(tenant) {
		return &lease.InvalidError{Field: "tenant", Detail: fmt.Sprintf("%q is not a valid tenant ID", tenant)}
	}
	if project != TenantProject && !idPattern.MatchString(project) {
		return &lease.InvalidError{Field: "project", Detail: fmt.Sprintf("%q is not a valid project ID", project)}
	}
	return nil
}

// ValidateLayer checks a layer document: name, scope matching its kind, and every field it
// sets (owned or not: a document with a broken value is broken). It returns the joined
// *lease.InvalidError values, or nil.
func ValidateLayer(l Layer) error {
	var errs []error
	add := func(field, format string, args ...any) {
		errs = append(errs, &lease.InvalidError{Field: field, Detail: fmt.Sprintf(format, args...)})
	}
	if !ValidName(l.Name) {
		add("name", "%q is not a valid lease name (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", l.Name)
	}
	switch l.Kind {
	case KindBuiltin:
		if l.Tenant != "" || l.Project != "" {
			add("scope", "a built-in document has no tenant or project")
		}
	case KindSystem, KindTenant, KindProject:
		if err := ValidateScope(l.Tenant, l.Project); err != nil {
			var inv *lease.InvalidError
			errors.As(err, &inv)
			add(inv.Field, "%s", inv.Detail)
		} else if got := KindOf(l.Tenant, l.Project); got != l.Kind {
			add("scope", "%s/%s is a %s scope, not %s", l.Tenant, l.Project, got, l.Kind)
		}
		if l.Tenant == SystemTenant && l.Project != TenantProject {
			add("project", "the system layer (tenant %s) must have project %s", SystemTenant, TenantProject)
		}
	default:
		add("kind", "unknown layer kind %q", l.Kind)
	}
	if l.Resource != nil && !resourcePattern.MatchString(*l.Resource) {
		add(string(FieldResource), "%q is not a valid resource (want [A-Za-z0-9][A-Za-z0-9_.:-]{0,127})", *l.Resource)
	}
	for _, c := range []struct {
		field Field
		v     *int32
	}{
		{FieldLevelsGlobal, l.Levels.Global},
		{FieldLevelsTenant, l.Levels.Tenant},
		{FieldLevelsProject, l.Levels.Project},
		{FieldLevelsUser, l.Levels.User},
	} {
		if c.v != nil && *c.v < 1 {
			add(string(c.field), "cap must be at least 1, got %d", *c.v)
		}
	}
	if l.TTLSeconds != nil && (*l.TTLSeconds < 1 || *l.TTLSeconds > MaxTTLSeconds) {
		add(string(FieldTTLSeconds), "must be between 1 and %d, got %d", MaxTTLSeconds, *l.TTLSeconds)
	}
	if l.WaitMs != nil && (*l.WaitMs < 0 || *l.WaitMs > MaxWaitMs) {
		add(string(FieldWaitMs), "must be between 0 and %d, got %d", MaxWaitMs, *l.WaitMs)
	}
	if l.MaxPriority != nil && (*l.MaxPriority < 0 || *l.MaxPriority > MaxPriority) {
		add(string(FieldMaxPriority), "must be between 0 and %d, got %d", MaxPriority, *l.MaxPriority)
	}
	if l.PriorityAgeBoundSeconds != nil && (*l.PriorityAgeBoundSeconds < 0 || *l.PriorityAgeBoundSeconds > MaxPriorityAgeBoundSeconds) {
		add(string(FieldPriorityAge), "must be between 0 and %d, got %d", MaxPriorityAgeBoundSeconds, *l.PriorityAgeBoundSeconds)
	}
	if b := l.Borrowing.MaxBorrowed; b != nil && (*b < 0 || *b > MaxBorrowed) {
		add(string(FieldBorrowMax), "must be between 0 (up to the global cap) and %d, got %d", MaxBorrowed, *b)
	}
	if g := l.Borrowing.GraceSeconds; g != nil && (*g < 0 || *g > MaxBorrowGraceSeconds) {
		add(string(FieldBorrowGrace), "must be between 0 and %d, got %d", MaxBorrowGraceSeconds, *g)
	}
	if l.Fairness != nil && !l.Fairness.Valid() {
		add(string(FieldFairness), "must be %s or %s, got %q", FairProcess, FairGlobal, *l.Fairness)
	}
	return errors.Join(errs...)
}

// CheckLayer is the verdict on one stored document, given every document stored under its
// key (itself included): the fields it sets that its layer does not own, and an error if it
// is broken (the joined *lease.InvalidError values of ValidateLayer) or conflicts with another
// document under the same key (an error wrapping ErrConflict that names the others).
func CheckLayer(l Layer, sameKey []Layer) (ignored []Field, err error) {
	ignored = IgnoredFields(l)
	if err := ValidateLayer(l); err != nil {
		return ignored, err
	}
	var others []string
	for _, o := range sameKey {
		if o.Source != l.Source {
			others = append(others, o.Source)
		}
	}
	if len(others) > 0 {
		return ignored, conflictError(append([]string{l.Source}, others...))
	}
	return ignored, nil
}
