package leasestore_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

func tokens(hs []lease.Holder) []string {
	out := make([]string, len(hs))
	for i, h := range hs {
		out[i] = h.Token
	}
	return out
}

var sorted = cmpopts.SortSlices(func(a, b string) bool { return a < b })

func TestIdleReapAfterTTLAndNotBefore(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := allCaps(3, 3, 3, 3)
	short := request("r", "acme", "p", "u", caps)
	short.TTL = 2 * time.Second
	idle := mustAcquire(t, s, short)
	kept := mustAcquire(t, s, short)
	other := short
	other.Resource = "other"
	otherIdle := mustAcquire(t, s, other)
	long := mustAcquire(t, s, request("r", "acme", "p", "u", caps))

	reaped, err := s.ReapIdle(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if len(reaped) != 0 {
		t.Fatalf("reaped %v before the TTL", tokens(reaped))
	}
	stored, err := s.GetHolder(ctx, idle.Token)
	if err != nil {
		t.Fatal(err)
	}
	if now, err := s.ServerTime(ctx); err != nil || now.Sub(stored.AcquiredAt) >= short.TTL {
		t.Skipf("the machine is too slow for this TTL (%v, %v)", now.Sub(stored.AcquiredAt), err)
	}
	// Keep one alive by touching it at use, past the original TTL.
	deadline := time.Now().Add(short.TTL + 500*time.Millisecond)
	for time.Now().Before(deadline) {
		if err := s.Touch(ctx, kept.Token); err != nil {
			t.Fatal(err)
		}
		time.Sleep(100 * time.Millisecond) // real time: touching at use on the store's clock, past the original TTL
	}
	reaped, err = s.ReapIdle(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{idle.Token}, tokens(reaped)); diff != "" {
		t.Errorf("reaped for resource r (-want +got):\n%s", diff)
	}
	if reaped[0].Type != "tex" || reaped[0].Pod.UID != "uid-a" {
		t.Errorf("reaped holder lacks what a dispatcher needs: %+v", reaped[0])
	}
	for _, tok := range []string{kept.Token, long.Token, otherIdle.Token} {
		if _, err := s.GetHolder(ctx, tok); err != nil {
			t.Errorf("holder %s: %v, want still held", tok, err)
		}
	}
	// The sweep over all resources takes the other resource's idle holder too.
	reaped, err = s.ReapIdle(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{otherIdle.Token}, tokens(reaped)); diff != "" {
		t.Errorf("reaped over all resources (-want +got):\n%s", diff)
	}
	if err := s.Touch(ctx, idle.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("touch of reaped holder: %v, want lost", err)
	}
	assertNoDrift(t, s)
}

// TestSweepIdleTellsTheNextExpiry: a sweep of one resource reaps what is idle and says when
// the first of the holders it leaves goes idle (waiters look then); nothing left, no expiry.
func TestSweepIdleTellsTheNextExpiry(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := allCaps(3, 3, 3, 3)
	gone := request("r", "acme", "p", "u", caps)
	gone.TTL = time.Second
	idle := mustAcquire(t, s, gone)
	soon := request("r", "acme", "p", "u", caps)
	soon.TTL = 40 * time.Second
	mustAcquire(t, s, soon)
	mustAcquire(t, s, request("r", "acme", "p", "u", caps)) // an hour
	other := soon
	other.Resource, other.TTL = "other", 2*time.Second // another resource: not this sweep's
	mustAcquire(t, s, other)
	h, err := s.GetHolder(ctx, idle.Token)
	if err != nil {
		t.Fatal(err)
	}
	for now, err := s.ServerTime(ctx); !now.After(h.LastSeenAt.Add(gone.TTL)); now, err = s.ServerTime(ctx) {
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(20 * time.Millisecond) // real time: polling the store's clock until the TTL has passed
	}

	sw, err := s.SweepIdle(ctx, "r")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{idle.Token}, tokens(sw.Reaped)); diff != "" {
		t.Errorf("reaped (-want +got):\n%s", diff)
	}
	if sw.NextExpiry <= 30*time.Second || sw.NextExpiry > soon.TTL {
		t.Errorf("next expiry = %v, want the 40 s holder's (just under 40 s)", sw.NextExpiry)
	}
	if sw, err := s.SweepIdle(ctx, "none"); err != nil || len(sw.Reaped) != 0 || sw.NextExpiry != 0 {
		t.Errorf("sweep of a resource nobody holds = %+v, %v; want nothing", sw, err)
	}
}

func TestPodReapMatchesUID(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	caps := allCaps(5, 5, 5, 5)
	old := request("r", "acme", "p", "u", caps)
	old.Pod = lease.PodRef{Namespace: "ns", Name: "web-0", UID: "uid-old"}
	h1 := mustAcquire(t, s, old)
	h2 := mustAcquire(t, s, old)
	recreated := old
	recreated.Pod.UID = "uid-new"
	h3 := mustAcquire(t, s, recreated)
	elsewhere := old
	elsewhere.Pod = lease.PodRef{Namespace: "ns", Name: "web-1", UID: "uid-1"}
	h4 := mustAcquire(t, s, elsewhere)

	round, err := s.SweepRound(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if pods := round.Pods; len(pods) != 3 {
		t.Errorf("holder pods = %v, want 3 distinct", pods)
	}
	reaped, err := s.ReapPod(ctx, old.Pod)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{h1.Token, h2.Token}, tokens(reaped), sorted); diff != "" {
		t.Errorf("reaped (-want +got):\n%s", diff)
	}
	revoked, err := s.RevokePod(ctx, "ns", "web-0")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{h3.Token}, tokens(revoked)); diff != "" {
		t.Errorf("revoke-pod (-want +got):\n%s", diff)
	}
	if _, err := s.GetHolder(ctx, h4.Token); err != nil {
		t.Errorf("holder of another pod: %v", err)
	}
	assertNoDrift(t, s)
}

func TestRevokeBindsTheTenant(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	h := mustAcquire(t, s, request("r", "acme", "p", "u", allCaps(1, 1, 1, 1)))
	if _, ok, err := s.Revoke(ctx, h.Token, "globex"); err != nil || ok {
		t.Fatalf("revoke by another tenant = %v, %v; want no match", ok, err)
	}
	if _, err := s.GetHolder(ctx, h.Token); err != nil {
		t.Fatalf("holder gone after a foreign tenant's revoke: %v", err)
	}
	got, ok, err := s.Revoke(ctx, h.Token, "acme")
	if err != nil || !ok || got.Token != h.Token {
		t.Fatalf("revoke by own tenant = %+v, %v, %v", got, ok, err)
	}
	if _, ok, err := s.Revoke(ctx, h.Token, ""); err != nil || ok {
		t.Errorf("second revoke = %v, %v; want no match", ok, err)
	}
	assertNoDrift(t, s)
}

func TestOperationalReads(t *testing.T) {
	s := newStore(t)
	ctx := ctxT(t)
	a := mustAcquire(t, s, request("tex", "acme", "p", "u", allCaps(1, 1, 3, 6)))
	b := request("browser", "globex", "q", "v", allCaps(1, 2, 2, 4))
	b.Type = "mcp"
	b.Pod = lease.PodRef{Namespace: "ns", Name: "b", UID: "ub"}
	bh := mustAcquire(t, s, b)

	cases := map[string]struct {
		filter leasestore.HolderFilter
		want   []string
	}{
		"all":      {leasestore.HolderFilter{}, []string{a.Token, bh.Token}},
		"tenant":   {leasestore.HolderFilter{Tenant: "globex"}, []string{bh.Token}},
		"resource": {leasestore.HolderFilter{Resource: "tex"}, []string{a.Token}},
		"type":     {leasestore.HolderFilter{Type: "mcp"}, []string{bh.Token}},
		"pod":      {leasestore.HolderFilter{Pod: "ns/pod-a"}, []string{a.Token}},
		"none":     {leasestore.HolderFilter{Tenant: "nobody"}, []string{}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			hs, err := s.ListHolders(ctx, tc.filter)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, tokens(hs), sorted); diff != "" {
				t.Errorf("(-want +got):\n%s", diff)
			}
		})
	}
	cs, err := s.ListCounters(ctx, leasestore.CounterFilter{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	for _, c := range cs {
		keys = append(keys, c.Key)
		if c.Drift() {
			t.Errorf("counter %s drifts: %+v", c.Key, c)
		}
	}
	want := []string{"tex|project|acme/p", "tex|tenant|acme", "tex|user|acme/u"}
	if diff := cmp.Diff(want, keys, sorted); diff != "" {
		t.Errorf("tenant counters leave out global (-want +got):\n%s", diff)
	}
}

func TestEnsureIndexesIsIdempotent(t *testing.T) {
	s := newStore(t)
	for range 2 {
		if err := s.EnsureIndexes(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
