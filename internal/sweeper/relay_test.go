package sweeper_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

type recorded struct {
	mu    sync.Mutex
	calls []string // reason:token
}

func (r *recorded) Revoked(_ context.Context, reason string, holders []lease.Holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range holders {
		r.calls = append(r.calls, reason+":"+h.Token)
	}
}

func (r *recorded) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func relayStore(t *testing.T) *leasestore.Store {
	t.Helper()
	return storetest.New(t)
}

func idleHolder(t *testing.T, s *leasestore.Store, resource string) lease.Holder {
	t.Helper()
	h, err := s.Acquire(context.Background(), leasestore.AcquireRequest{
		Resource: resource, Type: "tex", Tenant: "acme", TTL: 100 * time.Millisecond,
		Caps: []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // real time: past the TTL on the store's clock
	return h
}

// The agent's lazy sweep goes to the manager, which reaps and dispatches through its own
// matrix; a relay answers at most once per interval per resource.
func TestRelayReapsOnTheManager(t *testing.T) {
	s := relayStore(t)
	listener := &recorded{}
	srv := httptest.NewServer(sweeper.RelayHandler(s, listener, clock.RealClock{}, time.Hour))
	defer srv.Close()
	// A holder that stays: the relay tells the agent when it goes idle.
	if _, err := s.Acquire(context.Background(), leasestore.AcquireRequest{
		Resource: "r", Type: "tex", Tenant: "hooli", TTL: time.Minute,
		Caps: []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}},
	}); err != nil {
		t.Fatal(err)
	}
	h := idleHolder(t, s, "r")

	reap := sweeper.RelayReaper(srv.Client(), srv.URL, s)
	sw, freed, err := reap(context.Background(), "r")
	if err != nil || len(sw.Reaped) != 0 || freed != 1 {
		t.Fatalf("relay = %v, %d, %v; want no holders back (the manager dispatched them) and 1 freed", sw.Reaped, freed, err)
	}
	if sw.NextExpiry <= 50*time.Second || sw.NextExpiry > time.Minute {
		t.Errorf("relay's next expiry = %v, want the staying holder's, just under a minute", sw.NextExpiry)
	}
	if diff := cmp.Diff([]string{"idle:" + h.Token}, listener.got()); diff != "" {
		t.Errorf("manager's listener (-want +got):\n%s", diff)
	}
	if err := s.Touch(context.Background(), h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("touch after the relayed sweep = %v, want lost", err)
	}
	// Within the interval the manager does not sweep that resource again.
	h2 := idleHolder(t, s, "r")
	if _, freed, err := reap(context.Background(), "r"); err != nil || freed != 0 {
		t.Fatal(err)
	}
	if err := s.Touch(context.Background(), h2.Token); err != nil {
		t.Errorf("a second relay within the interval swept again: %v", err)
	}

	for name, body := range map[string]string{"empty": `{}`, "unknown field": `{"resource":"r","x":1}`, "malformed": `{`} {
		resp, err := http.Post(srv.URL+sweeper.RelayPath, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", name, resp.StatusCode)
		}
	}
}

// Without a manager, the agent sweeps itself and dispatches the holders locally.
func TestRelayFallsBackToALocalSweep(t *testing.T) {
	s := relayStore(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	h := idleHolder(t, s, "r")

	sw, _, err := sweeper.RelayReaper(nil, url, s)(context.Background(), "r")
	if err == nil {
		t.Error("no error for an unreachable manager")
	}
	if len(sw.Reaped) != 1 || sw.Reaped[0].Token != h.Token {
		t.Errorf("local fallback reaped %v, want the idle holder", sw.Reaped)
	}
}
