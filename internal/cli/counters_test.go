package cli_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// goneID is the public ID of a holder that no longer exists, whose entries driftSetup writes.
const goneID = "lh-00000000000000000000dead"

// driftSetup books two holders of r for acme/u, releases one, and writes at every counter of
// r an entry of a holder that is gone (a booking that arrived after its holder's release):
// every counter stays at 2 while one holder books it.
func driftSetup(t *testing.T) (testStore, lease.Holder) {
	t.Helper()
	s := newStore(t)
	h1 := mustAcquire(t, s.Store, request("r", "acme", "u", podA, caps(2, 2, 2, 2)))
	h2 := mustAcquire(t, s.Store, request("r", "acme", "u", podA, caps(2, 2, 2, 2)))
	if _, err := s.Release(context.Background(), h1.Token); err != nil {
		t.Fatal(err)
	}
	for _, k := range h2.Levels {
		if err := storetest.LateEntry(context.Background(), s.uri, s.db, k, goneID); err != nil {
			t.Fatal(err)
		}
	}
	return s, h2
}

func TestCountersShowDrift(t *testing.T) {
	s, held := driftSetup(t)
	// A second resource without drift.
	mustAcquire(t, s.Store, request("q", "globex", "bob", podB, []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 5}}))

	cases := []struct {
		name  string
		flags []string
		want  [][]string
	}{
		{name: "all", want: [][]string{
			{"q", "global", "*", "1", "1", "-", "0", "0"},
			{"r", "global", "*", "2", "1", "+1", "0", "0"},
			{"r", "project", "acme/p", "2", "1", "+1", "0", "0"},
			{"r", "tenant", "acme", "2", "1", "+1", "0", "0"},
			{"r", "user", "acme/u", "2", "1", "+1", "0", "0"},
		}},
		{name: "global level", flags: []string{"--level", "global"}, want: [][]string{
			{"q", "global", "*", "1", "1", "-", "0", "0"},
			{"r", "global", "*", "2", "1", "+1", "0", "0"},
		}},
		{name: "tenant leaves out global", flags: []string{"--tenant", "acme"}, want: [][]string{
			{"r", "project", "acme/p", "2", "1", "+1", "0", "0"},
			{"r", "tenant", "acme", "2", "1", "+1", "0", "0"},
			{"r", "user", "acme/u", "2", "1", "+1", "0", "0"},
		}},
		{name: "resource without drift", flags: []string{"--resource", "q"}, want: [][]string{
			{"q", "global", "*", "1", "1", "-", "0", "0"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, operatorEnv(), args(s, append([]string{"counters"}, tc.flags...)...)...)
			rows := tableRows(r.stdout)
			if diff := cmp.Diff([]string{"RESOURCE", "LEVEL", "SCOPE", "COUNT", "BOOKED", "DRIFT", "BORROWED", "WAITING", "UPDATED"}, rows[0]); diff != "" {
				t.Fatalf("header (-want +got):\n%s", diff)
			}
			// Leave out UPDATED, the last cell, which depends on time.
			var got [][]string
			for _, row := range rows[1:] {
				got = append(got, row[:len(row)-1])
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("counters %v (-want +got):\n%s", tc.flags, diff)
			}
			drifting := 0
			for _, w := range tc.want {
				if w[5] != "-" {
					drifting++
				}
			}
			note := "entries of holders that are gone"
			if got := strings.Contains(r.stderr, note); got != (drifting > 0) {
				t.Errorf("stderr %q: drift note present %v, want %v", r.stderr, got, drifting > 0)
			}
		})
	}

	t.Run("json", func(t *testing.T) {
		r := mustRun(t, operatorEnv(), args(s, "counters", "--resource", "r", "--level", "user", "-o", "json")...)
		type counterJSON struct {
			Key, Resource, Level, Scope string
			Count, Booked, Drift        int
			Holders, Gone               []string
			Borrowed, Waiting           int
			UpdatedAt                   time.Time
		}
		got := decodeStrict[[]counterJSON](t, r.stdout)
		want := []counterJSON{{Key: "r|user|acme/u", Resource: "r", Level: "user", Scope: "acme/u", Count: 2, Booked: 1, Drift: 1,
			Holders: slices.Sorted(slices.Values([]string{held.ID, goneID})), Gone: []string{goneID}}}
		if len(got) == 1 && got[0].UpdatedAt.IsZero() {
			t.Error("counter without updatedAt")
		}
		for i := range got {
			got[i].UpdatedAt = time.Time{}
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("counters -o json (-want +got):\n%s", diff)
		}
	})

	t.Run("bad level", func(t *testing.T) {
		mustFail(t, operatorEnv(), args(s, "counters", "--level", "pod"), `--level "pod": want user, project, tenant or global`)
	})
}

// TestCountersShowBorrowed: BORROWED counts the holders of a tenant counter granted above its
// cap (docs/borrowing.md), in the table and in JSON, through the live API.
func TestCountersShowBorrowed(t *testing.T) {
	s := newStore(t)
	var hs []lease.Holder
	for i, user := range []string{"u1", "u2", "u3"} {
		req := request("b", "acme", user, podA, []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}, {Level: lease.LevelGlobal, Cap: 4}})
		req.Borrow = &leasestore.Borrow{}
		h := mustAcquire(t, s.Store, req)
		if h.Borrowed != (i > 0) {
			t.Fatalf("holder %d borrowed %v, want %v", i, h.Borrowed, i > 0)
		}
		hs = append(hs, h)
	}
	r := mustRun(t, operatorEnv(), args(s, "counters", "--resource", "b")...)
	got := columns(t, r.stdout, "LEVEL", "SCOPE", "COUNT", "BOOKED", "BORROWED")
	want := [][]string{{"global", "*", "3", "3", "0"}, {"tenant", "acme", "3", "3", "2"}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	r = mustRun(t, operatorEnv(), args(s, "counters", "--resource", "b", "--level", "tenant", "-o", "json")...)
	if got := decodeStrict[[]struct {
		Key, Resource, Level, Scope    string
		Count, Booked, Drift, Borrowed int
		Holders, Gone                  []string
		Waiting                        int
		UpdatedAt                      time.Time
	}](t, r.stdout); len(got) != 1 || got[0].Borrowed != 2 {
		t.Errorf("counters -o json: %+v, want the tenant counter with borrowed 2", got)
	}

	// u1 (within the cap) and u2 release: acme is back within its cap, and u3's mark is stale.
	for _, h := range hs[:2] {
		if _, err := s.Release(context.Background(), h.Token); err != nil {
			t.Fatal(err)
		}
	}
	r = mustRun(t, operatorEnv(), args(s, "counters", "--resource", "b")...)
	if diff := cmp.Diff([][]string{{"global", "*", "1", "1", "0"}, {"tenant", "acme", "1", "1", "0"}},
		columns(t, r.stdout, "LEVEL", "SCOPE", "COUNT", "BOOKED", "BORROWED")); diff != "" {
		t.Errorf("counters within the cap (-want +got):\n%s", diff)
	}
	r = mustRun(t, map[string]string{"KUBECONFIG": operatorFile}, args(s, "reconcile", "--force")...)
	if want := "1 borrowed mark dropped: their tenants are back within their caps"; !strings.Contains(r.stdout, want) {
		t.Errorf("reconcile output lacks %q:\n%s", want, r.stdout)
	}
	if h, err := s.GetHolder(context.Background(), hs[2].Token); err != nil || h.Borrowed {
		t.Errorf("u3 after the reconcile: %+v, %v; want it no longer marked borrowed", h, err)
	}
}

func TestReconcileDirect(t *testing.T) {
	s, _ := driftSetup(t)
	// --force reconciles directly, whatever kubeconfig the environment has.
	env := map[string]string{"KUBECONFIG": operatorFile}
	r := mustRun(t, env, args(s, "reconcile", "--force")...)
	for _, want := range []string{
		"Reconciled the counters directly in MongoDB (database " + s.db + "; no manager, no handler involved; safety margin 1m0s)",
		"4 corrected (4 entries of gone holders removed), 0 deleted (nobody books them), 0 skipped",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("reconcile output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = mustRun(t, operatorEnv(), args(s, "counters")...)
	if strings.Contains(r.stdout, "+") || r.stderr != "" {
		t.Errorf("drift left after reconcile:\n%s%s", r.stdout, r.stderr)
	}
	// Nothing left to repair: a second run writes nothing.
	r = mustRun(t, env, args(s, "reconcile", "--force", "-o", "json")...)
	type reconcileJSON struct {
		Corrected, Deleted, Repaired, Skipped int
		Via                                   string
	}
	if diff := cmp.Diff(reconcileJSON{Via: "store"}, decodeStrict[reconcileJSON](t, r.stdout)); diff != "" {
		t.Errorf("reconcile -o json (-want +got):\n%s", diff)
	}
}
