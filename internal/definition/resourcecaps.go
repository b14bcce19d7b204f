package definition

import (
	"errors"
	"fmt"
	"slices"
)

// ErrCapNotPermitted marks an UnavailableError caused by a tenant document that would book a
// resource against a cap above the one the operator (the built-in and system layers) sets
// for that resource, or move a lease the operator caps onto another resource
// (docs/tenancy.md, "Caps belong to the resource").
var ErrCapNotPermitted = errors.New("not permitted by the system layer")

// ResourceCaps are the caps the operator sets for one resource at the levels shared between
// tenants' definitions: for each of the global and tenant levels, the lowest cap among the
// system-scope definitions (built-in and system layers merged, without tenant or project
// documents) that book the resource; 0 when none sets one.
type ResourceCaps struct {
	Global, Tenant int
	// GlobalSource and TenantSource name the documents the caps come from.
	GlobalSource, TenantSource string
}

// ResourceIndex maps a counter resource to the operator's caps for it.
type ResourceIndex map[string]ResourceCaps

// IndexResources builds the index from the system-scope stacks of every lease name that has a
// built-in or a system document: each stack holds at most a built-in and a system document
// and has the system scope. A stack that does not merge (a broken document) is left out: its
// own lease is unavailable anyway. Where two system documents of one name are in conflict,
// pass one stack for each; both count, so the lower caps win.
func IndexResources(stacks []Stack) ResourceIndex {
	idx := ResourceIndex{}
	for _, s := range stacks {
		res, err := Merge(s)
		if err != nil {
			continue
		}
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
	return idx
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
//     scope caps neither the global nor the tenant level: otherwise the move would take the
//     lease out of the operator's ceilings on its own resource.
//
// The project and user levels are subdivisions of one tenant's share and stay its own. A
// refusal is an *UnavailableError naming the tenant document, wrapping ErrCapNotPermitted.
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

	if tenantDoc != "" && res.Origin[FieldResource] == tenantDoc {
		sys, err := Merge(SystemScope(s))
		if err != nil {
			return Result{}, err
		}
		sd := sys.Definition
		if d.Resource != sd.Resource && (sd.Caps.Global > 0 || sd.Caps.Tenant > 0) {
			return refuse(tenantDoc, "resource %q: lease %q is capped by the system layer on resource %q (global %d, tenant %d); "+
				"a tenant may not move it to another resource", d.Resource, d.Name, sd.Resource, sd.Caps.Global, sd.Caps.Tenant)
		}
	}

	rc := idx[d.Resource]
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

// systemStacks returns the system-scope stacks of every lease name with a built-in or a
// system document, for IndexResources: one stack per system document (several when they
// are in conflict), or the built-in document alone.
func systemStacks(builtins *Builtins, system []Layer) []Stack {
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
	for _, n := range names {
		scope := LayerKey{Name: n, Tenant: SystemTenant, Project: TenantProject}
		b, err := builtins.Layer(n)
		if err != nil {
			continue // a broken built-in document: its lease is unavailable
		}
		docs := byName[n]
		if len(docs) == 0 {
			stacks = append(stacks, Stack{Scope: scope, Builtin: b})
			continue
		}
		for i := range docs {
			stacks = append(stacks, Stack{Scope: scope, Builtin: b, System: &docs[i]})
		}
	}
	return stacks
}
