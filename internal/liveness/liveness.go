// Package liveness holds what every process of the lease system shares about whether a
// holder's pod is alive, without watching pods: the verdict and its reasons, the process's
// own pod, and the view of a process that watches none (SelfOnly, the lease agent's). The
// predicate over a Pod object, and the informer that feeds it, are podwatch's; this package
// imports nothing of Kubernetes, so that the agent links none of it (cmd/agent).
package liveness

import (
	"context"
	"errors"

	"github.com/vancetope/lease-operator/internal/lease"
)

// Reasons of a verdict. They are stable strings for logs and operational views.
const (
	// ReasonSelf: the holder is this process's own pod, which is alive by definition.
	ReasonSelf = "Self"
	// ReasonRunning: the pod exists with the recorded UID, has not finished and has an IP.
	ReasonRunning = "Running"
	// ReasonNoPod: the holder records no pod at all.
	ReasonNoPod = "NoPod"
	// ReasonNotFound: no pod of that namespace/name exists (deleted).
	ReasonNotFound = "NotFound"
	// ReasonUIDMismatch: a pod of that name exists but it is another incarnation.
	ReasonUIDMismatch = "UIDMismatch"
	// ReasonFinished: the pod's phase is Succeeded or Failed; it never runs again.
	ReasonFinished = "Finished"
	// ReasonNoEndpoint: the pod has no IP although it is past Pending (torn down).
	ReasonNoEndpoint = "NoEndpoint"
	// ReasonPending: the pod has not started yet (phase Pending, no IP): a pod admitted by
	// lease waits for or holds its lease before it runs (docs/pod-admission.md).
	ReasonPending = "Pending"
	// ReasonDeletionOverdue: the pod is being deleted and its grace period has passed; it is
	// stale (its node is likely gone), even though the object still says Running.
	ReasonDeletionOverdue = "DeletionOverdue"
	// ReasonUnknown: the pod could not be looked at (a cache not started yet, or a process
	// that watches no pods).
	ReasonUnknown = "Unknown"
)

// Verdict is the answer to "is this holder's pod alive?".
type Verdict struct {
	Alive bool
	// Reason is one of the Reason constants.
	Reason string
	// IP is the live pod's address (where its agent listens); empty for this process's
	// own pod, which needs none.
	IP string
}

// ErrUnknown reports that the process cannot tell whether the pod is alive (it watches no
// pods and may not read them). Callers must not decide "dead" on it.
var ErrUnknown = errors.New("pod liveness unknown here")

// ErrLookupLimited refuses a caller whose address the pod cache does not know while too many
// such lookups are under way.
var ErrLookupLimited = errors.New("too many callers whose address the pod cache does not know; retry in a moment")

// IsSelf reports whether holder is the pod self. Namespace and name must match; the UIDs
// must match when both are known (a previous incarnation of our name is not us).
func IsSelf(holder, self lease.PodRef) bool {
	if self.Name == "" || holder.Name != self.Name || holder.Namespace != self.Namespace {
		return false
	}
	return holder.UID == "" || self.UID == "" || holder.UID == self.UID
}

// Known decides the two cases that need no look at the pod: a holder that records no pod is
// dead (ReasonNoPod), this process's own pod is alive (ReasonSelf). decided is false for
// every other holder.
func Known(holder, self lease.PodRef) (reason string, alive, decided bool) {
	switch {
	case holder.Name == "":
		return ReasonNoPod, false, true
	case IsSelf(holder, self):
		return ReasonSelf, true, true
	}
	return "", false, false
}

// SelfOnly is the liveness view of a process that watches no pods (the lease agent): its own
// pod is alive, a holder without a pod is dead, and of every other pod it knows nothing.
// Where a pod watcher would ask the API server, it returns ErrUnknown, so that nothing
// destructive is decided on a guess.
type SelfOnly struct {
	Self lease.PodRef
}

// WaitForSync is true at once: there is nothing to sync.
func (SelfOnly) WaitForSync(context.Context) bool { return true }

// Alive is true for this process's own pod only.
func (s SelfOnly) Alive(pod lease.PodRef) bool {
	_, alive, _ := Known(pod, s.Self)
	return alive
}

// Confirm decides for this process's own pod and for no pod; any other pod is ErrUnknown.
func (s SelfOnly) Confirm(_ context.Context, pod lease.PodRef) (Verdict, error) {
	if reason, alive, ok := Known(pod, s.Self); ok {
		return Verdict{Alive: alive, Reason: reason}, nil
	}
	return Verdict{Reason: ReasonUnknown}, ErrUnknown
}
