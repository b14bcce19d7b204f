package leasing

import (
	"testing"
	"time"
)

func TestNextLook(t *testing.T) {
	const year = 365 * 24 * time.Hour
	for name, c := range map[string]struct {
		remaining time.Duration
		looked    bool
		want      time.Duration
	}{
		"a wait longer than a safety period":              {remaining: 10 * time.Second, want: time.Second},
		"a pod's wait, a hundred years":                   {remaining: 100 * year, want: time.Second},
		"the longest wait a duration holds":               {remaining: time.Duration(1<<63 - 1), want: time.Second},
		"a wait shorter than a safety period, first look": {remaining: time.Second, want: 750 * time.Millisecond},
		"a wait shorter than a safety period, looked":     {remaining: time.Second, looked: true, want: 2 * time.Second},
	} {
		// r 0.5: the safety delay of a 1 s period is 0.75 s + 0.25 s.
		if got := nextLook(time.Second, 0.5, c.remaining, c.looked); got != c.want {
			t.Errorf("%s: nextLook = %v, want %v", name, got, c.want)
		}
	}
	if got := threeQuarters(100 * year); got != 75*year {
		t.Errorf("threeQuarters(100 years) = %v, want 75 years", got)
	}
}
