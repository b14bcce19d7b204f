package tenantview

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

func TestCounterFromReadsTheCap(t *testing.T) {
	updated := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	base := livev1alpha1.LeaseCounter{Resource: "tex", Level: "tenant", Scope: "acme", Count: 2, Booked: 1, Drift: true, Waiting: 3, Borrowed: 1}
	cases := map[string]struct {
		reason, note string
		capN         int64
		want         Counter
	}{
		"no cap field": {want: Counter{}},
		"a cap":        {capN: 3, want: Counter{Cap: 3}},
		"ambiguous": {reason: livev1alpha1.CapReasonAmbiguous, note: "ambiguous: ...",
			want: Counter{CapReason: livev1alpha1.CapReasonAmbiguous, CapNote: "ambiguous: ..."}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			c := base
			c.Cap, c.CapReason, c.CapNote = tc.capN, tc.reason, tc.note
			o, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&c)
			if err != nil {
				t.Fatal(err)
			}
			o["updatedAt"] = updated.Format(time.RFC3339)
			got, err := counterFrom(o)
			if err != nil {
				t.Fatal(err)
			}
			want := tc.want
			want.Resource, want.Level, want.Scope, want.Count, want.Booked, want.UpdatedAt = "tex", "tenant", "acme", 2, 1, updated
			want.Waiting, want.Borrowed = 3, 1
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("counter (-want +got):\n%s", diff)
			}
		})
	}
}

// TestHolderFromReadsBorrowed: the holder's borrowed mark reaches the view (docs/borrowing.md).
func TestHolderFromReadsBorrowed(t *testing.T) {
	for _, borrowed := range []bool{false, true} {
		h := livev1alpha1.LeaseHolder{Spec: livev1alpha1.LeaseHolderSpec{Resource: "tex"}, Status: livev1alpha1.LeaseHolderStatus{Borrowed: borrowed}}
		o, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&h)
		if err != nil {
			t.Fatal(err)
		}
		got, err := holderFrom(o)
		if err != nil {
			t.Fatal(err)
		}
		if got.Borrowed != borrowed {
			t.Errorf("holder with status.borrowed %v read as borrowed %v", borrowed, got.Borrowed)
		}
	}
}
