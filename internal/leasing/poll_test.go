package leasing

import (
	"testing"
	"time"
)

func TestNextCheck(t *testing.T) {
	const s = time.Second
	cases := map[string]struct {
		safety, remaining time.Duration
		checkedLate       bool
		want              time.Duration
		wantLate          bool
	}{
		"safety timer before the deadline":   {safety: s, remaining: 10 * s, want: s},
		"deadline first: one look at 3/4":    {safety: s, remaining: 800 * time.Millisecond, want: 600 * time.Millisecond, wantLate: true},
		"after the late look: the deadline":  {safety: s, remaining: 200 * time.Millisecond, checkedLate: true, want: 200 * time.Millisecond},
		"equal: the deadline comes first":    {safety: s, remaining: s, want: 750 * time.Millisecond, wantLate: true},
		"late look taken, safety still fits": {safety: s, remaining: 10 * s, checkedLate: true, want: s},
		// A look must keep a quarter of the wait: one that the deadline would cut answers
		// unavailable (fail closed), a false 503 for a level that was merely full.
		"safety just before the deadline: the late look instead": {safety: 950 * time.Millisecond, remaining: s,
			want: 750 * time.Millisecond, wantLate: true},
		"late look taken, safety just before the deadline": {safety: 950 * time.Millisecond, remaining: s, checkedLate: true, want: s},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			d, late := nextCheck(tc.safety, tc.remaining, tc.checkedLate)
			if d != tc.want || late != tc.wantLate {
				t.Errorf("nextCheck(%v, %v, %v) = %v, %v; want %v, %v", tc.safety, tc.remaining, tc.checkedLate, d, late, tc.want, tc.wantLate)
			}
			if d > tc.remaining {
				t.Errorf("next check %v after the deadline %v", d, tc.remaining)
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
