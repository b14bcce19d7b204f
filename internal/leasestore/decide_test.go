package leasestore

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestDecideCounter(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	p := reconcilePolicy{Now: now, Margin: time.Minute}
	old, recent := now.Add(-2*time.Minute), now.Add(-time.Second)
	for _, tc := range []struct {
		name string
		c    counterState
		want counterDecision
	}{
		{"booked, in step", counterState{Count: 2, Entries: 2, UpdatedAt: old}, counterDecision{}},
		{"an entry of a gone holder is removed, however recent",
			counterState{Count: 2, Entries: 2, UpdatedAt: recent, Gone: []string{"lh-a"}}, counterDecision{Remove: []string{"lh-a"}}},
		{"the last entry of a gone holder is removed; the counter is deleted by a later pass",
			counterState{Count: 1, Entries: 1, UpdatedAt: old, Gone: []string{"lh-a"}}, counterDecision{Remove: []string{"lh-a"}}},
		{"a count apart from its entries is set to them",
			counterState{Count: 3, Entries: 2, UpdatedAt: recent}, counterDecision{FixCount: true}},
		{"unused past the margin: deleted", counterState{UpdatedAt: old}, counterDecision{Delete: true}},
		{"unused within the margin: kept", counterState{UpdatedAt: recent}, counterDecision{}},
		{"unused but lined: kept (a waiter marked it)", counterState{UpdatedAt: old, Lined: true}, counterDecision{}},
		{"a count above no entries is corrected, not deleted", counterState{Count: 1, UpdatedAt: old}, counterDecision{FixCount: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, decideCounter(tc.c, p)); diff != "" {
				t.Errorf("decision (-want +got):\n%s", diff)
			}
		})
	}
}
