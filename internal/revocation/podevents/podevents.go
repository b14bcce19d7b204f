// Package podevents records the revocation dispatcher's Events on holders' pods through
// client-go's events API. It is the manager's side of revocation.PodEvents: the dispatcher
// itself imports nothing of Kubernetes, so that the lease agent, which records no Events,
// links none of it.
package podevents

import (
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/events"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/revocation"
)

type recorder struct{ events events.EventRecorder }

// New records through r (the manager's GetEventRecorder("lease-operator")).
func New(r events.EventRecorder) revocation.PodEvents { return recorder{r} }

func (r recorder) PodEvent(pod lease.PodRef, warning bool, reason, action, note string) {
	ref := &corev1.ObjectReference{
		Kind: "Pod", APIVersion: "v1", Namespace: pod.Namespace, Name: pod.Name, UID: types.UID(pod.UID),
	}
	kind := corev1.EventTypeNormal
	if warning {
		kind = corev1.EventTypeWarning
	}
	r.events.Eventf(ref, nil, kind, reason, action, "%s", note)
}
