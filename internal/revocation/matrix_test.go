package revocation

import "testing"

func TestDecide(t *testing.T) {
	cases := []struct {
		name string
		in   Input
		want Action
	}{
		{"alive, this pod, podBound", Input{Self: true, Alive: true, PodBound: true}, ActionLocal},
		{"alive, this pod, not podBound", Input{Self: true, Alive: true}, ActionLocal},
		{"this pod although the informer says dead", Input{Self: true, Alive: false, PodBound: true}, ActionLocal},
		{"this pod is never forwarded, even after a failure", Input{Self: true, Unreachable: true}, ActionLocal},
		{"alive elsewhere, podBound", Input{Alive: true, PodBound: true}, ActionForward},
		{"alive elsewhere, not podBound", Input{Alive: true}, ActionForward},
		{"alive elsewhere, forward failed, podBound", Input{Alive: true, PodBound: true, Unreachable: true}, ActionReleaseOnly},
		{"alive elsewhere, forward failed, not podBound", Input{Alive: true, Unreachable: true}, ActionReaper},
		{"dead, podBound", Input{PodBound: true}, ActionReleaseOnly},
		{"dead, not podBound", Input{}, ActionReaper},
		{"liveness unknown, podBound", Input{Unknown: true, PodBound: true}, ActionReleaseOnly},
		{"liveness unknown, not podBound: nothing destructive", Input{Unknown: true}, ActionReleaseOnly},
		{"this pod, liveness of others unknown", Input{Self: true, Unknown: true}, ActionLocal},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := Decide(tc.in); got != tc.want {
				t.Errorf("Decide(%+v) = %s, want %s", tc.in, got, tc.want)
			}
		})
	}
}
