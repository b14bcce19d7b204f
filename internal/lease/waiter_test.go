package lease_test

import (
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

func TestEstimateWait(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, tc := range []struct {
		ahead, cap int
		holds      []time.Duration
		want       time.Duration
	}{
		{0, 1, []time.Duration{ms(100), ms(300)}, ms(200)},
		{3, 1, []time.Duration{ms(100)}, ms(400)},
		{5, 6, []time.Duration{ms(60)}, ms(60)},
		{0, 6, []time.Duration{ms(60)}, ms(10)},
		{2, 1, nil, 0},
		{2, 0, []time.Duration{ms(60)}, 0},
	} {
		if got := lease.EstimateWait(tc.ahead, tc.cap, tc.holds); got != tc.want {
			t.Errorf("EstimateWait(%d, %d, %v) = %v, want %v", tc.ahead, tc.cap, tc.holds, got, tc.want)
		}
	}
}

func TestSplitCounterKey(t *testing.T) {
	k := lease.CounterKey("gpu", lease.LevelUser, "acme/ann")
	r, l, sc, ok := lease.SplitCounterKey(k)
	if !ok || r != "gpu" || l != lease.LevelUser || sc != "acme/ann" {
		t.Fatalf("SplitCounterKey(%q) = %q %q %q %v", k, r, l, sc, ok)
	}
	if _, _, _, ok := lease.SplitCounterKey("gpu|user"); ok {
		t.Fatal("a key without a scope split")
	}
}
