package leasing

import (
	"strconv"
	"testing"
	"time"
)

// TestSweepGate: once per interval and resource, earlier when a holder the last sweep saw has
// gone idle since, and a bounded memory whatever names the acquisitions bring (an inline
// definition is a new resource each time).
func TestSweepGate(t *testing.T) {
	g := newSweepGate()
	t0 := time.Unix(1000, 0)
	if !g.allow("tex", t0, time.Second) {
		t.Fatal("first sweep refused")
	}
	if g.allow("tex", t0.Add(500*time.Millisecond), time.Second) {
		t.Fatal("second sweep within the interval let through")
	}
	g.swept("tex", t0, 200*time.Millisecond)
	if at, ok := g.nextExpiry("tex"); !ok || !at.Equal(t0.Add(200*time.Millisecond)) {
		t.Fatalf("nextExpiry = %v, %v; want t0+200ms", at, ok)
	}
	if !g.allow("tex", t0.Add(300*time.Millisecond), time.Second) {
		t.Fatal("a sweep after the next expiry was refused")
	}
	g.swept("tex", t0, 0)
	if _, ok := g.nextExpiry("tex"); ok {
		t.Fatal("nextExpiry kept after a sweep that saw no holder")
	}
	if !g.allow("tex", t0.Add(2*time.Second), time.Second) {
		t.Fatal("a sweep after the interval was refused")
	}

	for i := range 5 * sweepGateSize {
		r := "mcp-inline:acme/p/" + strconv.Itoa(i)
		g.allow(r, t0, time.Second)
		g.swept(r, t0, time.Minute)
	}
	if n, m := g.last.Len(), g.next.Len(); n != sweepGateSize || m != sweepGateSize {
		t.Errorf("after %d resources the gate holds %d and %d entries, want %d each", 5*sweepGateSize, n, m, sweepGateSize)
	}
}
