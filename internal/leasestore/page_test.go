package leasestore_test

import (
	"slices"
	"sync/atomic"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// TestListHoldersPage walks the holders of one tenant in pages: ID order, no holder
// twice or missed, filters applied in the store, one round trip per page.
func TestListHoldersPage(t *testing.T) {
	var commands atomic.Int64
	s := newStore(t, leasestore.WithCommandObserver(func(string) { commands.Add(1) }))
	caps := allCaps(100, 100, 100, 100)
	var want []string
	for _, u := range []string{"u1", "u2", "u3", "u4", "u5"} {
		want = append(want, mustAcquire(t, s, request("tex", "acme", "p1", u, caps)).ID)
	}
	other := mustAcquire(t, s, request("tex", "globex", "p1", "u1", caps))
	mustAcquire(t, s, request("tex", "acme", "p2", "u1", caps))
	slices.Sort(want)

	f := leasestore.HolderFilter{Tenant: "acme", Project: "p1"}
	var got []string
	after, pages := "", 0
	for {
		before := commands.Load()
		hs, next, err := s.ListHoldersPage(ctxT(t), f, after, 2)
		if err != nil {
			t.Fatalf("page %d: %v", pages, err)
		}
		if n := commands.Load() - before; n != 1 {
			t.Errorf("page %d took %d round trips, want 1", pages, n)
		}
		pages++
		for _, h := range hs {
			got = append(got, h.ID)
		}
		if next == "" {
			break
		}
		if next != hs[len(hs)-1].ID {
			t.Errorf("next = %s, want the page's last ID %s", next, hs[len(hs)-1].ID)
		}
		after = next
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("paged holders (-want +got):\n%s", d)
	}
	if pages != 3 {
		t.Errorf("pages = %d, want 3", pages)
	}

	// Without a limit, one answer; by user; nothing after the last ID.
	all, next, err := s.ListHoldersPage(ctxT(t), leasestore.HolderFilter{User: "u1"}, "", 0)
	if err != nil || next != "" || len(all) != 3 {
		t.Errorf("user u1: %d holders, next %q, err %v; want 3, none, nil", len(all), next, err)
	}
	if !slices.ContainsFunc(all, func(h lease.Holder) bool { return h.Token == other.Token }) {
		t.Errorf("user u1 misses globex's holder")
	}
	rest, next, err := s.ListHoldersPage(ctxT(t), f, want[len(want)-1], 2)
	if err != nil || next != "" || len(rest) != 0 {
		t.Errorf("after the last ID: %d holders, next %q, err %v", len(rest), next, err)
	}
}
