package leasestore_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

func TestAcquireBooksEveryLevelNarrowToWide(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	before, err := s.ServerTime(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := mustAcquire(t, s, request("tex2pdf", "acme", "p1", "ann", allCaps(1, 1, 3, 6)))

	want := []string{
		key("tex2pdf", lease.LevelUser, "acme", "p1", "ann"),
		key("tex2pdf", lease.LevelProject, "acme", "p1", "ann"),
		key("tex2pdf", lease.LevelTenant, "acme", "p1", "ann"),
		key("tex2pdf", lease.LevelGlobal, "acme", "p1", "ann"),
	}
	if diff := cmp.Diff(want, h.Levels); diff != "" {
		t.Errorf("levels (-want +got):\n%s", diff)
	}
	if want[0] != "tex2pdf|user|acme/ann" || want[3] != "tex2pdf|global|*" {
		t.Errorf("unexpected counter keys %v", want)
	}
	stored, err := s.GetHolder(ctx, h.Token)
	if err != nil {
		t.Fatal(err)
	}
	if stored.State != lease.StateHeld {
		t.Errorf("state = %s, want HELD", stored.State)
	}
	if diff := cmp.Diff(want, stored.Levels); diff != "" {
		t.Errorf("stored levels (-want +got):\n%s", diff)
	}
	if stored.Pod != (lease.PodRef{Namespace: "ns", Name: "pod-a", UID: "uid-a"}) || stored.Type != "tex" ||
		stored.HolderRef != "job-1" || stored.TTL != time.Hour || stored.Tenant != "acme" {
		t.Errorf("holder fields not stored: %+v", stored)
	}
	// lastSeenAt is the server's time (allow the millisecond truncation of BSON dates).
	if stored.LastSeenAt.Before(before.Add(-time.Millisecond)) || stored.AcquiredAt.IsZero() {
		t.Errorf("lastSeenAt %v before server time %v at start", stored.LastSeenAt, before)
	}
	got := counts(t, s)
	for _, k := range want {
		if got[k] != [2]int{1, 1} {
			t.Errorf("counter %s = %v, want count 1 booked 1", k, got[k])
		}
	}
}

func TestAcquireBusyNamesTheFullLevelAndRollsBack(t *testing.T) {
	cases := map[string]struct {
		caps  []lease.LevelCap
		first leasestore.AcquireRequest
		level lease.Level
		scope string
	}{
		"user, across projects": {
			caps:  allCaps(1, 5, 5, 5),
			first: request("r", "acme", "other-project", "ann", nil),
			level: lease.LevelUser, scope: "acme/ann",
		},
		"project": {
			caps:  allCaps(5, 1, 5, 5),
			first: request("r", "acme", "p1", "bob", nil),
			level: lease.LevelProject, scope: "acme/p1",
		},
		"tenant": {
			caps:  allCaps(5, 5, 1, 5),
			first: request("r", "acme", "p2", "bob", nil),
			level: lease.LevelTenant, scope: "acme",
		},
		"global": {
			caps:  allCaps(5, 5, 5, 1),
			first: request("r", "globex", "p9", "zed", nil),
			level: lease.LevelGlobal, scope: "*",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			first := tc.first
			first.Caps = tc.caps
			mustAcquire(t, s, first)
			before := counts(t, s)

			_, err := s.Acquire(context.Background(), request("r", "acme", "p1", "ann", tc.caps))
			var busy *lease.BusyError
			if !errors.As(err, &busy) || !errors.Is(err, lease.ErrBusy) {
				t.Fatalf("err = %v, want a BusyError", err)
			}
			want := lease.BusyError{Resource: "r", Level: tc.level, Scope: tc.scope, Count: 1, Cap: 1}
			if diff := cmp.Diff(want, *busy); diff != "" {
				t.Errorf("busy (-want +got):\n%s", diff)
			}
			holders, err := s.ListHolders(context.Background(), leasestore.HolderFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(holders) != 1 {
				t.Errorf("%d holders after a busy attempt, want only the first", len(holders))
			}
			after := counts(t, s)
			for k, v := range after {
				if before[k][0] != v[0] && v[0] != 0 {
					t.Errorf("counter %s changed from %v to %v by a busy attempt", k, before[k], v)
				}
			}
			assertNoDrift(t, s)
		})
	}
}

func TestCapOneIsExclusiveUntilRelease(t *testing.T) {
	s := newStore(t)
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	h := mustAcquire(t, s, request("ws", "acme", "p", "u", caps))
	if _, err := s.Acquire(context.Background(), request("ws", "globex", "q", "v", caps)); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("second acquire: %v, want busy", err)
	}
	ok, err := s.Release(context.Background(), h.Token)
	if err != nil || !ok {
		t.Fatalf("release = %v, %v", ok, err)
	}
	mustAcquire(t, s, request("ws", "globex", "q", "v", caps))
}

// Concurrent first use of a counter must never report busy: the loser of the creating
// upsert treats the duplicate key as "exists".
func TestConcurrentFirstUseIsNeverFalselyBusy(t *testing.T) {
	s := newStore(t)
	const n = 32
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: n}, {Level: lease.LevelTenant, Cap: n}}
	var wg sync.WaitGroup
	var failures atomic.Int32
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := s.Acquire(context.Background(), request("fresh", "acme", "p", uniq("u", i), caps)); err != nil {
				failures.Add(1)
				t.Errorf("acquire %d: %v", i, err)
			}
		}()
	}
	waitfor.Group(t, &wg, "the concurrent store calls")
	if got := counts(t, s)["fresh|global|*"]; got != [2]int{n, n} {
		t.Errorf("global counter = %v, want %d booked by %d", got, n, n)
	}
}

func TestTouchAndPayload(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
	first, err := s.GetHolder(ctx, h.Token)
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond) // real time: let the store's clock move past the millisecond
	for range 2 {                    // twice in a row: matched-not-modified still counts as held
		if err := s.Touch(ctx, h.Token); err != nil {
			t.Fatalf("touch: %v", err)
		}
	}
	touched, err := s.GetHolder(ctx, h.Token)
	if err != nil {
		t.Fatal(err)
	}
	if !touched.LastSeenAt.After(first.LastSeenAt) {
		t.Errorf("touch did not move lastSeenAt: %v -> %v", first.LastSeenAt, touched.LastSeenAt)
	}
	payload := map[string]string{"jobId": "42", "endpoint": "http://x"}
	if err := s.UpdatePayload(ctx, h.Token, payload); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetHolder(ctx, h.Token)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(payload, got.Payload); diff != "" {
		t.Errorf("payload (-want +got):\n%s", diff)
	}
	if _, err := s.Release(ctx, h.Token); err != nil {
		t.Fatal(err)
	}
	if err := s.Touch(ctx, h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("touch after release: %v, want lost", err)
	}
	if err := s.UpdatePayload(ctx, h.Token, payload); !errors.Is(err, lease.ErrLost) {
		t.Errorf("payload after release: %v, want lost", err)
	}
	if _, err := s.GetHolder(ctx, h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("get after release: %v, want lost", err)
	}
}

func TestReleaseIsIdempotent(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(2, 2, 2, 2)))
	for i, want := range []bool{true, false, false} {
		ok, err := s.Release(ctx, h.Token)
		if err != nil || ok != want {
			t.Fatalf("release #%d = %v, %v; want %v", i+1, ok, err, want)
		}
	}
	for k, v := range counts(t, s) {
		if v != [2]int{0, 0} {
			t.Errorf("counter %s = %v after release, want 0", k, v)
		}
	}
}

// Release, revoke and reap race for the same holders: exactly one deletes each, and only
// the deleter decrements, so no counter goes below what is booked.
func TestOnlyTheDeleterDecrements(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	const holders = 8
	caps := allCaps(holders+1, holders+1, holders+1, holders+1)
	var tokens []string
	for i := range holders {
		req := request("race", "acme", "p", "u", caps)
		req.Pod = lease.PodRef{Namespace: "ns", Name: "doomed", UID: "uid-doomed"}
		req.HolderRef = uniq("h", i)
		tokens = append(tokens, mustAcquire(t, s, req).Token)
	}
	// A second holder that must survive: it keeps every counter at 1 if nobody over-decrements.
	mustAcquire(t, s, request("race", "acme", "p", "u", caps))

	var wg sync.WaitGroup
	var deleted atomic.Int32
	for _, tok := range tokens {
		for range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ok, err := s.Release(ctx, tok)
				if err != nil {
					t.Error(err)
				}
				if ok {
					deleted.Add(1)
				}
			}()
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, ok, err := s.Revoke(ctx, tok, "acme")
			if err != nil {
				t.Error(err)
			}
			if ok {
				deleted.Add(1)
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		hs, err := s.ReapPod(ctx, lease.PodRef{Namespace: "ns", Name: "doomed", UID: "uid-doomed"})
		if err != nil {
			t.Error(err)
		}
		deleted.Add(int32(len(hs)))
	}()
	waitfor.Group(t, &wg, "the concurrent store calls")
	if got := deleted.Load(); got != holders {
		t.Errorf("%d deletions reported, want exactly %d", got, holders)
	}
	for k, v := range counts(t, s) {
		if v != [2]int{1, 1} {
			t.Errorf("counter %s = %v, want count 1 booked 1", k, v)
		}
	}
}

func TestValidationWritesNothing(t *testing.T) {
	s := newStore(t)
	cases := map[string]leasestore.AcquireRequest{
		"no caps":       request("r", "acme", "p", "u", nil),
		"cap zero":      request("r", "acme", "p", "u", []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 0}}),
		"unknown level": request("r", "acme", "p", "u", []lease.LevelCap{{Level: "galaxy", Cap: 1}}),
		"level twice":   request("r", "acme", "p", "u", []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}, {Level: lease.LevelGlobal, Cap: 2}}),
		"no user":       request("r", "acme", "p", "", allCaps(1, 1, 1, 1)),
		"no tenant":     request("r", "", "p", "u", allCaps(1, 1, 1, 1)),
		"no resource":   request("", "acme", "p", "u", allCaps(1, 1, 1, 1)),
	}
	for name, req := range cases {
		t.Run(name, func(t *testing.T) {
			if _, err := s.Acquire(context.Background(), req); !errors.Is(err, lease.ErrInvalid) {
				t.Errorf("err = %v, want ErrInvalid", err)
			}
		})
	}
	hs, err := s.ListHolders(context.Background(), leasestore.HolderFilter{})
	if err != nil {
		t.Fatal(err)
	}
	if len(hs) != 0 || len(counts(t, s)) != 0 {
		t.Errorf("invalid requests wrote %d holders and %d counters", len(hs), len(counts(t, s)))
	}
}

func TestProbeReadsWithoutWriting(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := allCaps(1, 2, 2, 2)
	busy, err := s.Probe(ctx, "r", caps, "acme", "p", "u")
	if err != nil || busy != nil {
		t.Fatalf("probe on empty store = %v, %v", busy, err)
	}
	mustAcquire(t, s, request("r", "acme", "p", "u", caps))
	busy, err = s.Probe(ctx, "r", caps, "acme", "p", "u")
	if err != nil {
		t.Fatal(err)
	}
	want := &lease.BusyError{Resource: "r", Level: lease.LevelUser, Scope: "acme/u", Count: 1, Cap: 1}
	if diff := cmp.Diff(want, busy); diff != "" {
		t.Errorf("probe (-want +got):\n%s", diff)
	}
	busy, err = s.Probe(ctx, "r", caps, "acme", "p", "other")
	if err != nil || busy != nil {
		t.Errorf("probe for another user = %v, %v; want room", busy, err)
	}
}
