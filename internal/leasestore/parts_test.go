package leasestore_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// partsReq is an acquisition of several resources, each capped at global (and tenant) level.
func partsReq(user string, resources ...string) leasestore.AcquireRequest {
	r := request("", "acme", "p", user, nil)
	r.LeaseName, r.Resource = "", ""
	for _, res := range resources {
		r.Parts = append(r.Parts, leasestore.Part{LeaseName: "l-" + res, Resource: res,
			Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}, {Level: lease.LevelTenant, Cap: 3}}})
	}
	return r
}

func TestPartsAreBookedAllTogetherWithAFenceEach(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	h := mustAcquire(t, s, partsReq("ann", "licence", "gpu"))
	want := []string{"gpu|tenant|acme", "gpu|global|*", "licence|tenant|acme", "licence|global|*"}
	if diff := cmp.Diff(want, h.Levels); diff != "" {
		t.Errorf("levels, the parts in the order of their resources (-want +got):\n%s", diff)
	}
	if len(h.Parts) != 2 || h.Parts[0].Resource != "gpu" || h.Parts[1].Resource != "licence" ||
		h.Parts[0].LeaseName != "l-gpu" || h.Parts[0].Fence < 1 || h.Parts[1].Fence < 1 {
		t.Fatalf("parts = %+v, want gpu then licence, each with a fence", h.Parts)
	}
	if h.LeaseNames() != "l-gpu+l-licence" || h.State != lease.StateHeld {
		t.Errorf("holder %s %s", h.LeaseNames(), h.State)
	}
	stored, err := s.GetHolder(ctx, h.Token)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(h.Parts, stored.Parts); diff != "" || stored.State != lease.StateHeld {
		t.Errorf("stored %s, parts (-answered +stored):\n%s", stored.State, diff)
	}
	if fence, err := s.TouchFence(ctx, h.Token); err != nil || fence != h.Parts[0].Fence {
		t.Errorf("touch = %d, %v; want the first part's fence %d", fence, err, h.Parts[0].Fence)
	}

	// Either part full: nothing is booked, and the answer names the part.
	single := request("licence", "acme", "p", "bob", []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}})
	if _, err := s.Acquire(ctx, single); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("single acquisition of a booked licence = %v, want busy", err)
	}
	var busy *lease.BusyError
	_, err = s.Acquire(ctx, partsReq("bob", "gpu", "licence"))
	if !errors.As(err, &busy) || busy.Lease != "l-gpu" || busy.Resource != "gpu" || busy.Level != lease.LevelGlobal {
		t.Fatalf("second acquisition = %v, want busy naming part l-gpu", err)
	}
	if out, err := s.Release(ctx, h.Token); err != nil || !out {
		t.Fatalf("release = %v, %v", out, err)
	}
	for k, v := range counts(t, s) {
		if v[0] != 0 {
			t.Errorf("after the release counter %s counts %d", k, v[0])
		}
	}
	// The next grant of each resource has a higher fence.
	next := mustAcquire(t, s, partsReq("bob", "gpu", "licence"))
	for i := range next.Parts {
		if next.Parts[i].Fence <= h.Parts[i].Fence {
			t.Errorf("part %s: fence %d after %d", next.Parts[i].Resource, next.Parts[i].Fence, h.Parts[i].Fence)
		}
	}
}

func TestPartsThatShareAResourceAreRefused(t *testing.T) {
	s := newStore(t)
	req := partsReq("ann", "gpu", "gpu")
	req.Parts[1].LeaseName = "gpu-big"
	_, err := s.Acquire(ctx(t), req)
	if !errors.Is(err, lease.ErrInvalid) {
		t.Fatalf("acquire = %v, want invalid", err)
	}
	if len(counts(t, s)) != 0 {
		t.Errorf("counters written for a refused request: %v", counts(t, s))
	}
}

func ctx(t *testing.T) context.Context { return ctxT(t) }

// TestOppositeOrdersDoNotDeadlock: two acquisitions of the same two resources, named in
// opposite orders, each with a single holder of one resource ahead. Both book in the order of
// the resources, so the second waits at the first resource holding nothing: when the singles
// release, the waiters are served one after the other, and no level holds more than its cap.
func TestOppositeOrdersDoNotDeadlock(t *testing.T) {
	s := newStore(t)
	c := ctxT(t)
	one := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	gpu := mustAcquire(t, s, request("gpu", "acme", "p", "g", one))
	lic := mustAcquire(t, s, request("licence", "acme", "p", "l", one))

	wait := func(req leasestore.AcquireRequest) string {
		req.WaitTTL = time.Minute
		req.Token, _ = leasestore.NewToken()
		_, err := s.Acquire(c, req)
		var w *leasestore.WaitingError
		if !errors.As(err, &w) {
			t.Fatalf("acquire = %v, want waiting", err)
		}
		return w.Token
	}
	a := partsReq("ann", "gpu", "licence")
	b := partsReq("bob", "licence", "gpu")
	ta, tb := wait(a), wait(b)
	a.Token, b.Token = ta, tb
	a.WaitTTL, b.WaitTTL = time.Minute, time.Minute
	ws, err := s.ListWaiters(c, leasestore.HolderFilter{})
	if err != nil || len(ws) != 2 {
		t.Fatalf("waiters = %v, %v", ws, err)
	}
	for _, w := range ws {
		if w.Resource != "gpu" || w.Lease != "l-gpu" {
			t.Errorf("waiter %s waits on %s (%s), want gpu: the first part in the order of resources", w.Holder.ID, w.Resource, w.Lease)
		}
	}
	if _, err := s.Release(c, lic.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Release(c, gpu.Token); err != nil {
		t.Fatal(err)
	}
	// ann is first in gpu's line: the gpu slot is handed to her, the licence is free.
	h, err := s.Resume(c, a, "", true)
	if err != nil || h.State != lease.StateHeld || len(h.Parts) != 2 {
		t.Fatalf("ann resumes: %+v, %v; want held", h, err)
	}
	if _, err := s.Resume(c, b, "", true); !errors.As(err, new(*leasestore.WaitingError)) {
		t.Fatalf("bob resumes = %v, want still waiting", err)
	}
	if _, err := s.Release(c, h.Token); err != nil {
		t.Fatal(err)
	}
	h, err = s.Resume(c, b, "", true)
	if err != nil || h.State != lease.StateHeld {
		t.Fatalf("bob resumes after ann: %+v, %v; want held", h, err)
	}
	for k, v := range counts(t, s) {
		if v[0] > 1 || v[0] != v[1] {
			t.Errorf("counter %s: count %d booked %d", k, v[0], v[1])
		}
	}
}

// TestEveryPartsCrashWindowRecovers: an acquisition of two resources that stops at any step
// leaves no lease (its caller was told nothing), and both resources serve their caps again
// once the idle reap gives back what it booked.
func TestEveryPartsCrashWindowRecovers(t *testing.T) {
	steps := []leasestore.Step{leasestore.StepHolderCreated, leasestore.StepBooked, leasestore.StepLevelPushed, leasestore.StepPartsFenced}
	for _, step := range steps {
		t.Run(string(step), func(t *testing.T) {
			crashes := 0
			faulty, clean := pair(t, time.Minute, func(st leasestore.Step, key string) error {
				// The crash comes at the step's last occurrence of the first attempt: after
				// the first resource is booked whole.
				if st == step && (step == leasestore.StepHolderCreated || step == leasestore.StepPartsFenced || key == "licence|global|*") && crashes == 0 {
					crashes++
					return leasestore.ErrCrash
				}
				return nil
			})
			c := ctxT(t)
			req := partsReq("ann", "gpu", "licence")
			req.TTL = 500 * time.Millisecond
			if _, err := faulty.Acquire(c, req); !errors.Is(err, leasestore.ErrCrash) {
				t.Fatalf("acquire = %v, want the crash", err)
			}
			hs, err := clean.ListHolders(c, leasestore.HolderFilter{})
			if err != nil {
				t.Fatal(err)
			}
			for _, h := range hs {
				if h.State == lease.StateHeld {
					t.Fatalf("a crashed acquisition left a HELD holder: %+v", h)
				}
			}
			time.Sleep(700 * time.Millisecond) // real time: the crashed holder's TTL
			if _, err := clean.ReapIdle(c, ""); err != nil {
				t.Fatal(err)
			}
			h := mustAcquire(t, clean, partsReq("bob", "licence", "gpu"))
			if len(h.Parts) != 2 {
				t.Fatalf("after the reap: %+v", h)
			}
		})
	}
}

// TestPartsCostTwoRoundTripsALevelAndOneAPart: an uncontended acquisition of two resources
// with one capped level each costs 2L + P + 2 commands (the holder, a booking and a record per
// level, a fence per part, the grant), and its release 2, as a single lease's.
func TestPartsCostTwoRoundTripsALevelAndOneAPart(t *testing.T) {
	var n atomic.Int32
	s := newStore(t, leasestore.WithCommandObserver(func(string) { n.Add(1) }))
	c := ctxT(t)
	warm := mustAcquire(t, s, partsReq("warm", "gpu", "licence")) // the counters exist from here
	if _, err := s.Release(c, warm.Token); err != nil {
		t.Fatal(err)
	}
	req := partsReq("ann", "gpu", "licence")
	for i := range req.Parts {
		req.Parts[i].Caps = []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	}
	n.Store(0)
	h := mustAcquire(t, s, req)
	if got := n.Load(); got != 2*2+2+2 {
		t.Errorf("acquisition: %d commands, want 8", got)
	}
	n.Store(0)
	if _, err := s.Release(c, h.Token); err != nil {
		t.Fatal(err)
	}
	if got := n.Load(); got != 2 {
		t.Errorf("release: %d commands, want 2", got)
	}
}

// TestIdleSweepOfAnyPartReapsTheHolder: the lazy sweep of a resource, which a waiter for it
// asks for, reaps an idle holder of several resources whose first part is another resource.
func TestIdleSweepOfAnyPartReapsTheHolder(t *testing.T) {
	s := newStore(t)
	c := ctxT(t)
	req := partsReq("ann", "gpu", "licence")
	req.TTL = 300 * time.Millisecond
	h := mustAcquire(t, s, req)
	time.Sleep(500 * time.Millisecond) // real time: the holder's TTL on the server's clock
	sw, err := s.SweepIdle(c, "licence")
	if err != nil {
		t.Fatal(err)
	}
	if len(sw.Reaped) != 1 || sw.Reaped[0].ID != h.ID {
		t.Fatalf("sweep of licence reaped %v, want the holder of gpu+licence", sw.Reaped)
	}
	for k, v := range counts(t, s) {
		if v[0] != 0 {
			t.Errorf("after the reap counter %s counts %d", k, v[0])
		}
	}
}
