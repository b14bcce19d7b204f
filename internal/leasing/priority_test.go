package leasing_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// Priority among waiters (docs/waiting.md, "Priority").

func prioReq(name string, i, priority int) leasing.Request {
	r := podReq(name, i)
	r.Priority = priority
	return r
}

// TestUrgentWaiterIsServedFirstAcrossProcesses: an acquisition of a higher priority that
// queues after others, in another process, is handed the next slot; within a priority the
// oldest goes first.
func TestUrgentWaiterIsServedFirstAcrossProcesses(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000, maxPriority: 5}}, processOpts{})
	k := globalKey("x")
	held := mustAcquire(t, ps[0].svc, podReq("x", 0))
	s := &entries{t: t}
	for i, w := range []struct {
		p        *process
		priority int
	}{{ps[0], 0}, {ps[1], 0}, {ps[1], 5}, {ps[0], 5}} {
		s.acquire(w.p, prioReq("x", i+1, w.priority), i+1)
		ps[0].untilInLine(t, k, i+1)
	}
	if _, err := ps[1].svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatal(err)
	}
	if got, want := s.wait(), []int{3, 4, 1, 2}; !slices.Equal(got, want) {
		t.Errorf("served %v, want %v: the urgent ones first, oldest first within a priority", got, want)
	}
	assertNoDrift(t, ps[0].store)
}

// TestAgeBoundServesAnOldWaiterFirst: with the definition's age bound, a waiter of priority
// 0 that has waited longer than it is raised to the highest priority at its next renewal,
// and is served before an urgent waiter that came after it.
func TestAgeBoundServesAnOldWaiterFirst(t *testing.T) {
	ps := newProcesses(t, 2, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 30000, maxPriority: 5, ageBoundSeconds: 1}},
		processOpts{safety: 100 * time.Millisecond})
	k := globalKey("x")
	held := mustAcquire(t, ps[0].svc, podReq("x", 0))
	s := &entries{t: t}
	s.acquire(ps[0], prioReq("x", 1, 0), 1)
	ps[0].untilInLine(t, k, 1)
	waitfor.Until(t, "the old waiter raised to the highest priority", func() bool {
		line, err := ps[1].store.Line(ctxT(t), k)
		return err == nil && len(line) == 1 && line[0].Priority == definition.MaxPriority
	})
	s.acquire(ps[1], prioReq("x", 2, 5), 2)
	ps[0].untilInLine(t, k, 2)
	if _, err := ps[1].svc.Release(ctxT(t), held.Token); err != nil {
		t.Fatal(err)
	}
	if got, want := s.wait(), []int{1, 2}; !slices.Equal(got, want) {
		t.Errorf("served %v, want %v: the aged waiter first", got, want)
	}
}

// TestPriorityAboveTheDefinitionIsRefused: above maxPriority (or negative) the request is
// invalid, naming the field and the maximum, and writes nothing.
func TestPriorityAboveTheDefinitionIsRefused(t *testing.T) {
	ps := newProcesses(t, 1, []leaseDef{{name: "x", global: 1, ttlSeconds: 60, waitMs: 0, maxPriority: 2}}, processOpts{})
	for _, p := range []int{3, -1} {
		_, err := acquire(ctxT(t), ps[0].svc, prioReq("x", 1, p))
		var inv *lease.InvalidError
		if !errors.As(err, &inv) || inv.Field != "priority" {
			t.Errorf("priority %d: %v, want invalid priority", p, err)
		}
		if p > 0 && (inv == nil || !strings.Contains(inv.Detail, "maximum 2")) {
			t.Errorf("priority %d: %v, want the maximum 2 named", p, err)
		}
	}
	cs, err := ps[0].store.ListCounters(ctxT(t), leasestore.CounterFilter{})
	if err != nil || len(cs) != 0 {
		t.Errorf("a refused priority left counters %v (%v)", cs, err)
	}
	mustAcquire(t, ps[0].svc, prioReq("x", 1, 2))
}
