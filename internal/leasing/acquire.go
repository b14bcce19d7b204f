package leasing

import (
	"context"
	"errors"
	"slices"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// Acquire obtains a lease (docs/design.md). It validates the request, resolves the
// definition (NOOP without store traffic when no lease or no cap applies), and waits for a
// slot at most min(definition wait, req.Wait, ctx deadline). A request that names several
// leases (Leases) is granted all of them or none (docs/waiting.md, "Several resources at
// once"). Errors: *lease.InvalidError, *lease.BusyError, *lease.UnavailableError.
func (s *Service) Acquire(ctx context.Context, req Request) (Lease, error) {
	if err := s.validate(req); err != nil {
		return Lease{}, err
	}
	defs, err := s.resolveAll(ctx, req)
	if err != nil {
		if errors.Is(err, lease.ErrUnavailable) {
			s.metrics.Acquire.WithLabelValues(s.labels.of(req.labelName()), metrics.AcquireUnavailable).Inc()
		}
		return Lease{}, err
	}
	start := s.clk.Now()
	for {
		l, next, err := s.acquireAs(ctx, req, defs, start)
		if next == nil {
			return l, err
		}
		// The definition changed while the acquisition waited (a cap raised, say): start
		// over under the new one, keeping the time already waited (docs/waiting.md,
		// "Definition changes").
		defs = next
	}
}

// acquireAs acquires under the resolved definitions defs (one, or one per lease of
// req.Leases), waiting from start. It returns the new definitions instead of an answer when
// one changed while the acquisition waited.
func (s *Service) acquireAs(ctx context.Context, req Request, defs []definition.Definition, start time.Time) (Lease, []definition.Definition, error) {
	p, err := planAll(defs, req)
	if err != nil {
		return Lease{}, nil, err
	}
	if p.noop() {
		s.metrics.Acquire.WithLabelValues(s.labels.of(p.resource()), metrics.AcquireNoop).Inc()
		return p.lease(), nil, nil
	}
	first := p.parts[0].def
	wait := p.wait()
	if req.Wait != nil && *req.Wait < wait {
		wait = *req.Wait
	}
	if req.WaitFor != nil {
		wait = *req.WaitFor
	}
	sreq := leasestore.AcquireRequest{
		Tenant:    req.Tenant,
		Project:   req.Project,
		User:      req.User,
		Type:      req.Type,
		HolderRef: req.HolderRef,
		Pod:       req.Pod,
		PodBound:  req.PodBound,
		Payload:   req.Payload,
		TTL:       p.ttl(),
		Priority:  req.Priority,
	}
	age := aging{bound: p.ageBound(), since: start}
	if p.several {
		for _, pt := range p.parts {
			sreq.Parts = append(sreq.Parts, leasestore.Part{LeaseName: pt.def.Name, Resource: pt.def.Resource, Caps: pt.caps})
		}
	} else {
		sreq.LeaseName, sreq.Resource, sreq.Caps = first.Name, first.Resource, p.parts[0].caps
		if first.Borrows() {
			sreq.Borrow = &leasestore.Borrow{MaxBorrowed: first.Borrowing.MaxBorrowed}
		}
		age.reclaim = reclaimOf(first, req)
	}
	current := func(ctx context.Context) ([]definition.Definition, error) {
		ds, err := s.resolveAll(ctx, req) // cache hits unless a definition changed
		if err != nil || slices.Equal(ds, defs) {
			return nil, err
		}
		return ds, nil
	}
	label := s.labels.of(first.Resource)
	s.metrics.Waiting.WithLabelValues(label).Inc()
	h, err := s.acquire(ctx, sreq, start.Add(wait), current, req.Queued, age)
	s.metrics.Waiting.WithLabelValues(label).Dec()
	var changed *definitionChanged
	if errors.As(err, &changed) {
		return Lease{}, changed.next, nil
	}
	waited := s.clk.Since(start)
	observe := func(label, outcome string) {
		s.metrics.Acquire.WithLabelValues(label, outcome).Inc()
		s.metrics.AcquireWait.WithLabelValues(label, outcome).Observe(waited.Seconds())
		if wait > 0 {
			s.metrics.AcquireWaitShare.WithLabelValues(label).Observe(waited.Seconds() / wait.Seconds())
		}
	}
	var busy *lease.BusyError
	switch {
	case err == nil:
		label = s.labels.book(first.Resource) // a booked resource earns its own label value
		observe(label, metrics.AcquireSuccess)
		s.tokens.put(h.Token, label)
	case errors.As(err, &busy):
		busy.Waited = waited
		observe(label, metrics.AcquireBusy)
		return Lease{}, nil, err
	case errors.Is(err, lease.ErrInvalid):
		return Lease{}, nil, err
	default:
		observe(label, metrics.AcquireUnavailable)
		return Lease{}, nil, err
	}
	granted := p.lease()
	granted.Token, granted.Fence = h.Token, h.Fence
	for i := range granted.Parts {
		for _, hp := range h.Parts {
			if hp.Resource == granted.Parts[i].Resource {
				granted.Parts[i].Fence = hp.Fence
			}
		}
	}
	return granted, nil, nil
}

// plan is what an acquisition books under a resolved definition: nothing (noop), or one
// slot at each capped level.
type plan struct {
	noop bool
	// caps are the capped levels, as the store takes them; levels the same, narrow to wide,
	// with their scopes, as the answer shows them.
	caps   []lease.LevelCap
	levels []LevelInfo
}

// planOf decides from the resolved definition alone what an acquisition of req books: no
// level when none is capped (NOOP), else every capped level; a capped user level needs a
// user. Acquire and DryRun both decide here.
func planOf(def definition.Definition, req Request) (plan, error) {
	if def.NoOp() {
		return plan{noop: true}, nil
	}
	if def.Caps.User > 0 && req.User == "" {
		return plan{}, lease.Invalid("user", "is required: lease %s caps the user level", def.Name)
	}
	if req.Priority > def.MaxPriority {
		return plan{}, lease.Invalid("priority", "%d is above the maximum %d of lease %s (maxPriority, set by the system layer)",
			req.Priority, def.MaxPriority, def.Name)
	}
	p := plan{caps: capsOf(def.Caps)}
	for _, l := range lease.Levels { // narrow to wide
		for _, c := range p.caps {
			if c.Level == l {
				p.levels = append(p.levels, LevelInfo{Level: l, Scope: lease.ScopeOf(l, req.Tenant, req.Project, req.User), Cap: c.Cap})
			}
		}
	}
	return p, nil
}

// lease is the answer of a grant under p, without the holder's token and fence.
func (p plan) lease(def definition.Definition) Lease {
	if p.noop {
		return Lease{NoOp: true, Name: def.Name, Resource: def.Resource}
	}
	return Lease{Name: def.Name, Resource: def.Resource, Levels: p.levels, TTL: def.TTL}
}

// currentFunc re-resolves the definitions of a waiting acquisition: nil while they are
// unchanged.
type currentFunc func(context.Context) ([]definition.Definition, error)

// definitionChanged ends a wait whose definition changed; the acquisition starts over under
// next.
type definitionChanged struct{ next []definition.Definition }

func (*definitionChanged) Error() string { return "the lease definition changed while waiting" }

// resolve returns the definition of a name reference or an inline definition.
func (s *Service) resolve(ctx context.Context, req Request) (definition.Definition, error) {
	if req.Inline != nil {
		d, err := s.resolver.ResolveInline(req.Tenant, req.Project, *req.Inline)
		if err != nil {
			return definition.Definition{}, definitionError("resolving inline lease "+req.Inline.Name, err)
		}
		return d, nil
	}
	if req.Lease == "" || req.Lease == definition.NoneReference {
		return definition.Definition{}, nil // NOOP: nothing to resolve
	}
	d, err := s.resolver.Resolve(ctx, req.Tenant, req.Project, req.Lease)
	if err != nil {
		return definition.Definition{}, definitionError("resolving lease "+req.Lease, err)
	}
	return d, nil
}

func capsOf(c definition.Caps) []lease.LevelCap {
	var out []lease.LevelCap
	for _, l := range []struct {
		level lease.Level
		cap   int
	}{
		{lease.LevelUser, c.User}, {lease.LevelProject, c.Project},
		{lease.LevelTenant, c.Tenant}, {lease.LevelGlobal, c.Global},
	} {
		if l.cap > 0 {
			out = append(out, lease.LevelCap{Level: l.level, Cap: l.cap})
		}
	}
	return out
}

// outcome sorts the result of one store attempt: success (nil, nil), busy (diagnosis,
// nil) or an error.
func (s *Service) outcome(op string, err error) (*lease.BusyError, error) {
	var sb *lease.BusyError
	switch {
	case err == nil:
		return nil, nil
	case errors.As(err, &sb):
		return busyOf(sb), nil
	default:
		return nil, storeError(op, "lease", err)
	}
}

func busyOf(b *lease.BusyError) *lease.BusyError {
	return &lease.BusyError{Lease: b.Lease, Resource: b.Resource, Level: b.Level, Scope: b.Scope, Count: b.Count, Cap: b.Cap}
}

// sweep is the lazy idle sweep of resource, one that an acquisition of req found full: the
// reaped holders go to the listener asynchronously. It returns how many holders it reaped.
// A resource is swept at most once per sweep interval by this service (each sweep costs two
// reads; a holder becomes idle at most once per TTL, which is at least a second). A failed
// sweep does not fail the acquisition (the next store call reports a store that is down).
func (s *Service) sweep(ctx context.Context, req leasestore.AcquireRequest, resource string) int {
	if !s.sweeps.allow(resource, s.clk.Now(), s.cfg.sweepInterval) {
		return 0
	}
	return s.sweepNow(ctx, req, resource)
}

// sweepNow is the lazy idle sweep of resource, a resource of req, past its gate.
func (s *Service) sweepNow(ctx context.Context, req leasestore.AcquireRequest, resource string) int {
	var sw leasestore.IdleSweep
	var dispatched int
	var err error
	if s.cfg.idleReaper != nil {
		sw, dispatched, err = s.cfg.idleReaper(ctx, sweepTarget(req, resource))
	} else {
		sw, err = s.store.SweepIdle(ctx, resource)
	}
	reaped := sw.Reaped
	if err == nil {
		s.sweeps.swept(resource, s.clk.Now(), sw.NextExpiry)
	}
	if err != nil && ctx.Err() == nil {
		logf.FromContext(ctx).Error(err, "Lazy idle sweep failed", "resource", resource, "reaped", len(reaped)+dispatched)
	}
	if len(reaped) == 0 {
		return dispatched
	}
	if s.listener == nil { // otherwise the listener counts them, as for every reap path
		s.metrics.Reap.WithLabelValues(metrics.ReapIdle).Add(float64(len(reaped)))
	}
	for _, h := range reaped {
		s.tokens.forget(h.Token)
	}
	s.dispatch(ctx, metrics.ReapIdle, reaped)
	return len(reaped) + dispatched
}
