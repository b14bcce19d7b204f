package leasing

import (
	"context"
	"time"

	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// DefaultReservationTTL is how long a reservation outlives its last renewal: the longest a
// crashed waiter keeps its place (and the slot it would get idle).
const DefaultReservationTTL = 5 * time.Second

// WithReservationTTL sets how long a reservation outlives its last renewal.
func WithReservationTTL(d time.Duration) Option { return func(c *config) { c.reservationTTL = d } }

// reserve queues the waiter at the level busy names when the definition's policy is
// definition.FairGlobal (docs/waiting.md, "Fairness policies"), or returns nil. Costs per
// waiting acquisition: two writes to reserve, two to leave, two reads per wake-up, and one
// renewal write per process and level every third of the reservation TTL.
func (s *Service) reserve(ctx context.Context, fairness definition.Fairness, pod lease.PodRef, busy *lease.BusyError) (*leasestore.Reservation, error) {
	if fairness != definition.FairGlobal {
		return nil, nil
	}
	r, err := s.store.Reserve(ctx, busyKey(busy), pod, s.clk.Now().Add(s.cfg.reservationTTL))
	if err != nil {
		return nil, storeError("waiting for "+busy.Resource, "lease", err)
	}
	s.renewals.allow(r.Key, s.clk.Now(), s.cfg.reservationTTL/3) // fresh: no renewal due yet
	return &r, nil
}

// requeue moves the reservation when the level that is full changed.
func (s *Service) requeue(ctx context.Context, pod lease.PodRef, res *leasestore.Reservation, was, now *lease.BusyError) (*leasestore.Reservation, error) {
	if res == nil || busyKey(was) == busyKey(now) {
		return res, nil
	}
	s.leave(ctx, res)
	return s.reserve(ctx, definition.FairGlobal, pod, now)
}

// leave gives the place up (the waiter got its slot, gave up or failed). A failure leaves
// the reservation to expire.
func (s *Service) leave(ctx context.Context, res *leasestore.Reservation) {
	if res == nil {
		return
	}
	if err := s.store.Leave(ctx, *res); err != nil {
		logf.FromContext(ctx).Error(err, "Leaving the wait queue failed; the reservation expires", "key", res.Key)
	}
}

// renew extends this process's reservations on the key, at most every third of their TTL.
func (s *Service) renew(ctx context.Context, res *leasestore.Reservation) {
	if res == nil || !s.renewals.allow(res.Key, s.clk.Now(), s.cfg.reservationTTL/3) {
		return
	}
	if err := s.store.Renew(ctx, res.Key, s.clk.Now().Add(s.cfg.reservationTTL)); err != nil && ctx.Err() == nil {
		logf.FromContext(ctx).Error(err, "Renewing reservations failed", "key", res.Key)
	}
}

// turn asks the store whether the waiter's turn has come, bounded by remaining, and whether
// a reservation ahead of it is this process's. A store that does not answer is unavailable
// (fail closed); cut by the caller: not its turn.
func (s *Service) turn(ctx context.Context, res leasestore.Reservation, busy *lease.BusyError, remaining time.Duration) (mine, localAhead bool, err error) {
	rctx, cancel := context.WithTimeout(ctx, remaining)
	defer cancel()
	mine, localAhead, err = s.store.Turn(rctx, res, busy.Cap, s.clk.Now())
	if err != nil {
		if ctx.Err() != nil {
			return false, false, nil
		}
		return false, false, storeError("waiting for "+busy.Resource, "lease", err)
	}
	return mine, localAhead, nil
}
