package sweeper_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

var errNotOwed = errors.New("not owed")

// reclaimer answers ReclaimFor per waiter and records the waiters asked for.
type reclaimer struct {
	mu      sync.Mutex
	asked   []string
	answers map[string]error
}

func (r *reclaimer) ReclaimFor(_ context.Context, waiter string) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.asked = append(r.asked, waiter)
	err := r.answers[waiter]
	return err == nil, err
}

// TestReclaimRelay: an agent's reclaim reaches the manager's Reclaimer with the waiter's ID;
// a revoked holder and a waiter owed nothing are answers (no error: the agent does not
// reclaim itself then); a store failure on the manager, a manager that cannot be reached and
// a malformed request are errors, and the agent reclaims itself.
func TestReclaimRelay(t *testing.T) {
	owed, notOwed, failing := lease.HolderID("a"), lease.HolderID("b"), lease.HolderID("c")
	r := &reclaimer{answers: map[string]error{notOwed: fmt.Errorf("%w: within its grace", errNotOwed), failing: errors.New("store down")}}
	srv := httptest.NewServer(sweeper.ReclaimRelayHandler(r, errNotOwed))
	t.Cleanup(srv.Close)
	relay := sweeper.RelayReclaim(srv.Client(), srv.URL)
	ctx := context.Background()
	for _, c := range []struct {
		waiter  string
		revoked bool
		err     bool
	}{{owed, true, false}, {notOwed, false, false}, {failing, false, true}, {"lh-not-an-id", false, true}} {
		revoked, err := relay(ctx, c.waiter)
		if revoked != c.revoked || (err != nil) != c.err {
			t.Errorf("relay for %s: %v, %v; want revoked %v, an error %v", c.waiter, revoked, err, c.revoked, c.err)
		}
	}
	if diff := cmp.Diff([]string{owed, notOwed, failing}, r.asked); diff != "" {
		t.Errorf("waiters the manager was asked for (-want +got):\n%s", diff)
	}
	resp, err := srv.Client().Get(srv.URL + sweeper.ReclaimRelayPath)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET: %s, want 405", resp.Status)
	}
	resp, err = srv.Client().Post(srv.URL+sweeper.ReclaimRelayPath, "application/json", strings.NewReader(`{"waiter":`))
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Errorf("truncated body: %s, want 400", resp.Status)
	}
	srv.Close()
	if _, err := relay(ctx, owed); err == nil {
		t.Error("relay to a manager that cannot be reached: no error, want one (the agent reclaims itself)")
	}
}
