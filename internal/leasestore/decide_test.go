package leasestore

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecideCounter(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	old := now.Add(-time.Hour)
	policy := reconcilePolicy{Now: now, Margin: time.Minute, Confirm: 10 * time.Second}
	seenAt := func(d time.Duration, count, want int) *lowering {
		return &lowering{count: count, updatedAt: old, want: want, seen: now.Add(-d)}
	}
	cases := map[string]struct {
		c        counterState
		previous *lowering
		want     counterAction
		keep     lowering
	}{
		"equal":                           {c: counterState{Count: 2, Booked: 2, UpdatedAt: old}, want: actionNone},
		"equal but recent":                {c: counterState{Count: 2, Booked: 2, UpdatedAt: now}, want: actionNone},
		"dormant counter, old":            {c: counterState{Count: 0, Booked: 0, UpdatedAt: old}, want: actionDelete},
		"dormant counter, recent":         {c: counterState{Count: 0, Booked: 0, UpdatedAt: now.Add(-time.Second)}, want: actionSkip},
		"below booked: raise at once":     {c: counterState{Count: 1, Booked: 2, UpdatedAt: old}, want: actionRaise},
		"below booked but recent":         {c: counterState{Count: 1, Booked: 2, UpdatedAt: now.Add(-59 * time.Second)}, want: actionSkip},
		"changed exactly at the cutoff":   {c: counterState{Count: 1, Booked: 2, UpdatedAt: now.Add(-time.Minute)}, want: actionSkip},
		"written after the pass started":  {c: counterState{Count: 3, Booked: 1, UpdatedAt: now.Add(time.Second)}, want: actionSkip},
		"excess, first look":              {c: counterState{Count: 2, Booked: 1, UpdatedAt: old}, want: actionConfirm, keep: lowering{count: 2, updatedAt: old, want: 1, seen: now}},
		"excess, seen too recently":       {c: counterState{Count: 2, Booked: 1, UpdatedAt: old}, previous: seenAt(5*time.Second, 2, 1), want: actionConfirm, keep: lowering{count: 2, updatedAt: old, want: 1, seen: now.Add(-5 * time.Second)}},
		"excess, confirmed: lower":        {c: counterState{Count: 2, Booked: 1, UpdatedAt: old}, previous: seenAt(10*time.Second, 2, 1), want: actionLower},
		"excess to zero, confirmed":       {c: counterState{Count: 1, Booked: 0, UpdatedAt: old}, previous: seenAt(time.Minute, 1, 0), want: actionDelete},
		"excess, booked changed since":    {c: counterState{Count: 2, Booked: 1, UpdatedAt: old}, previous: seenAt(time.Minute, 2, 0), want: actionConfirm, keep: lowering{count: 2, updatedAt: old, want: 1, seen: now}},
		"excess, count changed since":     {c: counterState{Count: 2, Booked: 1, UpdatedAt: old}, previous: seenAt(time.Minute, 3, 1), want: actionConfirm, keep: lowering{count: 2, updatedAt: old, want: 1, seen: now}},
		"excess to zero, first look":      {c: counterState{Count: 1, Booked: 0, UpdatedAt: old}, want: actionConfirm, keep: lowering{count: 1, updatedAt: old, want: 0, seen: now}},
		"confirm 0 still needs two looks": {c: counterState{Count: 2, Booked: 1, UpdatedAt: old}, want: actionConfirm, keep: lowering{count: 2, updatedAt: old, want: 1, seen: now}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			p := policy
			if name == "confirm 0 still needs two looks" {
				p.Confirm = 0
			}
			got, keep := decideCounter(tc.c, p, tc.previous)
			if got != tc.want {
				t.Errorf("action = %d, want %d", got, tc.want)
			}
			if diff := cmp.Diff(tc.keep, keep, cmp.AllowUnexported(lowering{})); diff != "" {
				t.Errorf("remembered observation (-want +got):\n%s", diff)
			}
		})
	}
}
