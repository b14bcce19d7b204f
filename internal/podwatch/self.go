package podwatch

import (
	"context"
	"errors"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// ErrUnknown reports that the process cannot tell whether the pod is alive (it watches no pods and may
// not read them). Callers must not decide "dead" on it.
var ErrUnknown = errors.New("pod liveness unknown here")

// SelfOnly is the liveness view of a process that watches no pods (the lease agent): its own
// pod is alive, a holder without a pod is dead, and of every other pod it knows nothing.
// It answers with the same predicate (Liveness) as the Watcher; where the Watcher would ask
// the API server, it returns ErrUnknown, so that nothing destructive is decided on a guess.
type SelfOnly struct {
	Self lease.PodRef
}

// WaitForSync is true at once: there is nothing to sync.
func (SelfOnly) WaitForSync(context.Context) bool { return true }

// Alive is true for this process's own pod only.
func (s SelfOnly) Alive(pod lease.PodRef) bool {
	_, alive := Liveness(pod, s.Self, nil, time.Time{})
	return alive
}

// Confirm decides for this process's own pod and for no pod; any other pod is ErrUnknown.
func (s SelfOnly) Confirm(_ context.Context, pod lease.PodRef) (Verdict, error) {
	if pod.Name == "" || IsSelf(pod, s.Self) {
		reason, alive := Liveness(pod, s.Self, nil, time.Time{})
		return Verdict{Alive: alive, Reason: reason}, nil
	}
	return Verdict{Reason: ReasonUnknown}, ErrUnknown
}
