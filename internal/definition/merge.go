package definition

import (
	"fmt"
	"slices"
	"strings"
	"time"
)

// Stack is the set of layer documents that apply to one resolution, one slot per layer. A nil
// slot is a layer without a document for the name.
type Stack struct {
	// Scope is the lease name and the (tenant, project) of the resolution.
	Scope LayerKey

	Builtin, System, Tenant, Project *Layer
}

// Ignored lists the fields of one document that its layer does not own.
type Ignored struct {
	Source string
	Kind   Kind
	Fields []Field
}

// Result is a merged definition with its provenance.
type Result struct {
	Definition Definition
	// Origin maps each field some layer set (and owns) to the source of the winning value;
	// fields at their default are absent.
	Origin map[Field]string
	// Ignored lists, per document, the fields ignored because the layer does not own them.
	Ignored []Ignored
}

// Merge merges the stack field by field: for each field, the most specific layer that owns it
// and sets it wins; values from layers that do not own a field are ignored and reported.
// Any invalid document fails the merge with an *UnavailableError (fail closed).
func Merge(s Stack) (Result, error) {
	unavailable := func(source string, err error) (Result, error) {
		return Result{}, &UnavailableError{Name: s.Scope.Name, Tenant: s.Scope.Tenant, Project: s.Scope.Project, Source: source, Err: err}
	}
	slots := []struct {
		kind  Kind
		layer *Layer
	}{
		{KindBuiltin, s.Builtin}, {KindSystem, s.System}, {KindTenant, s.Tenant}, {KindProject, s.Project},
	}
	var layers []Layer
	for _, slot := range slots {
		if slot.layer == nil {
			continue
		}
		l := *slot.layer
		if l.Kind != slot.kind {
			return unavailable(l.Source, fmt.Errorf("a %s document in the %s slot", l.Kind, slot.kind))
		}
		if l.Name != s.Scope.Name {
			return unavailable(l.Source, fmt.Errorf("document for lease %q in the stack of %q", l.Name, s.Scope.Name))
		}
		if err := ValidateLayer(l); err != nil {
			return unavailable(l.Source, err)
		}
		layers = append(layers, l)
	}

	res := Result{Origin: map[Field]string{}}
	var resource *string
	var global, tenant, project, user, ttl, wait, maxPriority, ageBound *int32
	var fairness *Fairness
	var borrowEnabled *bool
	var borrowMax, borrowGrace *int32
	for _, l := range layers {
		if ign := IgnoredFields(l); len(ign) > 0 {
			res.Ignored = append(res.Ignored, Ignored{Source: l.Source, Kind: l.Kind, Fields: ign})
		}
		take := func(f Field, dst **int32, v *int32) {
			if v != nil && Owns(l.Kind, f) {
				*dst = v
				res.Origin[f] = l.Source
			}
		}
		if l.Resource != nil && Owns(l.Kind, FieldResource) {
			resource = l.Resource
			res.Origin[FieldResource] = l.Source
		}
		take(FieldLevelsGlobal, &global, l.Levels.Global)
		take(FieldLevelsTenant, &tenant, l.Levels.Tenant)
		take(FieldLevelsProject, &project, l.Levels.Project)
		take(FieldLevelsUser, &user, l.Levels.User)
		take(FieldTTLSeconds, &ttl, l.TTLSeconds)
		take(FieldWaitMs, &wait, l.WaitMs)
		take(FieldMaxPriority, &maxPriority, l.MaxPriority)
		take(FieldPriorityAge, &ageBound, l.PriorityAgeBoundSeconds)
		take(FieldBorrowMax, &borrowMax, l.Borrowing.MaxBorrowed)
		take(FieldBorrowGrace, &borrowGrace, l.Borrowing.GraceSeconds)
		if l.Borrowing.Enabled != nil && Owns(l.Kind, FieldBorrowEnabled) {
			borrowEnabled = l.Borrowing.Enabled
			res.Origin[FieldBorrowEnabled] = l.Source
		}
		if l.Fairness != nil && Owns(l.Kind, FieldFairness) {
			fairness = l.Fairness
			res.Origin[FieldFairness] = l.Source
		}
	}

	d := Definition{Name: s.Scope.Name, Resource: s.Scope.Name, TTL: DefaultTTL, Wait: DefaultWait, Fairness: DefaultFairness}
	if resource != nil {
		d.Resource = *resource
	}
	if fairness != nil {
		d.Fairness = *fairness
	}
	d.Caps = Caps{Global: deref(global), Tenant: deref(tenant), Project: deref(project), User: deref(user)}
	if ttl != nil {
		d.TTL = time.Duration(*ttl) * time.Second
	}
	if wait != nil {
		d.Wait = time.Duration(*wait) * time.Millisecond
	}
	d.MaxPriority = deref(maxPriority)
	if ageBound != nil {
		d.PriorityAgeBound = time.Duration(*ageBound) * time.Second
	}
	if borrowEnabled != nil && *borrowEnabled {
		// Off, the definition carries no borrowing at all: it compares, caches and travels
		// exactly as before the field existed.
		d.Borrowing = Borrowing{Enabled: true, MaxBorrowed: deref(borrowMax), Grace: DefaultBorrowGrace}
		if borrowGrace != nil {
			d.Borrowing.Grace = time.Duration(*borrowGrace) * time.Second
		}
	}
	res.Definition = d
	return res, nil
}

func deref(v *int32) int {
	if v == nil {
		return 0
	}
	return int(*v)
}

// conflictError reports documents stored under the same key.
func conflictError(sources []string) error {
	sources = slices.Clone(sources)
	slices.Sort(sources)
	return fmt.Errorf("%w: %s", ErrConflict, strings.Join(sources, ", "))
}
