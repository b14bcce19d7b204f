package leasestore

import (
	"context"
	"errors"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Round is what one read of every holder gave the scheduled sweep (SweepRound): the idle
// holders it released, the pods the holders named, and the holders that exist, whose entries
// ReconcileRound then needs no second look for.
type Round struct {
	// Idle are the holders the round deleted as idle (a waiter whose renewals stopped is
	// deleted too but is no lease: it is not listed).
	Idle []lease.Holder
	// Pods are the distinct pods the holders named when they were read, in the order first
	// seen (a holder without a pod has an empty one).
	Pods []lease.PodRef

	now   time.Time       // the server's time before the read
	known map[string]bool // the public IDs of the holders read; nil: not read
	marks borrowMarks     // per tenant counter, the held holders marked borrowed at it
}

// errRoundNotRead is ReconcileRound's answer for a round whose read of the holders failed.
var errRoundNotRead = errors.New("reconcile skipped: the holders were not read")

// SweepRound reads every holder once, in batches, for what the idle reap (ReapIdle("")), a
// scan of the holders' pods and Reconcile's look-up of the entries' holders would each read
// them for: it releases the idle holders, lists the holders' pods, and keeps the holders it
// saw for ReconcileRound. On a store that runs one command at a time (the development server) every
// read of the holders delays the acquisitions of that moment, so one read instead of three
// is what keeps a store of many holders fast (docs/operations.md, "Behaviour at scale").
//
// On an error the round holds what was done before it; if the read itself failed, no pod
// and no holders.
func (s *Store) SweepRound(ctx context.Context) (Round, error) {
	now, err := s.ServerTime(ctx)
	if err != nil {
		return Round{}, err
	}
	known, marks := map[string]bool{}, borrowMarks{}
	seen := map[lease.PodRef]bool{}
	var pods []lease.PodRef
	var expired []idleCandidate
	err = eachDoc(ctx, s, s.holders, "reading holders", bson.D{},
		bson.D{
			{Key: "_id", Value: 1}, {Key: "pid", Value: 1}, {Key: "lastSeenAt", Value: 1}, {Key: "ttlSeconds", Value: 1},
			{Key: "pod", Value: 1}, {Key: "state", Value: 1}, {Key: "borrowKey", Value: 1}, {Key: "borrowCap", Value: 1},
		}, nil,
		func(d holderDoc) error {
			if d.idleAt().Before(now) {
				expired = append(expired, candidate(d))
			}
			if d.PID != "" {
				known[d.PID] = true
			}
			if d.State == stateReleased {
				return nil // gone already: neither a pod's holder nor a booking
			}
			p := lease.PodRef{Namespace: d.Pod.Namespace, Name: d.Pod.Name, UID: d.Pod.UID}
			if !seen[p] {
				seen[p] = true
				pods = append(pods, p)
			}
			if d.BorrowKey != "" && d.State == string(lease.StateHeld) && !d.idleAt().Before(now) {
				marks[d.BorrowKey] = append(marks[d.BorrowKey], markedHolder{id: d.ID, borrowCap: d.BorrowCap})
			}
			return nil
		})
	if err != nil {
		return Round{}, err
	}
	r := Round{Pods: pods, now: now, known: known, marks: marks}
	r.Idle, err = s.reapExpired(ctx, expired)
	return r, err
}

// ReconcileRound is Reconcile with r's read of the holders: an entry of a holder r saw needs
// no second look (the holder existed after the entry was written, or the entry comes from a
// write that arrived after the holder's release, which the next round removes).
func (s *Store) ReconcileRound(ctx context.Context, r Round) (ReconcileResult, error) {
	if r.known == nil {
		return ReconcileResult{}, errRoundNotRead
	}
	return s.reconcile(ctx, r.now, r.known, r.marks)
}

// idleCandidate is a holder a read found idle: released on the condition that its
// lastSeenAt is still the one read (a touch in between makes the release miss).
type idleCandidate struct {
	id       string
	lastSeen time.Time
	// released: a holder whose release stopped before its end (its process died).
	released bool
}

// idleAt is when the holder goes idle: its last sign of life plus its TTL.
func (d holderDoc) idleAt() time.Time {
	return d.LastSeenAt.Add(time.Duration(d.TTLSeconds * float64(time.Second)))
}

// reapExpired releases each candidate that is still as read, giving back its entries, and
// returns the leases among them; on an error, those released so far (the one whose give-back
// failed included). A candidate whose release stopped before its end (it has had an
// operation timeout to finish) is released again: its give-back is done again, each removal
// conditional on the entry, and the hand-overs it began are finished.
func (s *Store) reapExpired(ctx context.Context, expired []idleCandidate) ([]lease.Holder, error) {
	var reaped []lease.Holder
	for _, c := range expired {
		if c.released {
			if err := s.redoRelease(ctx, c); err != nil {
				return reaped, err
			}
			continue
		}
		h, ok, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: c.id}, {Key: "lastSeenAt", Value: c.lastSeen}}, nil)
		// Released is reaped, even when giving its slots back failed (the sweep does it
		// again). A waiter whose renewals stopped was no lease: nobody is told.
		if ok && h.State != lease.StateWaiting {
			reaped = append(reaped, h)
		}
		if err != nil {
			return reaped, err
		}
	}
	return reaped, nil
}

// redoRelease does the give-back of an expired released holder again and deletes it.
func (s *Store) redoRelease(ctx context.Context, c idleCandidate) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var d holderDoc
	err := s.holders.FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: c.id}, {Key: "state", Value: stateReleased}, {Key: "lastSeenAt", Value: c.lastSeen}},
		bson.D{{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}}}).Decode(&d)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return nil // done meanwhile, or taken by another sweep
	case err != nil:
		return unavailable("releasing holder again", err)
	}
	pid := d.PID
	if pid == "" {
		pid = lease.HolderID(d.ID)
	}
	if err := s.finishHandOvers(ctx, pid); err != nil {
		return err
	}
	if _, err := s.giveBackAll(ctx, d, nil); err != nil {
		return err
	}
	return s.deleteMark(ctx, d.ID)
}

// candidate is the idle candidate d.
func candidate(d holderDoc) idleCandidate {
	return idleCandidate{id: d.ID, lastSeen: d.LastSeenAt, released: d.State == stateReleased}
}

func nonEmpty(k string) []string {
	if k == "" {
		return nil
	}
	return []string{k}
}
