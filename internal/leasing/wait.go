package leasing

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/waitq"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// An acquisition's waiting path, top to bottom (docs/waiting.md).
//
//  1. It registers in this process's wait queue under the public ID of the holder it is about
//     to write, then makes its attempt. A level that is full puts the holder in that level's
//     line in the store (WAITING), where the order of every process's waiters is kept.
//  2. It waits for one of: a slot handed to it (a release, here or in another process, gave
//     the slot to the oldest live waiter, and that is this one), its safety timer, a
//     definition change, its deadline or its caller leaving.
//  3. Handed a slot: it books it and goes on with the funnel (usually one write). Its timer:
//     it renews its place and tries the level once (room nobody was handed), and asks for the
//     level to be swept and repaired. A changed definition: it leaves and starts over.
//  4. Deadline or caller gone: it leaves the line; whatever it booked, or was handed
//     meanwhile, goes to the next waiter.
//
// Store calls after the first attempt run on their own goroutine under the store's timeout:
// the wait is bounded by the deadline, the command is not cut (a cut command costs its
// connection, and a write it may still apply). A call the deadline overtakes is left to end,
// and the holder is then withdrawn.

// deadlineMargin is how long after its deadline an acquisition may still wait for a store
// call in flight: the answer comes at most this late.
const deadlineMargin = 100 * time.Millisecond

// acquire runs the funnel with waiting until deadline. The answer is the holder, a
// *lease.BusyError (the level found full; with Err when the caller left), a store error, or
// *definitionChanged when current reports a new definition. queued (may be nil) is called
// after the first attempt (Request.Queued).
func (s *Service) acquire(ctx context.Context, req leasestore.AcquireRequest, deadline time.Time, current currentFunc, queued func(), age aging) (lease.Holder, error) {
	for {
		h, err := s.acquireOnce(ctx, req, deadline, current, queued, age)
		queued = nil // once
		if errors.Is(err, errStartOver) && deadline.After(s.clk.Now()) && ctx.Err() == nil {
			continue
		}
		if errors.Is(err, errStartOver) {
			return lease.Holder{}, errors.Unwrap(err) // the last busy diagnosis
		}
		return h, err
	}
}

// errStartOver ends one round of acquire whose waiting holder was removed from under it
// (reaped as idle after a long stall, say): the acquisition starts over. It wraps the last
// busy diagnosis.
type startOver struct{ busy *lease.BusyError }

var errStartOver = errors.New("the waiting holder is gone")

func (e *startOver) Error() string        { return errStartOver.Error() }
func (e *startOver) Unwrap() error        { return e.busy }
func (e *startOver) Is(target error) bool { return target == errStartOver }

// acquireOnce is one holder's acquisition: its attempt and, if it queued, its wait.
func (s *Service) acquireOnce(ctx context.Context, req leasestore.AcquireRequest, deadline time.Time, current currentFunc, queued func(), age aging) (lease.Holder, error) {
	op := "acquiring " + resourcesOf(req)
	token, err := leasestore.NewToken()
	if err != nil {
		return lease.Holder{}, err
	}
	req.Token = token
	req.Priority = age.priority(req.Priority, s.clk.Now()) // a holder started over keeps its age
	safety := s.safetyFor(req.TTL)
	// A wait too short to take a slot handed over (the hand-over, the wake-up and the take
	// are a few store round trips) does not join the line: there it would only hold slots
	// that it has to pass on again as it leaves. It tries again once, from room.
	mayWait := deadline.After(s.clk.Now())
	canWait := deadline.Sub(s.clk.Now()) >= minLineWait
	// A waiter renews its place at every safety look; three missed ones and it is passed
	// over. Its place never outlives its deadline: a slot is not handed to a caller that has
	// its answer already.
	waitTTL := func() time.Duration { return max(min(3*safety, deadline.Sub(s.clk.Now())), time.Millisecond) }
	if canWait {
		req.WaitTTL = waitTTL()
	}
	w := s.queue.Register(lease.HolderID(token))
	defer w.Done()

	// The first attempt is bounded by ctx and the store's own timeout, not by the wait: an
	// acquisition that may not wait still gets its one attempt.
	began := s.clk.Now()
	id := s.watch.begin(began)
	h, err := s.store.Acquire(ctx, req)
	s.watch.end(id, s.clk.Now(), err, ctx.Err() != nil)
	if queued != nil {
		queued()
	}
	var waiting *leasestore.WaitingError
	switch {
	case err == nil:
		return h, nil
	case !errors.As(err, &waiting):
		busy, err := s.outcome(op, err)
		if err != nil || busy == nil {
			return h, err
		}
		// Not in line: a lazy sweep may free the slot at once; a short wait tries once more
		// at three quarters of it. The refusal asks for the level to be repaired as well.
		if s.repairs.allow(busyKey(busy), s.clk.Now(), s.cfg.sweepInterval) {
			key := busyKey(busy)
			s.background.Go(func() { _, _ = s.store.Repair(context.Background(), key) })
		}
		// With a wait, the sweep and the retry it earns are later calls, bounded by the
		// deadline; without one they are part of the one attempt.
		asked := s.clk.Now()
		swept, done := within(ctx, s, mayWait, deadline, func(cctx context.Context) int { return s.sweep(cctx, req, busy.Resource) }, nil)
		if !done {
			return lease.Holder{}, s.cut(ctx, op, began, asked, busy)
		}
		retry := swept > 0
		if !retry {
			if d := threeQuarters(deadline.Sub(s.clk.Now())); d > 0 {
				if woke, _ := w.Wait(ctx, s.clk, d, deadline); woke == waitq.Cancelled {
					busy.Err = ctx.Err()
					return lease.Holder{}, busy
				}
				retry = true
			}
		}
		if retry {
			if req.Token, err = leasestore.NewToken(); err != nil {
				return lease.Holder{}, err
			}
			asked = s.clk.Now()
			retried := func(cctx context.Context) (lease.Holder, error) { return s.store.Acquire(cctx, req) }
			var done bool
			if mayWait {
				h, done, err = s.call(ctx, deadline, req.Token, retried)
			} else {
				h, err = retried(ctx)
				done = true
			}
			if !done {
				return lease.Holder{}, s.cut(ctx, op, began, asked, busy)
			}
			if busy, err = s.outcome(op, err); err != nil || busy == nil {
				return h, err
			}
			// Still full: the answer comes at the deadline, as for a waiter in line.
			if woke, _ := w.Wait(ctx, s.clk, deadline.Sub(s.clk.Now())+time.Second, deadline); woke == waitq.Cancelled {
				busy.Err = ctx.Err()
			}
		}
		if busy.Err == nil {
			s.explain(ctx, busy, req.Token) // never in a line: every waiter is ahead
		}
		return lease.Holder{}, busy
	}
	busy := busyOf(waiting.Busy)
	s.tend(req, busy)

	looked := false
	for {
		d := nextLook(safety, s.cfg.random(), deadline.Sub(s.clk.Now()), looked)
		// Never later than the next idle expiry the last sweep of the resource saw: the look
		// then sweeps the idle holder and its slot is handed on (docs/waiting.md).
		if at, ok := s.sweeps.nextExpiry(busy.Resource); ok {
			if e := at.Add(expiryMargin).Sub(s.clk.Now()); e < d {
				d = max(e, minExpiryLook)
			}
		}
		// A waiter owed a reclaim looks when its grace ends (docs/borrowing.md).
		if at, ok := age.reclaim.due(busy, age.since); ok {
			if e := at.Sub(s.clk.Now()); e < d {
				d = max(e, minExpiryLook)
			}
		}
		woke, key := w.Wait(ctx, s.clk, d, deadline)
		switch woke {
		case waitq.Deadline:
			s.explain(ctx, busy, token)
			s.withdraw(ctx, token)
			return lease.Holder{}, busy
		case waitq.Cancelled:
			s.withdraw(ctx, token)
			busy.Err = ctx.Err()
			return lease.Holder{}, busy
		case waitq.Look:
			if err := s.recheck(ctx, current, deadline, busy); err != nil {
				s.withdraw(ctx, token)
				return lease.Holder{}, err
			}
		}
		look := woke != waitq.Granted
		if look {
			s.tend(req, busy)
		}
		looked = true
		asked := s.clk.Now()
		req.WaitTTL = waitTTL()
		req.Priority = age.priority(req.Priority, s.clk.Now()) // the renewal raises its place
		h, done, err := s.call(ctx, deadline, token, func(cctx context.Context) (lease.Holder, error) {
			return s.store.Resume(cctx, req, key, look)
		})
		if !done {
			return lease.Holder{}, s.cut(ctx, op, began, asked, busy)
		}
		switch {
		case err == nil:
			return h, nil
		case errors.As(err, &waiting):
			busy = busyOf(waiting.Busy)
			if at, ok := age.reclaim.due(busy, age.since); ok && !s.clk.Now().Before(at) {
				s.reclaim(ctx, req, age.reclaim, lease.HolderID(token))
			}
		case errors.Is(err, leasestore.ErrNotWaiting):
			return lease.Holder{}, &startOver{busy: busy}
		default:
			s.withdraw(ctx, token)
			_, err := s.outcome(op, err)
			return lease.Holder{}, err
		}
	}
}

// aging is a definition's age bound (docs/waiting.md, "Priority"): a waiter that has waited
// longer than bound since is served as of the highest priority. Its renewals, which it makes
// anyway, write the raise: the bound costs no round trip.
type aging struct {
	bound time.Duration
	since time.Time
	// reclaim: the acquisition's borrowing reclaim, nil when its definition does not borrow.
	reclaim *reclaiming
}

// priority is the priority a waiter asking for p has at now.
func (a aging) priority(p int, now time.Time) int {
	if a.bound > 0 && now.Sub(a.since) >= a.bound {
		return definition.MaxPriority
	}
	return p
}

// reclaiming is what a waiter of a borrowing definition needs to reclaim a borrowed slot.
type reclaiming struct {
	grace     time.Duration
	tenantKey string
	tenantCap int
}

// reclaimOf is the reclaim of an acquisition of req under def, nil when def does not borrow.
func reclaimOf(def definition.Definition, req Request) *reclaiming {
	if !def.Borrows() {
		return nil
	}
	return &reclaiming{
		grace:     def.Borrowing.Grace,
		tenantKey: lease.CounterKey(def.Resource, lease.LevelTenant, lease.ScopeOf(lease.LevelTenant, req.Tenant, req.Project, req.User)),
		tenantCap: def.Caps.Tenant,
	}
}

// due is when a waiter that started waiting at since and waits where busy says may have a
// borrowed slot reclaimed for it: at the end of the grace, and only at the global level
// (a waiter there has booked its tenant level within the cap: a borrower never waits there).
func (r *reclaiming) due(busy *lease.BusyError, since time.Time) (time.Time, bool) {
	if r == nil || busy == nil || busy.Level != lease.LevelGlobal {
		return time.Time{}, false
	}
	return since.Add(r.grace), true
}

// reclaim asks, on its own goroutine, for a borrowed slot to be revoked for the waiter with
// public ID id: the manager through the relay (WithReclaimRelay), or the store, the revoked
// holder going to the revocation listener with reason reclaim. The waiter is handed the freed
// global slot by the release's hand-over (or the next waiter ahead of it is): it does not
// wait for this call. Each look of the waiter asks at most once, so a waiter reclaims at most
// one slot a safety period.
func (s *Service) reclaim(ctx context.Context, req leasestore.AcquireRequest, r *reclaiming, id string) {
	cctx := context.WithoutCancel(ctx)
	s.background.Go(func() {
		log := logf.FromContext(cctx)
		if s.cfg.reclaimRelay != nil {
			_, err := s.cfg.reclaimRelay(cctx, id)
			switch {
			case err == nil:
				return
			case !errors.Is(err, ErrRelayUnreachable):
				// The manager may have reclaimed: reclaiming here too could revoke twice.
				// The waiter's next look asks again.
				log.Error(err, "Reclaim relay failed", "resource", req.Resource, "waiter", id)
				return
			}
			log.Error(err, "Reclaim relay failed, reclaiming here", "resource", req.Resource, "waiter", id)
		}
		if _, err := s.reclaimHere(cctx, req.Resource, req.Tenant, r, id); err != nil {
			log.Error(err, "Reclaim failed", "resource", req.Resource, "waiter", id)
		}
	})
}

// reclaimHere runs one reclaim for the waiter with public ID id of tenant at resource and
// dispatches the revoked holder; revoked reports whether there was one.
func (s *Service) reclaimHere(ctx context.Context, resource, tenant string, r *reclaiming, id string) (revoked bool, err error) {
	h, ok, err := s.store.Reclaim(ctx, leasestore.ReclaimRequest{
		Resource: resource, Tenant: tenant, TenantKey: r.tenantKey, TenantCap: r.tenantCap, For: id,
	})
	if !ok {
		return false, err
	}
	if s.listener == nil { // otherwise the listener counts it, as for every reap path
		s.metrics.Reap.WithLabelValues(metrics.ReapReclaim).Inc()
	}
	s.tokens.forget(h.Token)
	s.dispatch(ctx, metrics.ReapReclaim, []lease.Holder{h})
	return true, err
}

// ErrNotOwed is ReclaimFor's answer for a waiter that is owed no reclaim now: not a waiter of
// the calling pod, not waiting (or lapsed) at the global level of a borrowing definition, or
// within its grace.
var ErrNotOwed = errors.New("the waiter is owed no reclaim")

// ErrRelayUnreachable is a ReclaimRelay's error when the other process could not be reached,
// so that nothing was asked of it: then the service reclaims itself. After any other error the
// other process may have reclaimed, and the service leaves it to the waiter's next look.
var ErrRelayUnreachable = errors.New("the reclaim relay could not reach the manager")

// reclaimSkew is the clock skew ReclaimFor allows between this process and the store, whose
// time the waiter's place is.
const reclaimSkew = time.Second

// ReclaimFor runs the reclaim a lease agent relays (WithReclaimRelay) for the waiter with
// public ID id, in this process, whose listener runs the revoked holder's handler and records
// the Event. caller is the pod that asks (by its source address): only the waiter's own pod
// may. Nothing else of the request is taken on trust: the waiter is read from the store (its
// pod, its tenant, its definition, that it waits at the global level of its resource, is not
// lapsed and has waited the grace), so a pod can only ask for what its waiter's process would
// do. A holder of another pod and an unknown one get the same answer, which tells nothing of
// the holder.
func (s *Service) ReclaimFor(ctx context.Context, caller lease.PodRef, id string) (revoked bool, err error) {
	h, err := s.store.GetHolderByID(ctx, id)
	switch {
	case errors.Is(err, lease.ErrLost) || err == nil && !samePod(h.Pod, caller):
		return false, fmt.Errorf("%w: %s is no waiter of pod %s", ErrNotOwed, id, caller)
	case err != nil:
		return false, err
	case h.State != lease.StateWaiting:
		return false, fmt.Errorf("%w: holder %s is %s", ErrNotOwed, id, h.State)
	}
	def, err := s.resolver.Resolve(ctx, h.Tenant, h.Project, h.LeaseName)
	switch {
	case errors.Is(err, lease.ErrInvalid):
		return false, fmt.Errorf("%w: resolving lease %s: %w", ErrNotOwed, h.LeaseName, err)
	case err != nil:
		return false, err // unreadable now: the agent's next look asks again
	}
	r := reclaimOf(def, Request{Tenant: h.Tenant, Project: h.Project, User: h.User})
	if r == nil || def.Resource != h.Resource {
		return false, fmt.Errorf("%w: lease %s does not borrow", ErrNotOwed, h.LeaseName)
	}
	global := lease.CounterKey(h.Resource, lease.LevelGlobal, lease.ScopeOf(lease.LevelGlobal, h.Tenant, h.Project, h.User))
	line, err := s.store.Line(ctx, global)
	if err != nil {
		return false, err
	}
	i := slices.IndexFunc(line, func(w leasestore.InLine) bool { return w.ID == id })
	switch {
	case i < 0:
		return false, fmt.Errorf("%w: holder %s does not wait at the global level", ErrNotOwed, id)
	case line[i].Lapsed:
		return false, fmt.Errorf("%w: holder %s has lapsed (its process stopped renewing it)", ErrNotOwed, id)
	case s.clk.Now().Add(reclaimSkew).Before(line[i].QueuedAt.Add(r.grace)):
		return false, fmt.Errorf("%w: holder %s is within its grace", ErrNotOwed, id)
	}
	return s.reclaimHere(ctx, h.Resource, h.Tenant, r, id)
}

// samePod: a holder's pod is the caller's (by UID when both have one).
func samePod(holder, caller lease.PodRef) bool {
	if holder.UID != "" && caller.UID != "" {
		return holder.UID == caller.UID
	}
	return holder.Namespace != "" && holder.Namespace == caller.Namespace && holder.Name == caller.Name
}

// call runs f on its own goroutine under the store's timeout (not ctx) and waits for it until
// deadline plus deadlineMargin, or ctx's end. done is false when it stopped waiting first:
// f goes on, and the holder of token is withdrawn when it ends, so that nothing it booked
// is kept for a caller that has its answer.
func (s *Service) call(ctx context.Context, deadline time.Time, token string, f func(context.Context) (lease.Holder, error)) (h lease.Holder, done bool, err error) {
	type result struct {
		h   lease.Holder
		err error
	}
	r, done := within(ctx, s, true, deadline, func(cctx context.Context) result {
		id := s.watch.begin(s.clk.Now())
		h, err := f(cctx)
		s.watch.end(id, s.clk.Now(), err, false)
		return result{h, err}
	}, func(cctx context.Context, _ result) { _ = s.store.Withdraw(cctx, token) })
	return r.h, done, r.err
}

// within runs f on its own goroutine, under ctx without its cancellation, and waits for its
// result until deadline plus deadlineMargin, or ctx's end: done is false when it stopped
// waiting first. f then goes on, and its result goes to late when it ends (dropped when late
// is nil). Without bounded, f runs on the caller's goroutine, under ctx.
func within[T any](ctx context.Context, s *Service, bounded bool, deadline time.Time, f func(context.Context) T, late func(context.Context, T)) (v T, done bool) {
	if !bounded {
		return f(ctx), true
	}
	var (
		mu        sync.Mutex
		abandoned bool
	)
	res := make(chan T, 1)
	cctx := context.WithoutCancel(ctx)
	s.background.Go(func() {
		v := f(cctx)
		mu.Lock()
		gone := abandoned
		if !gone {
			res <- v
		}
		mu.Unlock()
		if gone && late != nil {
			late(cctx, v)
		}
	})
	t := s.clk.NewTimer(max(deadline.Add(deadlineMargin).Sub(s.clk.Now()), 0))
	defer t.Stop()
	select {
	case v = <-res:
		return v, true
	case <-t.C():
	case <-ctx.Done():
	}
	mu.Lock()
	defer mu.Unlock()
	select {
	case v = <-res: // it came just now
		return v, true
	default:
	}
	abandoned = true
	return v, false
}

// cut is the answer of an acquisition whose store call, asked at asked, the deadline or the
// caller overtook in the round that began at began: busy with the last diagnosis, unless the
// store failed a call of this process during the round or left one unanswered for longer
// than its operation timeout (then it is the outage; storeSeen.outage, docs/waiting.md,
// "Deadlines and outages"). A call that is only late is the store's load, not an outage.
func (s *Service) cut(ctx context.Context, op string, began, asked time.Time, busy *lease.BusyError) error {
	if ctx.Err() != nil {
		busy.Err = ctx.Err()
		return busy
	}
	if err := s.watch.snapshot().outage(began, asked, s.clk.Now(), s.cfg.storeTimeout); err != nil {
		return storeError(op, "lease", err)
	}
	return busy
}

// explain gives a busy answer the number of live waiters ahead at its level and the
// estimate of the wait, when the store tells them within deadlineMargin; the answer goes
// without them otherwise (docs/waiting.md, "Who waits"). token is the acquisition's waiting
// holder, still in its line, or one that never lined up.
func (s *Service) explain(ctx context.Context, busy *lease.BusyError, token string) {
	type result struct {
		ahead int
		holds []time.Duration
		err   error
	}
	r, done := within(ctx, s, true, s.clk.Now(), func(cctx context.Context) result {
		ahead, err := s.store.Ahead(cctx, busyKey(busy), token)
		if err != nil {
			return result{err: err}
		}
		holds, err := s.store.HoldTimes(cctx, busy.Resource)
		return result{ahead: ahead, holds: holds, err: err}
	}, nil)
	if !done || r.err != nil {
		return
	}
	busy.Explained, busy.Position = true, r.ahead
	busy.EstimatedWait = lease.EstimateWait(r.ahead, busy.Cap, r.holds)
}

// withdraw takes the waiting holder out of the line on its own goroutine (the answer does
// not wait for it): what it booked goes to the next waiter.
func (s *Service) withdraw(ctx context.Context, token string) {
	cctx := context.WithoutCancel(ctx)
	s.background.Go(func() { _ = s.store.Withdraw(cctx, token) })
}

// tend asks, at most once per sweep interval each, for the lazy idle sweep of the resource
// and for the repair of the full level's counter, on their own goroutines: a holder gone
// idle, or an entry whose holder is gone, comes back to the line without an operator (the
// store hands it to the oldest waiter).
func (s *Service) tend(req leasestore.AcquireRequest, busy *lease.BusyError) {
	ctx := context.Background()
	if s.sweeps.allow(busy.Resource, s.clk.Now(), s.cfg.sweepInterval) {
		s.background.Go(func() { s.sweepNow(ctx, req, busy.Resource) })
	}
	key := busyKey(busy)
	if s.repairs.allow(key, s.clk.Now(), s.cfg.sweepInterval) {
		s.background.Go(func() { _, _ = s.store.Repair(ctx, key) })
	}
}

// recheck resolves the definition again, bounded by the deadline: nil while it is unchanged,
// a *definitionChanged when it changed, the resolver's error when it no longer resolves (fail
// closed). A resolution cut short by the deadline or the caller answers busy with the last
// diagnosis.
func (s *Service) recheck(ctx context.Context, current currentFunc, deadline time.Time, last *lease.BusyError) error {
	rctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	d, err := current(rctx)
	switch {
	case err != nil && rctx.Err() != nil:
		b := *last
		b.Err = ctx.Err()
		return &b
	case err != nil:
		return err
	case d != nil:
		return &definitionChanged{next: d}
	}
	return nil
}

// nextLook is how long a waiter pauses before its next look at the store: a safety period,
// jittered by r in [0, 1) (waitq.SafetyDelay). A look keeps a quarter of the remaining wait
// for itself: a wait shorter than that still looks once, at three quarters of it, so that a
// store that went away meanwhile answers unavailable, not busy; after that look the deadline
// comes first. Any remaining wait, a pod's of a hundred years included, is safe from overflow.
func nextLook(safety time.Duration, r float64, remaining time.Duration, looked bool) time.Duration {
	d := waitq.SafetyDelay(safety, r)
	if d <= threeQuarters(remaining) {
		return d
	}
	if looked {
		return remaining + time.Second // no further look: the deadline comes first
	}
	return threeQuarters(remaining)
}

// threeQuarters is three quarters of d, for any d (d*3/4 overflows beyond 97 years).
func threeQuarters(d time.Duration) time.Duration { return d - d/4 }

// safetyFor is the safety period of a waiter on a lease with ttl: the configured one, but at
// most a third of the TTL, so that a live waiter's renewals keep it from being reaped as idle.
func (s *Service) safetyFor(ttl time.Duration) time.Duration {
	if ttl > 0 && s.cfg.safety > ttl/3 {
		return max(ttl/3, minSafety)
	}
	return s.cfg.safety
}

const (
	// minLineWait is the shortest wait that joins a full level's line.
	minLineWait = 500 * time.Millisecond
	// minSafety bounds a waiter's safety period from below.
	minSafety = 50 * time.Millisecond
	// expiryMargin is how long after a holder's idle expiry, as the last sweep computed it,
	// a waiter looks: the store's clock decides, and the local one may run a little ahead.
	expiryMargin = 25 * time.Millisecond
	// minExpiryLook bounds the pause before an expiry look from below, so that a look that
	// came too early does not turn into a loop of reads.
	minExpiryLook = 10 * time.Millisecond
)

// busyKey is the counter key of the level a busy diagnosis names.
func busyKey(b *lease.BusyError) string { return lease.CounterKey(b.Resource, b.Level, b.Scope) }
