package opsview_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/opsview"
)

// TestHolderViewOfParts: a holder of several resources shows its parts' lease names and
// resources joined by "+", the first part's fence, and every part with its fence; a holder
// of one resource shows no parts.
func TestHolderViewOfParts(t *testing.T) {
	cases := map[string]struct {
		holder lease.Holder
		want   opsview.HolderView
	}{
		"one resource": {
			holder: lease.Holder{ID: "lh-1", LeaseName: "tex", Resource: "tex2pdf", Fence: 4},
			want:   opsview.HolderView{ID: "lh-1", Lease: "tex", Resource: "tex2pdf", Fence: 4, Levels: []string{}},
		},
		"several resources": {
			holder: lease.Holder{ID: "lh-2", LeaseName: "gpu", Resource: "gpu-pool", Fence: 3, Parts: []lease.Part{
				{LeaseName: "gpu", Resource: "gpu-pool", Fence: 3}, {LeaseName: "licence", Resource: "licence", Fence: 7}}},
			want: opsview.HolderView{ID: "lh-2", Lease: "gpu+licence", Resource: "gpu-pool+licence", Fence: 3, Levels: []string{},
				Parts: []opsview.PartView{{Lease: "gpu", Resource: "gpu-pool", Fence: 3}, {Lease: "licence", Resource: "licence", Fence: 7}}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, opsview.HolderViewOf(tc.holder)); diff != "" {
				t.Errorf("HolderViewOf (-want +got):\n%s", diff)
			}
		})
	}
}
