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
	"github.com/vancetope/lease-operator/internal/waitq"
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
	start := s.clk.Now()
	for restarted := false; ; restarted = true {
		l, next, err := s.acquireAs(ctx, req, def, start, restarted)
		if next == nil {
			return l, err
		}
		// The definition changed while the acquisition waited (a cap raised, say): start
		// over under the new one, keeping the time already waited (docs/waiting.md,
		// "Definition changes").
		def = *next
	}
}

// acquireAs acquires under the resolved definition def, waiting from start (restarted: it
// waited already under an earlier definition). It returns the new definition instead of an
// answer when def changed while the acquisition waited.
func (s *Service) acquireAs(ctx context.Context, req Request, def definition.Definition, start time.Time, restarted bool) (Lease, *definition.Definition, error) {
	if def.NoOp() {
		s.metrics.Acquire.WithLabelValues(s.labels.of(def.Resource), metrics.AcquireNoop).Inc()
		return Lease{NoOp: true, Name: def.Name, Resource: def.Resource}, nil, nil
	}
	if def.Caps.User > 0 && req.User == "" {
		return Lease{}, nil, lease.Invalid("user", "is required: lease %s caps the user level", def.Name)
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
	current := func(ctx context.Context) (*definition.Definition, error) {
		d, err := s.resolve(ctx, req) // a cache hit unless a definition changed
		if err != nil || d == def {
			return nil, err
		}
		return &d, nil
	}
	label := s.labels.of(def.Resource)
	s.metrics.Waiting.WithLabelValues(label).Inc()
	h, err := s.acquire(ctx, sreq, start.Add(wait), waitPolicy{fairness: def.Fairness, restarted: restarted, current: current})
	s.metrics.Waiting.WithLabelValues(label).Dec()
	var changed *definitionChanged
	if errors.As(err, &changed) {
		return Lease{}, &changed.next, nil
	}
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
		return Lease{}, nil, err
	case errors.Is(err, lease.ErrInvalid):
		return Lease{}, nil, err
	default:
		s.metrics.Acquire.WithLabelValues(label, metrics.AcquireUnavailable).Inc()
		return Lease{}, nil, err
	}
	granted := Lease{Token: h.Token, Name: def.Name, Resource: def.Resource, TTL: def.TTL}
	for _, l := range lease.Levels { // narrow to wide
		for _, c := range caps {
			if c.Level == l {
				granted.Levels = append(granted.Levels, LevelInfo{Level: l, Scope: lease.ScopeOf(l, req.Tenant, req.Project, req.User), Cap: c.Cap})
			}
		}
	}
	return granted, nil, nil
}

// waitPolicy is what an acquisition waits under.
type waitPolicy struct {
	// fairness is the definition's order across processes.
	fairness definition.Fairness
	// restarted: the acquisition waited already under a definition that changed since.
	restarted bool
	// current re-resolves the definition: nil while it is unchanged.
	current func(context.Context) (*definition.Definition, error)
}

// definitionChanged ends a wait whose definition changed; the acquisition starts over under
// next.
type definitionChanged struct{ next definition.Definition }

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

// acquire runs the funnel with waiting (docs/waiting.md). The acquisition registers in the
// wait queue on every key of its funnel before its first attempt, so a slot freed while that
// attempt runs wakes it. A newcomer that finds older waiters of this process blocked on a key
// of its funnel queues behind them without an attempt (it would take the slot freed for
// them). While a level stays full it waits for a wake-up (a slot freed in this process, or
// in another one as told by the notifier) or its jittered safety timer, never past the
// deadline: a wake-up goes straight to the write path, the safety timer reads first (Probe,
// and the lazy sweep when full). Every wake-up first checks that the definition is unchanged
// (a cache hit); when it changed, the wait ends with *definitionChanged. The first attempt is
// bounded by ctx and the store's own timeout, every later one by the deadline.
func (s *Service) acquire(ctx context.Context, req leasestore.AcquireRequest, deadline time.Time, p waitPolicy) (lease.Holder, error) {
	op := "acquiring " + req.Resource
	w := s.queue.Register(funnelKeys(req)...)
	defer w.Done()

	var busy *lease.BusyError
	// A restarted waiter was in line already: it attempts at once rather than queue behind
	// the others woken by the same definition change (they would all wait for their timers).
	if info, ok := s.queue.Ahead(funnelKeys(req)...); ok && !p.restarted && deadline.After(s.clk.Now()) {
		busy = busyOf(info.(*lease.BusyError))
	} else {
		h, err := s.store.Acquire(ctx, req)
		busy, err = s.outcome(op, err)
		if err != nil || busy == nil {
			return h, err
		}
		if s.sweep(ctx, req.Resource) > 0 {
			h, err = s.store.Acquire(ctx, req)
			if busy, err = s.outcome(op, err); err != nil || busy == nil {
				return h, err
			}
		}
	}
	w.Block(busyKey(busy), busy)
	if !deadline.After(s.clk.Now()) {
		return lease.Holder{}, busy
	}
	res, err := s.reserve(ctx, p.fairness, req.Pod, busy)
	if err != nil {
		if ctx.Err() != nil { // the caller gave up
			busy.Err = ctx.Err()
			return lease.Holder{}, busy
		}
		return lease.Holder{}, err
	}
	if res != nil {
		w.Order(res.At) // wake in the order the store's queue serves
		if p.restarted {
			// The queue's barrier kept this waiter from room the change may have made: wake
			// the oldest waiter of the key, which asks the store whose turn it is.
			s.queue.Freed([]string{busyKey(busy)})
		}
	}
	defer func() { s.leave(ctx, res) }()

	// blocked takes a new diagnosis: the level found full, maybe another one than before
	// (then the reservation moves there).
	blocked := func(full *lease.BusyError) error {
		var err error
		if res, err = s.requeue(ctx, req.Pod, res, busy, full); err != nil {
			return err
		}
		busy = full
		w.Block(busyKey(busy), busy)
		if res != nil {
			w.Order(res.At)
		}
		return nil
	}

	checkedLate := false
	for {
		remaining := deadline.Sub(s.clk.Now())
		d, late := nextCheck(waitq.SafetyDelay(s.cfg.safety, s.cfg.random()), remaining, checkedLate)
		// Never later than the next idle expiry the last sweep of the resource saw: that
		// look's sweep reaps the holder (docs/waiting.md, "Safety timer").
		expiry, expiring := s.sweeps.nextExpiry(req.Resource)
		if e := expiry.Add(expiryMargin).Sub(s.clk.Now()); expiring && e < d && e < lookBefore(remaining) {
			d, late = max(e, minExpiryLook), false
		} else {
			expiring = false
		}
		checkedLate = checkedLate || late
		woke := w.Wait(ctx, s.clk, d, deadline)
		switch woke {
		case waitq.Deadline:
			return lease.Holder{}, busy
		case waitq.Cancelled:
			busy.Err = ctx.Err()
			return lease.Holder{}, busy
		}
		remaining = deadline.Sub(s.clk.Now())
		if remaining <= 0 {
			return lease.Holder{}, busy
		}
		if err := s.recheck(ctx, p, remaining, busy); err != nil {
			return lease.Holder{}, err
		}
		if woke == waitq.Timer {
			// The safety timer's look: a read only. Room seen is handed to the oldest waiter
			// of this process that has no wake-up yet (maybe this one), so a waiter that
			// looks on its timer never goes ahead of older ones (docs/waiting.md).
			s.renew(ctx, res)
			var notBefore time.Time // a look for an expiry must be taken after it
			if expiring {
				notBefore = expiry
			}
			full, err := s.sharedLook(ctx, req, remaining, busy, notBefore)
			switch {
			case err != nil:
				return lease.Holder{}, err
			case full != nil:
				if err := blocked(full); err != nil {
					return lease.Holder{}, err
				}
			default:
				s.queue.Freed([]string{busyKey(busy)})
			}
			continue
		}
		if woke == waitq.Remote && res == nil {
			// Another process's event woke the oldest waiter of every process: read first,
			// so that the losers cost a read rather than a failed write attempt.
			full, err := s.look(ctx, req, remaining, busy)
			switch {
			case err != nil:
				return lease.Holder{}, err
			case full != nil:
				w.Rearm()
				if err := blocked(full); err != nil {
					return lease.Holder{}, err
				}
				continue
			}
		}
		if res != nil {
			s.renew(ctx, res)
			mine, localAhead, err := s.turn(ctx, *res, busy, remaining)
			if err != nil {
				return lease.Holder{}, err
			}
			if !mine { // older waiters come first
				if localAhead {
					// One of them is in this process, younger here than in the store's
					// order (reserved later): hand the wake-up down the local queue.
					w.PassOn()
				} else {
					w.Rearm() // theirs comes from their process's notifier
				}
				continue
			}
		}
		attempt := req
		attempt.Queued = res != nil
		h, full, err := s.poll(ctx, attempt, remaining, busy)
		switch {
		case err != nil:
			return lease.Holder{}, err
		case full != nil:
			w.Rearm() // lost the race for the slot: back to its place
			if err := blocked(full); err != nil {
				return lease.Holder{}, err
			}
		default:
			return h, nil
		}
	}
}

// recheck resolves the definition again, bounded by remaining: nil while it is unchanged, a
// *definitionChanged when it changed (a definition change wakes every waiter of the process,
// docs/waiting.md), the resolver's error when it no longer resolves (fail closed). A
// resolution cut short by the deadline or the caller answers busy with the last diagnosis.
func (s *Service) recheck(ctx context.Context, p waitPolicy, remaining time.Duration, last *lease.BusyError) error {
	rctx, cancel := context.WithTimeout(ctx, remaining)
	defer cancel()
	d, err := p.current(rctx)
	switch {
	case err != nil && rctx.Err() != nil:
		b := *last
		b.Err = ctx.Err()
		return &b
	case err != nil:
		return err
	case d != nil:
		return &definitionChanged{next: *d}
	}
	return nil
}

const (
	// expiryMargin is how long after a holder's idle expiry, as the last sweep computed it,
	// a waiter looks: the store's clock decides, and the local one may run a little ahead.
	expiryMargin = 25 * time.Millisecond
	// minExpiryLook bounds the pause before an expiry look from below, so that a look that
	// came too early does not turn into a loop of reads.
	minExpiryLook = 10 * time.Millisecond
)

// nextCheck is the pause before a waiter's next own look at the store (safety: the jittered
// safety delay). Every look keeps at least a quarter of the remaining wait for itself: a look
// the deadline cuts answers unavailable (fail closed), which for a level that was merely full
// on a slow store would be a false 503. A deadline that comes before the safety timer (or
// right after it) gets one look at 3/4 of the remaining time, so that a store that went down
// while the level was full answers unavailable rather than busy; after that look the waiter
// sleeps to the deadline (late).
func nextCheck(safety, remaining time.Duration, checkedLate bool) (d time.Duration, late bool) {
	switch {
	case safety < lookBefore(remaining):
		return safety, false
	case checkedLate:
		return remaining, false
	default:
		return lookBefore(remaining), true
	}
}

// lookBefore is the latest a look may start with remaining left of the wait.
func lookBefore(remaining time.Duration) time.Duration { return remaining * 3 / 4 }

// funnelKeys are the counter keys of the request's capped levels.
func funnelKeys(req leasestore.AcquireRequest) []string {
	keys := make([]string, len(req.Caps))
	for i, c := range req.Caps {
		keys[i] = lease.CounterKey(req.Resource, c.Level, lease.ScopeOf(c.Level, req.Tenant, req.Project, req.User))
	}
	return keys
}

// busyKey is the counter key of the level a busy diagnosis names.
func busyKey(b *lease.BusyError) string { return lease.CounterKey(b.Resource, b.Level, b.Scope) }

// look is the safety timer's read, bounded by remaining: a probe and, while full, possibly
// a lazy sweep. It returns the busy diagnosis, or nil when every level shows room (or the
// sweep freed some), or an error. A look cut short by ctx reports busy with the last
// diagnosis; a store that does not answer before the wait's deadline is unavailable (no
// evidence of a full level: fail closed).
func (s *Service) look(ctx context.Context, req leasestore.AcquireRequest, remaining time.Duration,
	last *lease.BusyError) (*lease.BusyError, error) {
	if !s.probe {
		return nil, nil // the benchmark's baseline: every look is a write attempt
	}
	rctx, cancel := context.WithTimeout(ctx, remaining)
	defer cancel()
	full, err := s.store.Probe(rctx, req.Resource, req.Caps, req.Tenant, req.Project, req.User)
	if err != nil {
		if ctx.Err() != nil {
			b := *last
			b.Err = ctx.Err()
			return &b, nil
		}
		return nil, storeError("acquiring "+req.Resource, "lease", err)
	}
	if full != nil && s.sweep(rctx, req.Resource) > 0 {
		return nil, nil
	}
	if full != nil {
		return busyOf(full), nil
	}
	return nil, nil
}

// sharedLook is the safety timer's look, shared by the waiters of one key in this process:
// a look taken by another of them within half a safety period answers for this one too
// (room seen: nothing to do, that look woke the oldest waiter already). So the reads of a
// process stay about two per safety period and key however many wait there. Errors are not
// shared: each waiter fails closed on its own look.
func (s *Service) sharedLook(ctx context.Context, req leasestore.AcquireRequest, remaining time.Duration,
	last *lease.BusyError, notBefore time.Time) (*lease.BusyError, error) {
	key := busyKey(last)
	now := s.clk.Now()
	if r, ok := s.looks.recent(key, now, s.cfg.safety/2, notBefore); ok {
		if r.full == nil && r.err == nil {
			return last, nil
		}
		return r.full, r.err
	}
	full, err := s.look(ctx, req, remaining, last)
	// Only an answer is shared: an error may be this waiter's deadline cutting its look.
	if err == nil && ctx.Err() == nil {
		s.looks.put(key, now, s.cfg.safety/2, lookResult{full: full, err: err})
	}
	return full, err
}

// poll is the write attempt of a woken waiter, bounded by remaining. It returns the holder,
// or the busy diagnosis, or an error; an attempt cut short by ctx reports busy with the last
// diagnosis.
func (s *Service) poll(ctx context.Context, req leasestore.AcquireRequest, remaining time.Duration,
	last *lease.BusyError) (lease.Holder, *lease.BusyError, error) {
	rctx, cancel := context.WithTimeout(ctx, remaining)
	defer cancel()
	h, err := s.store.Acquire(rctx, req)
	busy, err := s.outcome("acquiring "+req.Resource, err)
	if err != nil && ctx.Err() != nil {
		b := *last
		b.Err = ctx.Err()
		return lease.Holder{}, &b, nil
	}
	return h, busy, err
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
	var sw leasestore.IdleSweep
	var dispatched int
	var err error
	if s.cfg.idleReaper != nil {
		sw, dispatched, err = s.cfg.idleReaper(ctx, resource)
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
