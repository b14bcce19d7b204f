package leasing

import (
	"context"
	"errors"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// Acquire obtains a lease (docs/design.md). It validates the request, resolves the
// definition (NOOP without store traffic when no lease or no cap applies), and waits for a
// slot at most min(definition wait, req.Wait, ctx deadline). Errors: *lease.InvalidError,
// *lease.BusyError, *lease.UnavailableError.
func (s *Service) Acquire(ctx context.Context, req Request) (Lease, error) {
	if err := s.validate(req); err != nil {
		return Lease{}, err
	}
	def, err := s.resolve(ctx, req)
	if err != nil {
		if errors.Is(err, lease.ErrUnavailable) {
			s.metrics.Acquire.WithLabelValues(s.labels.of(req.Lease), metrics.AcquireUnavailable).Inc()
		}
		return Lease{}, err
	}
	if def.NoOp() {
		s.metrics.Acquire.WithLabelValues(s.labels.of(def.Resource), metrics.AcquireNoop).Inc()
		return Lease{NoOp: true, Name: def.Name, Resource: def.Resource}, nil
	}
	if def.Caps.User > 0 && req.User == "" {
		return Lease{}, lease.Invalid("user", "is required: lease %s caps the user level", def.Name)
	}

	wait := def.Wait
	if req.Wait != nil && *req.Wait < wait {
		wait = *req.Wait
	}
	caps := capsOf(def.Caps)
	sreq := leasestore.AcquireRequest{
		LeaseName: def.Name,
		Resource:  def.Resource,
		Caps:      caps,
		Tenant:    req.Tenant,
		Project:   req.Project,
		User:      req.User,
		Type:      req.Type,
		HolderRef: req.HolderRef,
		Pod:       req.Pod,
		PodBound:  req.PodBound,
		Payload:   req.Payload,
		TTL:       def.TTL,
	}
	label := s.labels.of(def.Resource)
	start := s.clk.Now()
	s.metrics.Waiting.WithLabelValues(label).Inc()
	h, err := s.acquire(ctx, sreq, start.Add(wait))
	s.metrics.Waiting.WithLabelValues(label).Dec()
	waited := s.clk.Since(start)
	var busy *lease.BusyError
	switch {
	case err == nil:
		label = s.labels.book(def.Resource) // a booked resource earns its own label value
		s.metrics.Acquire.WithLabelValues(label, metrics.AcquireSuccess).Inc()
		s.metrics.AcquireWait.WithLabelValues(label).Observe(waited.Seconds())
		s.tokens.put(h.Token, label)
	case errors.As(err, &busy):
		busy.Waited = waited
		s.metrics.Acquire.WithLabelValues(label, metrics.AcquireBusy).Inc()
		s.metrics.AcquireWait.WithLabelValues(label).Observe(waited.Seconds())
		return Lease{}, err
	case errors.Is(err, lease.ErrInvalid):
		return Lease{}, err
	default:
		s.metrics.Acquire.WithLabelValues(label, metrics.AcquireUnavailable).Inc()
		return Lease{}, err
	}
	granted := Lease{Token: h.Token, Name: def.Name, Resource: def.Resource, TTL: def.TTL}
	for _, l := range lease.Levels { // narrow to wide
		for _, c := range caps {
			if c.Level == l {
				granted.Levels = append(granted.Levels, LevelInfo{Level: l, Scope: lease.ScopeOf(l, req.Tenant, req.Project, req.User), Cap: c.Cap})
			}
		}
	}
	return granted, nil
}

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

// acquire runs the funnel with waiting. The first round (one attempt, and while busy a
// lazy sweep and, if it reaped, one more attempt) is bounded by ctx and the store's own
// timeout; every later round is bounded by the deadline. While waiting it probes (reads)
// and writes only when every level shows room.
func (s *Service) acquire(ctx context.Context, req leasestore.AcquireRequest, deadline time.Time) (lease.Holder, error) {
	op := "acquiring " + req.Resource
	h, err := s.store.Acquire(ctx, req)
	busy, err := s.outcome(op, err)
	if err != nil || busy == nil {
		return h, err
	}
	if s.sweep(ctx, req.Resource) > 0 {
		h, err = s.store.Acquire(ctx, req)
		if busy, err = s.outcome(op, err); err != nil || busy == nil {
			return h, err
		}
	}

	for poll := 0; ; poll++ {
		remaining := deadline.Sub(s.clk.Now())
		if remaining <= 0 {
			return lease.Holder{}, busy
		}
		pause := min(pollDelay(poll, s.cfg.pollMin, s.cfg.pollMax, s.cfg.random()), remaining)
		if !s.sleep(ctx, pause) {
			busy.Err = ctx.Err()
			return lease.Holder{}, busy
		}
		remaining = deadline.Sub(s.clk.Now())
		if remaining <= 0 {
			return lease.Holder{}, busy
		}
		h, full, err := s.poll(ctx, req, remaining, busy)
		switch {
		case err != nil:
			return lease.Holder{}, err
		case full != nil:
			busy = full
		default:
			return h, nil
		}
	}
}

// minRoundBudget is the least time a waiting round gives its store calls, however little of
// the wait is left. A healthy store answers well within it, so a store call that outlives it
// is a store that does not answer: LEASE_UNAVAILABLE, not a diagnosis of a full level
// (docs/design.md, "Fail closed"). The wait may thus run over by at most this much.
const minRoundBudget = time.Second

// poll is one round of a waiting acquisition, bounded by remaining (at least minRoundBudget):
// a probe, while full possibly a lazy sweep, and the write attempt only when the probe (or the
// sweep) found room. It returns the holder, or the busy diagnosis, or an error. A round cut
// short by ctx (the caller is gone) reports busy with the last diagnosis it has; a store call
// cut by the round's own deadline is unavailable.
func (s *Service) poll(ctx context.Context, req leasestore.AcquireRequest, remaining time.Duration,
	last *lease.BusyError) (lease.Holder, *lease.BusyError, error) {
	op := "acquiring " + req.Resource
	rctx, cancel := context.WithTimeout(ctx, max(remaining, minRoundBudget))
	defer cancel()
	// cut answers a failed store call: classified (err from storeError), unless the caller
	// is gone.
	cut := func(err error) (lease.Holder, *lease.BusyError, error) {
		if ctx.Err() == nil {
			return lease.Holder{}, nil, err
		}
		b := *last
		b.Err = ctx.Err()
		return lease.Holder{}, nil, &b
	}
	var full *lease.BusyError
	if s.probe {
		var err error
		full, err = s.store.Probe(rctx, req.Resource, req.Caps, req.Tenant, req.Project, req.User)
		if err != nil {
			return cut(storeError(op, "lease", err))
		}
	}
	if full != nil && s.sweep(rctx, req.Resource) > 0 {
		full = nil
	}
	if full != nil {
		return lease.Holder{}, busyOf(full), nil
	}
	h, err := s.store.Acquire(rctx, req)
	busy, err := s.outcome(op, err)
	if err != nil {
		return cut(err)
	}
	return h, busy, nil
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
	return &lease.BusyError{Resource: b.Resource, Level: b.Level, Scope: b.Scope, Count: b.Count, Cap: b.Cap}
}

// sweep is the lazy idle sweep of one resource, run when an acquisition finds it full: the
// reaped holders go to the listener asynchronously. It returns how many holders it reaped.
// A resource is swept at most once per sweep interval by this service (each sweep costs two
// reads; a holder becomes idle at most once per TTL, which is at least a second). A failed
// sweep does not fail the acquisition (the next store call reports a store that is down).
func (s *Service) sweep(ctx context.Context, resource string) int {
	if !s.sweeps.allow(resource, s.clk.Now(), s.cfg.sweepInterval) {
		return 0
	}
	var reaped []lease.Holder
	var dispatched int
	var err error
	if s.cfg.idleReaper != nil {
		reaped, dispatched, err = s.cfg.idleReaper(ctx, resource)
	} else {
		reaped, err = s.store.ReapIdle(ctx, resource)
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

// sleep pauses for d on the service's clock; false when ctx ended first.
func (s *Service) sleep(ctx context.Context, d time.Duration) bool {
	t := s.clk.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C():
		return true
	case <-ctx.Done():
		return false
	}
}

// pollDelay is the pause before poll n (0-based) of a waiting acquisition: uniformly random
// (r in [0,1)) between lo and a bound that starts at 2·lo and doubles per poll up to hi —
// full jitter above a floor, so acquirers that found the resource full together do not
// retry in lockstep, and long waits poll less often.
func pollDelay(n int, lo, hi time.Duration, r float64) time.Duration {
	up := hi
	if n < 30 {
		if b := lo << (n + 1); b > 0 && b < hi {
			up = b
		}
	}
	if up < lo {
		up = lo
	}
	return lo + time.Duration(r*float64(up-lo))
}
