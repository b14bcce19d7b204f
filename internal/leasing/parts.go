package leasing

import (
	"context"
	"slices"
	"strings"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

// Acquisitions of several leases at once (docs/waiting.md, "Several resources at once"). Each
// lease is resolved for the caller's tenant and project as a single one would be, and books
// its own resource's funnel under its own caps; what the acquisition as a whole waits, how
// long its holder may stay silent and which priorities it may ask for are the strictest of its
// leases'. The store books the parts in the order of their resources and grants them together.

// resolveAll resolves the definitions of req: its lease (or inline definition), or one per
// name of req.Leases, in that order.
func (s *Service) resolveAll(ctx context.Context, req Request) ([]definition.Definition, error) {
	if req.Leases == nil {
		d, err := s.resolve(ctx, req)
		return []definition.Definition{d}, err
	}
	out := make([]definition.Definition, 0, len(req.Leases))
	for _, name := range req.Leases {
		d, err := s.resolver.Resolve(ctx, req.Tenant, req.Project, name)
		if err != nil {
			return nil, definitionError("resolving lease "+name, err)
		}
		out = append(out, d)
	}
	return out, nil
}

// partPlan is one definition of an acquisition with what it books.
type partPlan struct {
	def definition.Definition
	plan
}

// plans is what an acquisition books under its resolved definitions: the parts that book
// something (a lease that caps no level books nothing, as a NOOP lease), in the order of
// their resources for an acquisition of several (several).
type plans struct {
	several bool
	parts   []partPlan
	// noopDef is the definition of a single lease that books nothing.
	noopDef definition.Definition
}

// planAll decides what an acquisition of req books under defs (planOf for each): two leases
// that book the same resource are refused, since one holder books one slot of a counter.
func planAll(defs []definition.Definition, req Request) (plans, error) {
	ps := plans{several: req.Leases != nil}
	byResource := map[string]string{}
	for _, d := range defs {
		p, err := planOf(d, req)
		if err != nil {
			return plans{}, err
		}
		if p.noop {
			ps.noopDef = d
			continue
		}
		if other, ok := byResource[d.Resource]; ok {
			return plans{}, lease.Invalid("leases", "%s and %s book the same resource %s: an acquisition holds one slot of a resource", other, d.Name, d.Resource)
		}
		byResource[d.Resource] = d.Name
		ps.parts = append(ps.parts, partPlan{def: d, plan: p})
	}
	if ps.several { // the store's order (leasestore.Part)
		slices.SortFunc(ps.parts, func(a, b partPlan) int { return strings.Compare(a.def.Resource, b.def.Resource) })
	}
	return ps, nil
}

// noop: nothing to book (no lease, or no capped level in any).
func (ps plans) noop() bool { return len(ps.parts) == 0 }

// resource labels the acquisition's metrics: its (first) resource.
func (ps plans) resource() string {
	if len(ps.parts) == 0 {
		return ps.noopDef.Resource
	}
	return ps.parts[0].def.Resource
}

// wait is the longest the acquisition may wait: the shortest of its leases' waits.
func (ps plans) wait() time.Duration {
	w := ps.parts[0].def.Wait
	for _, p := range ps.parts[1:] {
		w = min(w, p.def.Wait)
	}
	return w
}

// ttl is how long its holder may stay silent: the shortest of its leases' TTLs.
func (ps plans) ttl() time.Duration {
	t := ps.parts[0].def.TTL
	for _, p := range ps.parts[1:] {
		t = min(t, p.def.TTL)
	}
	return t
}

// ageBound is the acquisition's priority age bound: a waiter is raised only where every
// lease's operator allows it, so 0 (off) when one lease has none, else the longest bound.
func (ps plans) ageBound() time.Duration {
	var b time.Duration
	for _, p := range ps.parts {
		if p.def.PriorityAgeBound <= 0 {
			return 0
		}
		b = max(b, p.def.PriorityAgeBound)
	}
	return b
}

// lease is the answer of a grant under ps, without the holder's token and fences.
func (ps plans) lease() Lease {
	if !ps.several {
		if ps.noop() {
			return plan{noop: true}.lease(ps.noopDef)
		}
		return ps.parts[0].lease(ps.parts[0].def)
	}
	if ps.noop() {
		return Lease{NoOp: true}
	}
	l := Lease{TTL: ps.ttl()}
	names := make([]string, len(ps.parts))
	for i, p := range ps.parts {
		names[i] = p.def.Name
		l.Parts = append(l.Parts, PartLease{Name: p.def.Name, Resource: p.def.Resource, Levels: p.levels})
	}
	l.Name = strings.Join(names, "+")
	return l
}

// labelName is the name the metrics of a request that could not be resolved carry.
func (r Request) labelName() string {
	if r.Leases != nil {
		return r.Leases[0]
	}
	return r.Lease
}
