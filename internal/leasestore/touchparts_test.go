package leasestore_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
)

// TouchParts answers what TouchFence answers, and the parts of a holder of several resources
// with their fences; a holder of one resource has none. A holder that is gone is lost.
func TestTouchParts(t *testing.T) {
	s := newStore(t)
	c := ctxT(t)
	single := mustAcquire(t, s, request("tex", "acme", "p", "ann", []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}))
	several := mustAcquire(t, s, partsReq("ann", "licence", "gpu"))
	cases := map[string]struct {
		holder    lease.Holder
		wantFence int64
		wantParts []lease.Part
	}{
		"one resource":      {holder: single, wantFence: single.Fence},
		"several resources": {holder: several, wantFence: several.Parts[0].Fence, wantParts: several.Parts},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			fence, parts, err := s.TouchParts(c, tc.holder.Token)
			if err != nil || fence != tc.wantFence || fence < 1 {
				t.Errorf("touch = fence %d, %v; want %d", fence, err, tc.wantFence)
			}
			if diff := cmp.Diff(tc.wantParts, parts); diff != "" {
				t.Errorf("parts (-want +got):\n%s", diff)
			}
			if fence, err := s.TouchFence(c, tc.holder.Token); err != nil || fence != tc.wantFence {
				t.Errorf("TouchFence = %d, %v; want TouchParts' fence %d", fence, err, tc.wantFence)
			}
			if _, err := s.Release(c, tc.holder.Token); err != nil {
				t.Fatal(err)
			}
			if _, parts, err := s.TouchParts(c, tc.holder.Token); !errors.Is(err, lease.ErrLost) || parts != nil {
				t.Errorf("touch after release = %v, %v; want lost", parts, err)
			}
		})
	}
}
