package leasestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

func TestQueueOrderTurnAndBarrier(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	h := mustAcquire(t, s, request("gpu", "acme", "p", "ann", caps))
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	pod := lease.PodRef{Namespace: "ns", Name: "w", UID: "u"}
	far := time.Now().Add(time.Minute)
	first, err := s.Reserve(ctx, k, pod, far)
	if err != nil {
		t.Fatal(err)
	}
	second, err := s.Reserve(ctx, k, pod, far)
	if err != nil {
		t.Fatal(err)
	}
	rs, err := s.ListReservations(ctx, k)
	if err != nil || len(rs) != 2 || rs[0].ID != first.ID {
		t.Fatalf("reservations %+v, %v; want first, second", rs, err)
	}
	// Full: nobody's turn.
	for _, r := range []leasestore.Reservation{first, second} {
		if mine, _, err := s.Turn(ctx, r, 1, time.Now()); err != nil || mine {
			t.Errorf("turn while full = %v, %v", mine, err)
		}
	}
	if _, err := s.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	if mine, _, err := s.Turn(ctx, first, 1, time.Now()); err != nil || !mine {
		t.Errorf("first's turn after the release = %v, %v; want true", mine, err)
	}
	if mine, _, err := s.Turn(ctx, second, 1, time.Now()); err != nil || mine {
		t.Errorf("second's turn after the release = %v, %v; want false", mine, err)
	}
	// A newcomer without a reservation does not take the slot while others queue.
	_, err = s.Acquire(ctx, request("gpu", "acme", "p", "bob", caps))
	var busy *lease.BusyError
	if !errors.As(err, &busy) {
		t.Fatalf("newcomer while two queue = %v, want busy", err)
	}
	req := request("gpu", "acme", "p", "cid", caps)
	req.Queued = true
	mustAcquire(t, s, req)
	for _, r := range []leasestore.Reservation{first, second} {
		if err := s.Leave(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	if rs, _ := s.ListReservations(ctx, ""); len(rs) != 0 {
		t.Errorf("reservations left: %+v", rs)
	}
	assertNoDrift(t, s)
}

// TestExpiredReservationIsDroppedByTurn: a waiter that crashed keeps its place only until its
// reservation expires; the next Turn drops it and lowers the barrier.
func TestExpiredReservationIsDroppedByTurn(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	h := mustAcquire(t, s, request("gpu", "acme", "p", "ann", caps))
	now := time.Now()
	crashed, err := s.Reserve(ctx, k, lease.PodRef{Namespace: "ns", Name: "gone", UID: "g"}, now.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	live, err := s.Reserve(ctx, k, lease.PodRef{Namespace: "ns", Name: "w", UID: "w"}, now.Add(time.Minute))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	if mine, _, err := s.Turn(ctx, live, 1, now); err != nil || mine {
		t.Fatalf("turn behind a live reservation = %v, %v; want false", mine, err)
	}
	// The crashed waiter's reservation expired (a caller's clock past it).
	if mine, _, err := s.Turn(ctx, live, 1, now.Add(2*time.Second)); err != nil || !mine {
		t.Fatalf("turn behind an expired reservation = %v, %v; want true", mine, err)
	}
	rs, _ := s.ListReservations(ctx, k)
	if len(rs) != 1 || rs[0].ID != live.ID {
		t.Errorf("reservations %+v, want only the live one (crashed: %s)", rs, crashed.ID)
	}
	if err := s.Leave(ctx, live); err != nil {
		t.Fatal(err)
	}
	// No barrier left: a newcomer gets the free slot at once.
	mustAcquire(t, s, request("gpu", "acme", "p", "bob", caps))
}

// TestDeletedPodsReservationsAreDroppedAtOnce: the pod-gone path drops the reservations of
// exactly that pod, and the barrier they raised.
func TestDeletedPodsReservationsAreDroppedAtOnce(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	k := key("gpu", lease.LevelGlobal, "acme", "p", "ann")
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	h := mustAcquire(t, s, request("gpu", "acme", "p", "ann", caps))
	gone := lease.PodRef{Namespace: "ns", Name: "gone", UID: "g"}
	other := lease.PodRef{Namespace: "ns", Name: "gone", UID: "another-incarnation"}
	far := time.Now().Add(time.Minute)
	for _, p := range []lease.PodRef{gone, gone, other} {
		if _, err := s.Reserve(ctx, k, p, far); err != nil {
			t.Fatal(err)
		}
	}
	n, err := s.DropReservations(ctx, gone)
	if err != nil || n != 2 {
		t.Fatalf("DropReservations = %d, %v; want 2", n, err)
	}
	rs, _ := s.ListReservations(ctx, k)
	if len(rs) != 1 || rs[0].Pod != other {
		t.Fatalf("reservations left %+v, want the other incarnation's", rs)
	}
	if _, err := s.DropReservations(ctx, other); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	mustAcquire(t, s, request("gpu", "acme", "p", "bob", caps))
	_ = context.Background
}
