package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

var errNotOwed, errUnreachable = errors.New("not owed"), errors.New("unreachable")

type reclaimAnswer struct {
	revoked bool
	err     error
}

// reclaimer answers ReclaimFor per waiter and records who asked for which waiter.
type reclaimer struct {
	mu      sync.Mutex
	asked   []string
	answers map[string]reclaimAnswer
}

func (r *reclaimer) ReclaimFor(_ context.Context, caller lease.PodRef, waiter string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, caller.Name+":"+waiter)
	a := r.answers[waiter]
	return a.revoked, a.err
}

// TestReclaimRelay: an agent's reclaim reaches the manager's Reclaimer with the calling pod and
// the waiter's ID. A revocation (even one whose later step failed) and a waiter owed nothing
// are answers, not errors; a store failure and a malformed request are errors but not
// unreachable (the manager may have reclaimed: the agent does not reclaim itself); a waiter
// asked for again within half a second is not passed on; only a manager that cannot be reached
// is unreachable, the one case in which the agent reclaims itself.
func TestReclaimRelay(t *testing.T) {
	ids := map[string]string{}
	for _, n := range []string{"owed", "partial", "notOwed", "failing"} {
		ids[n] = lease.HolderID(n)
	}
	r := &reclaimer{answers: map[string]reclaimAnswer{
		ids["owed"]:    {revoked: true},
		ids["partial"]: {revoked: true, err: errors.New("handing the slot back failed")},
		ids["notOwed"]: {err: fmt.Errorf("%w: within its grace", errNotOwed)},
		ids["failing"]: {err: errors.New("store down")},
	}}
	clk := testingclock.NewFakePassiveClock(time.Now())
	pod, intruder := lease.PodRef{Namespace: "globex", Name: "app-0", UID: "u0"}, lease.PodRef{Namespace: "acme", Name: "app-9", UID: "u9"}
	var caller atomic.Pointer[lease.PodRef]
	caller.Store(&pod)
	identify := func(*http.Request) (lease.PodRef, error) { return *caller.Load(), nil }
	srv := httptest.NewServer(sweeper.ReclaimRelayHandler(r, agentauth.NewVerifier(identify, relayKey), errNotOwed,
		sweeper.WithRelayClock(clk), sweeper.WithRelayLogger(logr.Discard())))
	t.Cleanup(srv.Close)
	// Each pod's agent signs with its own namespace's key.
	relays := map[string]leasing.ReclaimRelay{}
	for _, ns := range []string{pod.Namespace, intruder.Namespace} {
		relays[ns] = sweeper.RelayReclaim(srv.Client(), srv.URL, relayKey(ns), errUnreachable)
	}
	ctx := context.Background()
	type outcome struct{ revoked, err, unreachable bool }
	ask := func(waiter string) outcome {
		revoked, err := relays[caller.Load().Namespace](ctx, waiter)
		return outcome{revoked, err != nil, errors.Is(err, errUnreachable)}
	}
	for _, c := range []struct {
		waiter string
		want   outcome
	}{
		{ids["owed"], outcome{revoked: true}},
		{ids["partial"], outcome{revoked: true}},
		{ids["notOwed"], outcome{}},
		{ids["failing"], outcome{err: true}},
		{"lh-not-an-id", outcome{err: true}},
		{ids["owed"], outcome{}}, // again within the interval: not passed on
	} {
		if got := ask(c.waiter); got != c.want {
			t.Errorf("relay for %s: %+v, want %+v", c.waiter, got, c.want)
		}
	}
	clk.SetTime(clk.Now().Add(time.Second))
	// Another pod naming the waiter first does not use up the waiter's own pod's ask.
	caller.Store(&intruder)
	ask(ids["owed"])
	caller.Store(&pod)
	if got := ask(ids["owed"]); got != (outcome{revoked: true}) {
		t.Errorf("relay for %s a second later, just after another pod asked: %+v, want revoked", ids["owed"], got)
	}
	want := []string{"app-0:" + ids["owed"], "app-0:" + ids["partial"], "app-0:" + ids["notOwed"], "app-0:" + ids["failing"],
		"app-9:" + ids["owed"], "app-0:" + ids["owed"]}
	if diff := cmp.Diff(want, r.asked); diff != "" {
		t.Errorf("what the manager was asked (-want +got):\n%s", diff)
	}
	for _, c := range []struct {
		method, body string
		want         int
	}{{http.MethodGet, "", http.StatusMethodNotAllowed}, {http.MethodPost, `{"waiter":`, http.StatusBadRequest},
		{http.MethodPost, `{"waiter":"lh-x","x":1}`, http.StatusBadRequest}} {
		req, err := http.NewRequest(c.method, srv.URL+sweeper.ReclaimRelayPath, strings.NewReader(c.body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set(agentauth.SignatureHeader, agentauth.Sign(relayKey(pod.Namespace), sweeper.ReclaimRelayPath, []byte(c.body)))
		resp, err := srv.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != c.want {
			t.Errorf("%s %q: %s, want %d", c.method, c.body, resp.Status, c.want)
		}
	}
	srv.Close()
	if got := ask(ids["owed"]); !got.unreachable {
		t.Errorf("relay to a manager that cannot be reached: %+v, want unreachable (the agent reclaims itself)", got)
	}
}
