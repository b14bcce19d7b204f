package definition

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// ErrCapNotPermitted marks an UnavailableError caused by a tenant document that would book a
// resource against a cap above the one the operator (the built-in and system layers) sets
// for that resource, or move a lease the operator gives caps, a priority bound, an age bound
// or borrowing onto another resource (docs/tenancy.md, "Caps belong to the resource").
var ErrCapNotPermitted = errors.New("not permitted by the system layer")

// ResourceCaps are the caps the operator sets for one resource at the levels shared between
// tenants' definitions: for each of the global and tenant levels, the lowest cap among the
// system-scope definitions (built-in and system layers merged, without tenant or project
// documents) that book the resource; 0 when none sets one.
type ResourceCaps struct {
	Global, Tenant int
	// GlobalSource and TenantSource name the documents the caps come from.
	GlobalSource, TenantSource string
	// Broken names an operator document that does not load and may book the resource: it may
	// carry the cap that protects the resource, so a tenant's lease on it is refused.
	Broken string
}

// ResourceIndex maps a counter resource to the operator's caps for it.
type ResourceIndex map[string]ResourceCaps

// BrokenBuiltin is a built-in document that does not load: only its lease name is known.
type BrokenBuiltin struct {
	Name, Source string
}

// IndexResources builds the index from the system-scope stacks of every lease name that has a
// built-in or a system document: each stack holds at most a built-in and a system document
// and has the system scope. Where two system documents of one name are in conflict, pass one
// stack for each; both count, so the lower caps win.
//
// A document that does not load never widens what a tenant may do: a stack that does not
// merge still contributes the caps of each of its documents that is valid on its own, and
// marks every resource it may book (its name, and the resource each of its documents names)
// Broken; so does a built-in document that did not load (broken), for its name and the
// resources its system documents name.
func IndexResources(stacks []Stack, broken ...BrokenBuiltin) ResourceIndex {
	idx := ResourceIndex{}
	for _, s := range stacks {
		res, err := Merge(s)
		if err == nil {
			idx.add(res)
			continue
		}
		source := "an operator definition of " + s.Scope.Name
		var ue *UnavailableError
		if errors.As(err, &ue) {
			source = ue.Source
		}
		idx.markBroken(s.Scope.Name, source)
		for _, l := range []*Layer{s.Builtin, s.System} {
			if l == nil {
				continue
			}
			if l.Resource != nil {
				idx.markBroken(*l.Resource, source)
			}
			one := Stack{Scope: s.Scope}
			if l.Kind == KindBuiltin {
				one.Builtin = l
			} else {
				one.System = l
			}
			if res, err := Merge(one); err == nil {
				idx.add(res)
			}
		}
	}
	for _, b := range broken {
		idx.markBroken(b.Name, b.Source)
		for _, s := range stacks {
			if s.Scope.Name == b.Name && s.System != nil && s.System.Resource != nil {
				idx.markBroken(*s.System.Resource, b.Source)
			}
		}
	}
	return idx
}

// add lowers the caps of the merged operator definition's resource to its caps.
func (idx ResourceIndex) add(res Result) {
	d := res.Definition
	rc := idx[d.Resource]
	if c := d.Caps.Global; c > 0 && (rc.Global == 0 || c < rc.Global) {
		rc.Global, rc.GlobalSource = c, res.Origin[FieldLevelsGlobal]
	}
	if c := d.Caps.Tenant; c > 0 && (rc.Tenant == 0 || c < rc.Tenant) {
		rc.Tenant, rc.TenantSource = c, res.Origin[FieldLevelsTenant]
	}
	idx[d.Resource] = rc
}

// markBroken records that source, which does not load, may book resource (the first one
// found is named).
func (idx ResourceIndex) markBroken(resource, source string) {
	rc := idx[resource]
	if rc.Broken == "" {
		rc.Broken = source
	}
	idx[resource] = rc
}

// SystemScope returns the system-scope stack of s: its built-in and system documents only.
func SystemScope(s Stack) Stack {
	return Stack{Scope: LayerKey{Name: s.Scope.Name, Tenant: SystemTenant, Project: TenantProject},
		Builtin: s.Builtin, System: s.System}
}

// Bound applies "caps belong to the resource" to res, the merge of s, given the operator's
// caps of every resource (docs/tenancy.md, "Caps belong to the resource"):
//
//   - the global cap is always the resource's: idx[resource].Global, whatever the lease's own
//     layers say (0, not booked, when no system-scope definition caps the resource globally);
//   - the tenant cap is at most the resource's: a lease without a tenant cap of its own gets
//     the resource's, a cap above it set by the built-in or system layer is lowered to it, and
//     one set above it by a tenant document is refused;
//   - a tenant document may move a lease to another resource only when the lease's system
//     scope sets none of the operator's settings (caps, priority bound, age bound, borrowing):
//     otherwise the move would take the lease out of the operator's ceilings on its own
//     resource, or carry settings the operator gave for that resource to another one;
//   - a lease whose resource the tenant chose (its own lease name, or a moved lease) is refused
//     while an operator document that may book that resource does not load (fail closed).
//
// The project and user levels are subdivisions of one tenant's share and stay its own. A
// refusal is an *UnavailableError naming the tenant document, wrapping ErrCapNotPermitted or
// ErrOperatorDocumentBroken.
func Bound(res Result, s Stack, idx ResourceIndex) (Result, error) {
	d := res.Definition
	if d.Inline || d.Name == "" {
		return res, nil // an inline definition books a project-private resource
	}
	refuse := func(source string, format string, args ...any) (Result, error) {
		return Result{}, &UnavailableError{Name: s.Scope.Name, Tenant: s.Scope.Tenant, Project: s.Scope.Project,
			Source: source, Err: fmt.Errorf("%w: "+format, append([]any{ErrCapNotPermitted}, args...)...)}
	}
	tenantDoc := ""
	if s.Tenant != nil {
		tenantDoc = s.Tenant.Source
	}

	sys, err := Merge(SystemScope(s))
	if err != nil {
		return Result{}, err
	}
	sd := sys.Definition
	moved := tenantDoc != "" && res.Origin[FieldResource] == tenantDoc && d.Resource != sd.Resource
	if settings := operatorSettings(sd); moved && settings != "" {
		return refuse(tenantDoc, "resource %q: lease %q has operator settings on resource %q (%s); "+
			"a tenant may not move it to another resource", d.Resource, d.Name, sd.Resource, settings)
	}

	rc := idx[d.Resource]
	ownLease := s.Builtin == nil && s.System == nil
	if rc.Broken != "" && (moved || ownLease) {
		return Result{}, &UnavailableError{Name: s.Scope.Name, Tenant: s.Scope.Tenant, Project: s.Scope.Project,
			Source: tenantSource(s, res), Err: fmt.Errorf("%w: resource %q: %s does not load; "+
				"a tenant's lease on this resource is refused until it is fixed", ErrOperatorDocumentBroken, d.Resource, rc.Broken)}
	}
	out := res
	out.Origin = make(map[Field]string, len(res.Origin))
	for f, src := range res.Origin {
		out.Origin[f] = src
	}
	od := &out.Definition

	od.Caps.Global = rc.Global
	delete(out.Origin, FieldLevelsGlobal)
	if rc.Global > 0 {
		out.Origin[FieldLevelsGlobal] = rc.GlobalSource
	}

	switch {
	case rc.Tenant == 0:
	case od.Caps.Tenant == 0:
		od.Caps.Tenant, out.Origin[FieldLevelsTenant] = rc.Tenant, rc.TenantSource
	case od.Caps.Tenant > rc.Tenant:
		if src := res.Origin[FieldLevelsTenant]; tenantDoc != "" && src == tenantDoc {
			return refuse(tenantDoc, "levels.tenant %d is above the tenant cap %d the system layer sets for resource %q (%s)",
				od.Caps.Tenant, rc.Tenant, d.Resource, rc.TenantSource)
		}
		od.Caps.Tenant, out.Origin[FieldLevelsTenant] = rc.Tenant, rc.TenantSource
	}
	return out, nil
}

// operatorSettings describes the settings that only the operator's layers may give a lease
// and that a tenant's redirect would carry to another resource: caps of the shared levels,
// the priority bound, the age bound and borrowing; "" when sd has none.
func operatorSettings(sd Definition) string {
	var parts []string
	if sd.Caps.Global > 0 {
		parts = append(parts, fmt.Sprintf("global %d", sd.Caps.Global))
	}
	if sd.Caps.Tenant > 0 {
		parts = append(parts, fmt.Sprintf("tenant %d", sd.Caps.Tenant))
	}
	if sd.MaxPriority > 0 {
		parts = append(parts, fmt.Sprintf("maxPriority %d", sd.MaxPriority))
	}
	if sd.PriorityAgeBound > 0 {
		parts = append(parts, fmt.Sprintf("priorityAgeBoundSeconds %d", int(sd.PriorityAgeBound/time.Second)))
	}
	if sd.Borrowing.Enabled {
		parts = append(parts, "borrowing")
	}
	return strings.Join(parts, ", ")
}

// tenantSource names the tenant's document that chose the resource of res: the one that set
// it, or else the most specific document of the stack.
func tenantSource(s Stack, res Result) string {
	if src := res.Origin[FieldResource]; src != "" {
		return src
	}
	for _, l := range []*Layer{s.Project, s.Tenant} {
		if l != nil {
			return l.Source
		}
	}
	return s.Scope.String()
}

// systemStacks returns the system-scope stacks of every lease name with a built-in or a
// system document, for IndexResources: one stack per system document (several when they
// are in conflict), or the built-in document alone; and the built-in documents that did not
// load (their system documents still get stacks, without them).
func systemStacks(builtins *Builtins, system []Layer) ([]Stack, []BrokenBuiltin) {
	byName := map[string][]Layer{}
	for _, l := range system {
		byName[l.Name] = append(byName[l.Name], l)
	}
	names := builtins.Names()
	for n := range byName {
		if !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	var stacks []Stack
	var broken []BrokenBuiltin
	for _, n := range names {
		scope := LayerKey{Name: n, Tenant: SystemTenant, Project: TenantProject}
		b, err := builtins.Layer(n)
		if err != nil {
			// Its own lease is unavailable; the caps of its system documents still count.
			source := "the built-in document of " + n
			var ue *UnavailableError
			if errors.As(err, &ue) {
				source = ue.Source
			}
			broken = append(broken, BrokenBuiltin{Name: n, Source: source})
			b = nil
		}
		docs := byName[n]
		if len(docs) == 0 {
			if b == nil {
				continue
			}
			stacks = append(stacks, Stack{Scope: scope, Builtin: b})
			continue
		}
		for i := range docs {
			stacks = append(stacks, Stack{Scope: scope, Builtin: b, System: &docs[i]})
		}
	}
	return stacks, broken
}

// ErrOperatorDocumentBroken marks an UnavailableError refusing a tenant's lease on a resource
// whose operator (built-in or system) document does not load: that document may carry the
// cap that protects the resource, so a tenant's lease on it fails closed (docs/tenancy.md).
var ErrOperatorDocumentBroken = errors.New("an operator definition of the resource does not load")
