package leasestore

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Round is what one read of every holder gave the scheduled sweep (SweepRound): the idle
// holders it deleted, the pods the holders named, and each counter's bookings, which
// ReconcileRound compares with the counters.
type Round struct {
	// Idle are the holders the round deleted as idle (a waiter whose renewals stopped is
	// deleted too but is no lease: it is not listed).
	Idle []lease.Holder
	// Pods are the distinct pods the holders named when they were read, in the order first
	// seen (a holder without a pod has an empty one).
	Pods []lease.PodRef

	now    time.Time      // the server's time before the read
	booked map[string]int // per counter key, the holders that booked it; nil: not read
	marks  borrowMarks    // per tenant counter, the held holders marked borrowed at it
}

// errRoundNotRead is ReconcileRound's answer for a round whose read of the holders failed.
var errRoundNotRead = errors.New("reconcile skipped: the holders were not read")

// SweepRound reads every holder once, in batches, for what the idle reap (ReapIdle("")), a
// scan of the holders' pods and Reconcile's count of the bookings would each read them for:
// it deletes the idle holders, lists the holders' pods, and keeps the bookings for
// ReconcileRound. On a store that runs one command at a time (the development server) every
// read of the holders delays the acquisitions of that moment, so one read instead of three
// is what keeps a store of many holders fast (docs/operations.md, "Behaviour at scale").
//
// The deletes come after the read and are to reconcile what concurrent releases are: each
// decrements its counters with a fresh updatedAt, which ReconcileRound leaves alone. On an
// error the round holds what was done before it; if the read itself failed, no pod and no
// bookings.
func (s *Store) SweepRound(ctx context.Context) (Round, error) {
	now, err := s.ServerTime(ctx)
	if err != nil {
		return Round{}, err
	}
	booked, marks := map[string]int{}, borrowMarks{}
	seen := map[lease.PodRef]bool{}
	var pods []lease.PodRef
	var expired []idleCandidate
	err = eachDoc(ctx, s, s.holders, "reading holders", bson.D{},
		bson.D{
			{Key: "_id", Value: 1}, {Key: "lastSeenAt", Value: 1}, {Key: "ttlSeconds", Value: 1},
			{Key: "pod", Value: 1}, {Key: "levels", Value: 1}, {Key: "grantKey", Value: 1},
			{Key: "state", Value: 1}, {Key: "incKey", Value: 1}, {Key: "borrowKey", Value: 1}, {Key: "borrowCap", Value: 1},
		}, nil,
		func(d holderDoc) error {
			if d.idleAt().Before(now) {
				expired = append(expired, candidate(d))
			}
			if d.State == stateReleased {
				return nil // gone already: neither a pod's holder nor a booking
			}
			p := lease.PodRef{Namespace: d.Pod.Namespace, Name: d.Pod.Name, UID: d.Pod.UID}
			if !seen[p] {
				seen[p] = true
				pods = append(pods, p)
			}
			for _, k := range d.booked() {
				booked[k]++
			}
			if d.BorrowKey != "" && d.State == string(lease.StateHeld) && !d.idleAt().Before(now) {
				marks[d.BorrowKey] = append(marks[d.BorrowKey], markedHolder{id: d.ID, borrowCap: d.BorrowCap})
			}
			return nil
		})
	if err != nil {
		return Round{}, err
	}
	r := Round{Pods: pods, now: now, booked: booked, marks: marks}
	r.Idle, err = s.reapExpired(ctx, expired)
	return r, err
}

// ReconcileRound is Reconcile with the bookings of r's read of the holders: the counters are
// read now and each is decided against them. A counter changed since r's read (an acquisition,
// a release, a reap by the round itself) carries an updatedAt after r's read and is skipped,
// as any counter changed during a reconcile is.
func (s *Store) ReconcileRound(ctx context.Context, r Round) (ReconcileResult, error) {
	if r.booked == nil {
		return ReconcileResult{}, errRoundNotRead
	}
	return s.reconcile(ctx, r.now, r.booked, r.marks)
}

// idleCandidate is a holder a read found idle: deleted on the condition that its lastSeenAt
// is still the one read (a touch in between makes the delete miss).
type idleCandidate struct {
	id       string
	lastSeen time.Time
	// released: a release mark (releaseHolder) whose process died; keys: the counters it names.
	released bool
	keys     []string
}

// idleAt is when the holder goes idle: its last sign of life plus its TTL.
func (d holderDoc) idleAt() time.Time {
	return d.LastSeenAt.Add(time.Duration(d.TTLSeconds * float64(time.Second)))
}

// reapExpired releases each candidate that is still as read, giving back its slots, and
// returns the leases among them; on an error, those released so far (the one whose give-back
// failed included). A candidate that is a release mark left by a crash (its give-back has had
// an operation timeout to end) is deleted, and the counters it named are healed: whatever of
// its give-back did not happen is a slot that no holder counts any more.
func (s *Store) reapExpired(ctx context.Context, expired []idleCandidate) ([]lease.Holder, error) {
	var reaped []lease.Holder
	for _, c := range expired {
		if c.released {
			if err := s.dropReleased(ctx, c); err != nil {
				return reaped, err
			}
			continue
		}
		h, ok, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: c.id}, {Key: "lastSeenAt", Value: c.lastSeen}}, nil, "")
		// Released is reaped, even when giving its slots back failed (they are healed). A
		// waiter whose renewals stopped was no lease: nobody is told.
		if ok && h.State != lease.StateWaiting {
			reaped = append(reaped, h)
		}
		if err != nil {
			return reaped, err
		}
	}
	return reaped, nil
}

// dropReleased deletes an expired release mark and heals the counters it named.
func (s *Store) dropReleased(ctx context.Context, c idleCandidate) error {
	dctx, cancel := s.bound(ctx)
	defer cancel()
	res, err := s.holders.DeleteOne(dctx, bson.D{{Key: "_id", Value: c.id}, {Key: "state", Value: stateReleased}, {Key: "lastSeenAt", Value: c.lastSeen}})
	if err != nil {
		return unavailable("deleting released holder", err)
	}
	if res.DeletedCount == 1 {
		for _, k := range c.keys {
			s.healAfter(ctx, k)
		}
	}
	return nil
}

// candidate is the idle candidate d (released: a release mark, with the counters it names).
func candidate(d holderDoc) idleCandidate {
	c := idleCandidate{id: d.ID, lastSeen: d.LastSeenAt}
	if d.State == stateReleased {
		c.released = true
		c.keys = union(d.booked(), nonEmpty(d.IncKey))
	}
	return c
}

func nonEmpty(k string) []string {
	if k == "" {
		return nil
	}
	return []string{k}
}
