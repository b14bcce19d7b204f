package liveness_test

import (
	"context"
	"errors"
	"testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
)

func TestKnown(t *testing.T) {
	self := lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u-1"}
	for name, c := range map[string]struct {
		holder         lease.PodRef
		reason         string
		alive, decided bool
	}{
		"no pod":                      {holder: lease.PodRef{}, reason: liveness.ReasonNoPod, decided: true},
		"this pod":                    {holder: self, reason: liveness.ReasonSelf, alive: true, decided: true},
		"this pod, UID not recorded":  {holder: lease.PodRef{Namespace: "acme", Name: "app-0"}, reason: liveness.ReasonSelf, alive: true, decided: true},
		"an earlier pod of this name": {holder: lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u-0"}},
		"a pod of another namespace":  {holder: lease.PodRef{Namespace: "globex", Name: "app-0", UID: "u-1"}},
		"another pod":                 {holder: lease.PodRef{Namespace: "acme", Name: "app-1", UID: "u-2"}},
	} {
		reason, alive, decided := liveness.Known(c.holder, self)
		if reason != c.reason || alive != c.alive || decided != c.decided {
			t.Errorf("%s: Known = %q, %v, %v; want %q, %v, %v", name, reason, alive, decided, c.reason, c.alive, c.decided)
		}
	}
	if _, _, decided := liveness.Known(self, lease.PodRef{}); decided {
		t.Error("a process that knows no pod of its own decided for a pod")
	}
}

// The agent decides nothing destructive on a guess: another pod is unknown, never dead.
func TestSelfOnly(t *testing.T) {
	self := lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u-1"}
	v := liveness.SelfOnly{Self: self}
	if !v.Alive(self) || v.Alive(lease.PodRef{Namespace: "acme", Name: "app-1"}) || v.Alive(lease.PodRef{}) {
		t.Error("Alive: want true for its own pod only")
	}
	if got, err := v.Confirm(context.Background(), self); err != nil || !got.Alive || got.Reason != liveness.ReasonSelf {
		t.Errorf("Confirm(self) = %+v, %v", got, err)
	}
	if got, err := v.Confirm(context.Background(), lease.PodRef{}); err != nil || got.Alive || got.Reason != liveness.ReasonNoPod {
		t.Errorf("Confirm(no pod) = %+v, %v", got, err)
	}
	got, err := v.Confirm(context.Background(), lease.PodRef{Namespace: "acme", Name: "app-1"})
	if !errors.Is(err, liveness.ErrUnknown) || got.Alive || got.Reason != liveness.ReasonUnknown {
		t.Errorf("Confirm(another pod) = %+v, %v; want unknown", got, err)
	}
}
