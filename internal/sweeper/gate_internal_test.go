package sweeper

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// distinct is how many distinct names the bound tests send: five times the gates' size.
const distinct = 50000

// Review finding: the sweep relay's gate had no bound (past 10 000 names each ask scanned the
// map under its lock, and still added). A gate now keeps gateSize names whatever it is asked,
// and still gates what it keeps; all within one interval on a clock that does not move, so
// that no entry ever expired (the old map's only way to shrink).
func TestGateIsBounded(t *testing.T) {
	now := time.Now()
	g := newGate(gateSize, time.Hour)
	for i := range distinct {
		if !g.allow(fmt.Sprintf("resource-%d", i), now) {
			t.Fatalf("resource-%d refused on its first ask", i)
		}
	}
	if got := g.len(); got != gateSize {
		t.Errorf("gate holds %d names after %d distinct ones, want its size %d", got, distinct, gateSize)
	}
	last := fmt.Sprintf("resource-%d", distinct-1)
	if g.allow(last, now) {
		t.Errorf("%s passed twice within the interval", last)
	}
	if !g.allow("resource-0", now) {
		t.Error("resource-0, dropped as the least recently asked, was not passed again")
	}
}

// passAuth accepts every request as from pod, reading its body.
type passAuth struct{ pod lease.PodRef }

func (a passAuth) Authenticate(_ http.ResponseWriter, r *http.Request) (lease.PodRef, []byte, bool) {
	body, err := io.ReadAll(r.Body)
	return a.pod, body, err == nil
}

type nothingIdle struct{}

func (nothingIdle) SweepIdle(context.Context, string) (leasestore.IdleSweep, error) {
	return leasestore.IdleSweep{}, nil
}

type neverOwed struct{}

func (neverOwed) ReclaimFor(context.Context, lease.PodRef, string) (bool, error) { return false, nil }

type acmeOnly struct{}

func (acmeOnly) TenantOf(string) (string, bool) { return "acme", true }

type noDefinitions struct{}

func (noDefinitions) Resolve(context.Context, string, string, string) (definition.Definition, error) {
	return definition.Definition{}, nil
}

// Both relays keep their gate at its bound through their own handlers: a pod's agent sending
// 50 000 distinct inline leases, or 50 000 distinct waiters.
func TestRelayGatesAreBounded(t *testing.T) {
	clk := testingclock.NewFakePassiveClock(time.Now())
	pod := lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u"}
	sweep := RelayHandler(nothingIdle{}, nil, passAuth{pod}, acmeOnly{}, noDefinitions{}, WithRelayClock(clk)).(*sweepRelay)
	reclaim := ReclaimRelayHandler(neverOwed{}, passAuth{pod}, nil, WithRelayClock(clk)).(*reclaimRelay)
	for name, c := range map[string]struct {
		h    http.Handler
		path string
		body func(i int) string
		gate *gate
	}{
		"sweep": {sweep, RelayPath, func(i int) string { return fmt.Sprintf(`{"project":"p","lease":"l%d","inline":true}`, i) }, sweep.gate},
		"reclaim": {reclaim, ReclaimRelayPath, func(i int) string {
			return fmt.Sprintf(`{"waiter":%q}`, lease.HolderID(fmt.Sprint(i)))
		}, reclaim.gate},
	} {
		t.Run(name, func(t *testing.T) {
			for i := range distinct {
				w := httptest.NewRecorder()
				c.h.ServeHTTP(w, httptest.NewRequest(http.MethodPost, c.path, strings.NewReader(c.body(i))))
				if w.Code != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, w.Code, w.Body)
				}
			}
			if got := c.gate.len(); got != gateSize {
				t.Errorf("gate holds %d keys after %d distinct ones, want its size %d", got, distinct, gateSize)
			}
		})
	}
}
