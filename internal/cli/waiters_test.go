package cli_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// TestWaitersShowsTheLine: `kubectl lease waiters` lists the acquisitions waiting at a full
// level, oldest first, with their level, scope and position; through the live API as the
// operator and with --force from the store alike; -o json; and says so when nobody waits.
func TestWaitersShowsTheLine(t *testing.T) {
	s := newStore(t)
	global1 := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	first := mustAcquire(t, s.Store, request("w", "acme", "ann", podA, global1))
	t.Cleanup(func() { _, _ = s.Release(context.Background(), first.Token) })
	var ids []string
	for _, u := range []struct {
		tenant, user string
		priority     int
	}{{"globex", "bob", 0}, {"acme", "cid", 0}, {"acme", "dan", 3}} {
		req := request("w", u.tenant, u.user, podB, global1)
		req.WaitTTL, req.Priority = time.Hour, u.priority
		_, err := s.Acquire(ctxT(t), req)
		var lined *leasestore.WaitingError
		if !errors.As(err, &lined) {
			t.Fatalf("acquire for %s: %v, want it to wait", u.user, err)
		}
		ids = append(ids, lease.HolderID(lined.Token))
		t.Cleanup(func() { _ = s.Withdraw(context.Background(), lined.Token) })
	}
	// dan came last, but his priority puts him first.
	want := [][]string{
		{ids[2], "w", "acme", "p", "dan", podB.String(), "global", "*", "3", "0", "<unknown>"},
		{ids[0], "w", "globex", "p", "bob", podB.String(), "global", "*", "0", "1", "<unknown>"},
		{ids[1], "w", "acme", "p", "cid", podB.String(), "global", "*", "0", "2", "<unknown>"},
	}
	for _, force := range []bool{false, true} {
		a := args(s, "waiters", "--resource", "w")
		if force {
			a = append(a, "--force")
		}
		r := mustRun(t, operatorEnv(), a...)
		rows := tableRows(r.stdout)
		if diff := cmp.Diff([]string{"ID", "RESOURCE", "TENANT", "PROJECT", "USER", "POD", "LEVEL", "SCOPE", "PRIORITY", "POSITION", "EST-WAIT", "WAITING"}, rows[0]); diff != "" {
			t.Fatalf("force %v: header (-want +got):\n%s", force, diff)
		}
		var got [][]string
		for _, row := range rows[1:] {
			got = append(got, row[:len(row)-1]) // WAITING depends on time
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("force %v: waiters (-want +got):\n%s", force, diff)
		}
	}

	r := mustRun(t, operatorEnv(), args(s, "waiters", "--tenant", "acme", "-o", "json")...)
	type waiterJSON struct {
		ID, Resource, Lease, Tenant, Project, User, Pod, HolderRef, Level, Scope string
		Cap, Priority, Position                                                  int
		EstimatedWaitMs                                                          int64
		Since                                                                    time.Time
		Lapsed                                                                   bool
	}
	got := decodeStrict[[]waiterJSON](t, r.stdout)
	if len(got) != 2 || got[0].ID != ids[2] || got[0].Priority != 3 || got[0].Position != 0 ||
		got[1].ID != ids[1] || got[1].Position != 2 || got[1].Level != "global" || got[1].Cap != 1 || got[1].Since.IsZero() {
		t.Errorf("waiters --tenant acme -o json = %+v, want dan's waiter first (priority 3), cid's behind dan's and globex's", got)
	}

	r = mustRun(t, operatorEnv(), args(s, "waiters", "--resource", "nothing")...)
	if r.stdout != "" || r.stderr == "" {
		t.Errorf("no waiters: stdout %q stderr %q, want a note on stderr only", r.stdout, r.stderr)
	}
}
