package leasing

import (
	"context"
)

// DryRun answers what Acquire would answer now, and changes nothing (docs/api.md, "Dry
// run"). It validates and resolves as Acquire does, decides the levels with the same
// planOf, and then reads the funnel's counters once (Store.Probe). The answer is the Lease a
// grant would carry, without Token and Fence; a NOOP lease; or Acquire's errors:
// *lease.InvalidError, *lease.BusyError (the first full level, narrow to wide, Waited 0) and
// *lease.UnavailableError.
//
// It never waits (req.Wait is validated, then ignored) and never writes: no holder, no
// counter, no line, no lazy sweep, no repair. So a level that a real acquisition would free
// first by reaping idle holders, or by repairing an entry a crash left behind, answers busy
// here. It counts in no metric: vance_lease_acquire_total counts acquisitions.
func (s *Service) DryRun(ctx context.Context, req Request) (Lease, error) {
	if err := s.validate(req); err != nil {
		return Lease{}, err
	}
	return s.dryRun(ctx, req)
}

// Review is DryRun for a person rather than a consumer (the live API's
// LeaseAcquisitionReview): req.Type may be empty, since the type only selects the revocation
// handler and no counter depends on it. A type that is given must have a handler.
func (s *Service) Review(ctx context.Context, req Request) (Lease, error) {
	if req.Type != "" {
		if err := s.validateType(req.Type); err != nil {
			return Lease{}, err
		}
	}
	if err := validateFields(req); err != nil {
		return Lease{}, err
	}
	return s.dryRun(ctx, req)
}

// dryRun is DryRun past the validation. An acquisition of several leases reads each part's
// counters, in the order of their resources, and answers busy for the first full one.
func (s *Service) dryRun(ctx context.Context, req Request) (Lease, error) {
	defs, err := s.resolveAll(ctx, req)
	if err != nil {
		return Lease{}, err
	}
	ps, err := planAll(defs, req)
	if err != nil {
		return Lease{}, err
	}
	for _, p := range ps.parts {
		busy, err := s.store.Probe(ctx, p.def.Resource, p.caps, req.Tenant, req.Project, req.User)
		if err != nil {
			return Lease{}, storeError("probing "+p.def.Resource, "lease", err)
		}
		if busy != nil {
			if ps.several {
				busy.Lease = p.def.Name
			}
			// Where it would stand: every live waiter of the level's line is ahead of it.
			s.explain(ctx, busy, "")
			return Lease{}, busy
		}
	}
	return ps.lease(), nil
}
