package tenantview

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/runtime"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

func TestCounterFromReadsACapWhenPublished(t *testing.T) {
	updated := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&livev1alpha1.LeaseCounter{
		Resource: "tex", Level: "tenant", Scope: "acme", Count: 2, Booked: 1, Drift: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	obj["updatedAt"] = updated.Format(time.RFC3339)
	cases := map[string]struct {
		cap  any
		want int64
	}{
		"no cap field": {want: 0},
		"a cap":        {cap: int64(3), want: 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			o := runtime.DeepCopyJSON(obj)
			if tc.cap != nil {
				o["cap"] = tc.cap
			}
			got, err := counterFrom(o)
			if err != nil {
				t.Fatal(err)
			}
			want := Counter{Resource: "tex", Level: "tenant", Scope: "acme", Count: 2, Booked: 1, Cap: tc.want, UpdatedAt: updated}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("counter (-want +got):\n%s", diff)
			}
		})
	}
}
