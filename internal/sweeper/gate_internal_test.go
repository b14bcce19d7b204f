package sweeper

import (
	"fmt"
	"testing"
	"time"
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
