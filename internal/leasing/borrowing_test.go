package leasing_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// Borrowing idle capacity across tenants (docs/borrowing.md).

func tenantReq(name, tenant string, i int) leasing.Request {
	r := req(name, tenant, "p", fmt.Sprintf("u%d", i))
	r.Pod = lease.PodRef{Namespace: tenant, Name: fmt.Sprintf("pod-%d", i), UID: fmt.Sprintf("uid-%s-%d", tenant, i)}
	return r
}

// TestReturningTenantIsServedWithinGraceAndOneHandOver: a tenant within its cap that waits
// at the global level while another tenant borrows gets a slot when its grace ends, by one
// hand-over: the reclaim revokes the borrower and hands its global slot to the waiter. The
// services' clock is fake and is stepped to the end of the grace and never beyond, and their
// safety looks are an hour apart: nothing but the reclaim that the grace's end triggers can
// serve the waiter. Before the grace nothing is revoked; the waiter's fence follows the
// borrower's by one (no other grant came between), the borrower's next check answers
// LEASE_LOST, and the holder within its tenant's cap keeps its lease. Two processes: the
// borrower's and the waiter's.
func TestReturningTenantIsServedWithinGraceAndOneHandOver(t *testing.T) {
	const grace = 5 * time.Second
	clk := testingclock.NewFakeClock(time.Now())
	ps := newProcesses(t, 2, []leaseDef{{name: "pdf", tenant: 1, global: 2, ttlSeconds: 60, waitMs: 60000,
		borrowing: true, graceSeconds: int32(grace / time.Second)}}, processOpts{clock: clk, safety: time.Hour})
	ctx := waitfor.Context(t)
	within := mustAcquire(t, ps[0].svc, tenantReq("pdf", "acme", 0))
	borrower := mustAcquire(t, ps[0].svc, tenantReq("pdf", "acme", 1))
	if h, err := ps[0].store.GetHolder(ctx, borrower.Token); err != nil || !h.Borrowed {
		t.Fatalf("acme's second holder: %+v, %v; want it borrowed above acme's cap of 1", h, err)
	}

	got := make(chan leasing.Lease, 1)
	errs := make(chan error, 1)
	go func() {
		l, err := acquire(ctx, ps[1].svc, tenantReq("pdf", "globex", 0))
		if err != nil {
			errs <- err
			return
		}
		got <- l
	}()
	ps[1].untilInLine(t, globalKey("pdf"), 1)
	waitfor.Until(t, "the waiter waits on the clock", clk.HasWaiters)

	clk.Step(grace - 10*time.Millisecond)
	select {
	case l := <-got:
		t.Fatalf("globex served before the grace ended: %+v", l)
	case err := <-errs:
		t.Fatalf("globex's acquisition: %v", err)
	case <-time.After(300 * time.Millisecond): // real time: room for a reclaim that should not happen
	}
	if err := ps[0].svc.Check(ctx, borrower.Token); err != nil {
		t.Fatalf("the borrower before the grace ended: %v, want it still held", err)
	}

	clk.Step(10 * time.Millisecond) // the grace ends; the clock stays here
	var l leasing.Lease
	select {
	case l = <-got:
	case err := <-errs:
		t.Fatalf("globex's acquisition: %v, want the reclaimed slot", err)
	case <-time.After(waitfor.Bound): // real time: the bound of every wait in the tests
		t.Fatalf("globex not served within %v (real time) of the grace's end, the clock standing there", waitfor.Bound)
	}
	if l.Fence != borrower.Fence+1 {
		t.Errorf("globex's fence %d, want %d: the borrower's slot handed over, no grant between", l.Fence, borrower.Fence+1)
	}
	if h, err := ps[1].store.GetHolder(ctx, l.Token); err != nil || h.Borrowed {
		t.Errorf("globex's holder: %+v, %v; want it held within its cap", h, err)
	}
	if err := ps[0].svc.Check(ctx, borrower.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("the borrower's check: %v, want LEASE_LOST", err)
	}
	if err := ps[0].svc.Check(ctx, within.Token); err != nil {
		t.Errorf("acme's holder within its cap: %v, want it kept", err)
	}
	assertNoDrift(t, ps[0].store)
}

// revocations records what a revocation listener is handed, by reason.
type revocations struct {
	mu  sync.Mutex
	ids map[string][]string
}

func (r *revocations) Revoked(_ context.Context, reason string, hs []lease.Holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ids == nil {
		r.ids = map[string][]string{}
	}
	for _, h := range hs {
		r.ids[reason] = append(r.ids[reason], h.ID)
	}
}

func (r *revocations) of(reason string) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids[reason])
}

// TestAgentsReclaimRunsOnTheManager: a lease agent's waiter (process 1, with the reclaim
// relay) reclaims through the manager (process 0): the revoked borrower goes to the manager's
// listener (in the manager, the dispatcher that runs the handler and records the Event), and
// not to the agent's, which knows no pod but its own. The manager checks the waiter in the
// store: asked by another pod, for a holder that does not wait, for an unknown one, or for the
// waiter before its grace, it reclaims nothing.
func TestAgentsReclaimRunsOnTheManager(t *testing.T) {
	const grace = 5 * time.Second
	clk := testingclock.NewFakeClock(time.Now())
	var manager, agent revocations
	var ps []*process
	waiterPod, withinPod := tenantReq("pdf", "globex", 0).Pod, tenantReq("pdf", "acme", 0).Pod
	ps = newProcesses(t, 2, []leaseDef{{name: "pdf", tenant: 1, global: 2, ttlSeconds: 60, waitMs: 60000,
		borrowing: true, graceSeconds: int32(grace / time.Second)}}, processOpts{clock: clk, safety: time.Hour,
		svcOpts: func(i int) []leasing.Option {
			if i == 0 {
				return []leasing.Option{leasing.WithRevocationListener(&manager)}
			}
			return []leasing.Option{leasing.WithRevocationListener(&agent),
				leasing.WithReclaimRelay(func(ctx context.Context, id string) (bool, error) {
					return ps[0].svc.ReclaimFor(ctx, waiterPod, id)
				})}
		}})
	ctx := waitfor.Context(t)
	within := mustAcquire(t, ps[0].svc, tenantReq("pdf", "acme", 0))
	borrower := mustAcquire(t, ps[0].svc, tenantReq("pdf", "acme", 1))

	got := make(chan error, 1)
	go func() {
		_, err := acquire(ctx, ps[1].svc, tenantReq("pdf", "globex", 0))
		got <- err
	}()
	ps[1].untilInLine(t, globalKey("pdf"), 1)
	waitfor.Until(t, "the waiter waits on the clock", clk.HasWaiters)
	line, err := ps[0].store.Line(ctx, globalKey("pdf"))
	if err != nil || len(line) != 1 {
		t.Fatalf("global line %+v, %v; want globex's waiter", line, err)
	}
	for name, c := range map[string]struct {
		caller lease.PodRef
		id     string
	}{
		"a holder that does not wait": {withinPod, lease.HolderID(within.Token)},
		"an unknown holder":           {waiterPod, lease.HolderID("0123456789abcdef0123456789abcdef")},
		"the waiter within its grace": {waiterPod, line[0].ID},
	} {
		if revoked, err := ps[0].svc.ReclaimFor(ctx, c.caller, c.id); revoked || !errors.Is(err, leasing.ErrNotOwed) {
			t.Errorf("ReclaimFor %s: %v, %v; want ErrNotOwed", name, revoked, err)
		}
	}

	// The grace ends on the services' clock, and on the store's time of the waiter's place
	// (ReclaimFor judges by it): the fake clock started before the setup, which took real time.
	clk.Step(grace + max(0, line[0].QueuedAt.Sub(clk.Now())))
	// Past its grace the waiter is owed a reclaim, but only its own pod may ask for it.
	for name, caller := range map[string]lease.PodRef{"another pod": withinPod, "no pod": {}} {
		if revoked, err := ps[0].svc.ReclaimFor(ctx, caller, line[0].ID); revoked || !errors.Is(err, leasing.ErrNotOwed) {
			t.Errorf("ReclaimFor the waiter past its grace, asked by %s: %v, %v; want ErrNotOwed", name, revoked, err)
		}
	}
	select {
	case err := <-got:
		if err != nil {
			t.Fatalf("globex's acquisition: %v, want the reclaimed slot", err)
		}
	case <-time.After(waitfor.Bound):
		t.Fatalf("globex not served within %v (real time) of the grace's end", waitfor.Bound)
	}
	waitfor.Until(t, "the manager's listener handed the reclaimed holder", func() bool { return len(manager.of(metrics.ReapReclaim)) > 0 })
	if diff := cmp.Diff([]string{lease.HolderID(borrower.Token)}, manager.of(metrics.ReapReclaim)); diff != "" {
		t.Errorf("the manager's reclaims (-want +got):\n%s", diff)
	}
	if got := agent.of(metrics.ReapReclaim); len(got) != 0 {
		t.Errorf("the agent dispatched the reclaim itself: %v", got)
	}
	assertNoDrift(t, ps[0].store)
}
