package leasestore

import (
	"context"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"k8s.io/utils/lru"

	"github.com/vancetope/lease-operator/internal/lease"
)

// A store remembers the leases it answered held (mine), so that their release needs no read
// of the holder: what a release gives back is known from the answer (a held holder's entries
// are exactly its levels). Such a release gives the entries back first and deletes the holder
// after, which is the order the repair relies on (slots.go); without a mark in between, a
// concurrent reap gives back the same entries, each removal and move conditional on the
// entry, so each goes once. A release nobody waits for deletes the holder on the caller's
// path (two writes); one that handed a slot over deletes it off the path (marks.go), so that
// a contended grant costs the caller three round trips: the fence, naming the waiter, moving
// the entry. A lease of this store released elsewhere, reaped, or unknown here (another
// process answered it; more than maxMine were answered since) is released with its mark.

// maxMine bounds the leases a store remembers.
const maxMine = 4096

// myLease is what a store keeps of a lease it answered held.
type myLease struct {
	pid      string
	resource string
	keys     []string
	fence    int64
	// at is when this store answered it (the hold time's start, within a round trip).
	at time.Time
}

func newMine() *lru.Cache { return lru.New(maxMine) }

// remember keeps h, a lease this store answers held; a borrowed one is not kept (its release
// hands the borrowed slot over with the borrowing's cap, which only its document has).
func (s *Store) remember(h lease.Holder) {
	if h.State != lease.StateHeld || h.Borrowed || h.Token == "" || len(h.Levels) == 0 {
		return
	}
	s.mine.Add(h.Token, myLease{pid: h.ID, resource: h.Resource, keys: h.Levels, fence: h.Fence, at: time.Now()})
}

// forget drops what is kept of token (a release or revocation by another path).
func (s *Store) forget(token string) { s.mine.Remove(token) }

// releaseMine releases a lease this store answered held, without its mark. ok is false when
// the store keeps nothing of token; released reports whether this release gave back any of
// its entries (false: a reap or revocation had given them back already; a release by mark
// reports a held holder as released only when it gave back an entry too, so that of the two
// one reports, but for one whose entries at several levels both split between them).
func (s *Store) releaseMine(ctx context.Context, token string) (released, ok bool, err error) {
	l, ok := s.takeMine(token)
	if !ok {
		return false, false, nil
	}
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	if err := s.fault(StepHolderReleased, token); err != nil {
		// The holder stays, HELD: its TTL ends it, and its reap gives back what it has.
		return false, true, unavailable("releasing holder "+l.pid, err)
	}
	hold := holdSample{ms: max(time.Since(l.at).Milliseconds(), 1), slot: l.fence % holdSlots}
	n, handed, err := s.giveBackCounted(ctx, l.keys, l.pid, hold)
	if err != nil {
		// The holder stays, HELD: its TTL ends it, and its reap gives back what is left.
		return false, true, err
	}
	if handed == 0 || !s.dropHeld(token) {
		// Unless another path marked it meanwhile (then it deletes it after its give-back).
		if _, err := s.holders.DeleteOne(ctx, bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StateHeld)}}); err != nil {
			return n > 0, true, unavailable("deleting released holder "+l.pid, err)
		}
	}
	return n > 0, true, nil
}

// takeMine returns and forgets what is kept of token, atomically: of two releases of one
// lease in this store, one takes it.
func (s *Store) takeMine(token string) (myLease, bool) {
	s.mineMu.Lock()
	defer s.mineMu.Unlock()
	v, ok := s.mine.Get(token)
	if !ok {
		return myLease{}, false
	}
	s.mine.Remove(token)
	return v.(myLease), true
}
