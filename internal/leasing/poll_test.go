package leasing

import (
	"testing"
	"time"
)

func TestPollDelay(t *testing.T) {
	const lo, hi = 20 * time.Millisecond, 500 * time.Millisecond
	cases := map[string]struct {
		n      int
		r      float64
		want   time.Duration
		lo, hi time.Duration
	}{
		"first poll, r=0 is the floor":     {n: 0, r: 0, want: lo, lo: lo, hi: hi},
		"first poll bound is 2·lo":         {n: 0, r: 0.999999, want: 40 * time.Millisecond, lo: lo, hi: hi},
		"bound doubles":                    {n: 2, r: 0.5, want: lo + (160*time.Millisecond-lo)/2, lo: lo, hi: hi},
		"bound stops at hi":                {n: 10, r: 0.999999, want: hi, lo: lo, hi: hi},
		"huge n does not overflow":         {n: 1 << 20, r: 0.5, want: lo + (hi-lo)/2, lo: lo, hi: hi},
		"lo equal hi is a constant period": {n: 3, r: 0.7, want: lo, lo: lo, hi: lo},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := pollDelay(tc.n, tc.lo, tc.hi, tc.r)
			if d := got - tc.want; d < -time.Microsecond || d > time.Microsecond {
				t.Errorf("pollDelay(%d, %v, %v, %v) = %v, want %v", tc.n, tc.lo, tc.hi, tc.r, got, tc.want)
			}
			if got < tc.lo || got > tc.hi {
				t.Errorf("pollDelay = %v outside [%v, %v]", got, tc.lo, tc.hi)
			}
		})
	}
}

func TestTokenLabelsAreBounded(t *testing.T) {
	tl := newTokenLabels(3)
	for _, tok := range []string{"a", "b", "c"} {
		tl.put(tok, "r-"+tok)
	}
	tl.get("a") // a is now the most recently used
	tl.put("d", "r-d")
	if got := tl.get("b"); got != LabelUnknown {
		t.Errorf("least recently used token kept: %q", got)
	}
	for tok, want := range map[string]string{"a": "r-a", "c": "r-c", "d": "r-d"} {
		if got := tl.get(tok); got != want {
			t.Errorf("get(%s) = %q, want %q", tok, got, want)
		}
	}
	tl.forget("a")
	if tl.len() != 2 || tl.get("a") != LabelUnknown {
		t.Errorf("forget left %d entries", tl.len())
	}
}
