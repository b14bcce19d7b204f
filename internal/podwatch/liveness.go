// Package podwatch keeps an informer of pods and answers the one liveness question of the
// lease system (docs/design.md, "Reaping"): is a holder's pod alive? The sweeper's
// pod-dead reap, the revocation dispatcher and the operational views all ask here, so that
// "alive" has exactly one definition: the pure function Liveness.
package podwatch

import (
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	corev1 "k8s.io/api/core/v1"
)

// Liveness is the liveness predicate. holder is the pod recorded in a holder document, self
// the pod of this process (zero when unknown), pod the current object of that
// namespace/name (nil when there is none), now the current time. A holder's pod is alive
// when
//
//   - it is this process's own pod: always alive, whatever the informer says (a pod that
//     performs the check is obviously running; a late informer must not reap our own leases),
//   - or it exists with the recorded UID (a recreated pod of the same name is another
//     holder), is not finished (Succeeded/Failed), has an endpoint (pod IP) or has not
//     started yet (Pending: a pod admitted by lease holds or waits for its lease before it
//     runs), and, when it is being deleted, its deletion deadline (deletionTimestamp, i.e.
//     the end of the grace period) has not passed. A pod in its grace period still runs and
//     may still release its leases itself.
//
// An empty recorded UID matches any UID (holders written without the downward API's UID).
func Liveness(holder, self lease.PodRef, pod *corev1.Pod, now time.Time) (reason string, alive bool) {
	if reason, alive, ok := liveness.Known(holder, self); ok {
		return reason, alive
	}
	switch {
	case pod == nil:
		return liveness.ReasonNotFound, false
	case holder.UID != "" && string(pod.UID) != holder.UID:
		return liveness.ReasonUIDMismatch, false
	case Finished(pod):
		return liveness.ReasonFinished, false
	case pod.DeletionTimestamp != nil && !now.Before(pod.DeletionTimestamp.Time):
		return liveness.ReasonDeletionOverdue, false
	case PodIP(pod) == "" && (pod.Status.Phase == corev1.PodPending || pod.Status.Phase == ""):
		return liveness.ReasonPending, true
	case PodIP(pod) == "":
		return liveness.ReasonNoEndpoint, false
	}
	return liveness.ReasonRunning, true
}

// Finished reports whether the pod reached a terminal phase.
func Finished(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodSucceeded || pod.Status.Phase == corev1.PodFailed
}

// PodIP returns the pod's primary IP ("" when it has none).
func PodIP(pod *corev1.Pod) string {
	if pod.Status.PodIP != "" {
		return pod.Status.PodIP
	}
	if len(pod.Status.PodIPs) > 0 {
		return pod.Status.PodIPs[0].IP
	}
	return ""
}

// RefOf returns the PodRef of a pod object.
func RefOf(pod *corev1.Pod) lease.PodRef {
	return lease.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)}
}
