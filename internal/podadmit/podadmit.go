// Package podadmit admits whole pods by lease (docs/pod-admission.md): a pod annotated
// AnnotationLease is created with the scheduling gate Gate (the webhook, Gater), the manager
// acquires the lease on the pod's behalf, waiting in the level's line like any other
// acquisition, and removes only its own gate once the lease is granted (Admitter). A pod may
// name several leases in AnnotationLease: they are acquired as one, all or none. The
// holder is bound to the pod, so the pod's end (Succeeded, Failed, deleted) releases it
// through the pod reaper, as for any pod-bound lease.
//
// This file holds the names and the pure decisions; webhook.go and admitter.go the
// Kubernetes parts.
package podadmit

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
)

// The annotations a pod asks for admission with.
const (
	// AnnotationLease names the lease (a LeaseDefinition's leaseName) the pod waits for
	// before it is scheduled. "none" admits it at once, like a NOOP acquisition. A
	// comma-separated list ("gpu,licence") names several leases, granted together or not at
	// all (leasesOf).
	AnnotationLease = "lease.vancetope.io/admit-lease"
	// AnnotationProject is the project the lease is taken in; default DefaultProject.
	AnnotationProject = "lease.vancetope.io/admit-project"
	// AnnotationUser is the user; required when the lease caps the user level.
	AnnotationUser = "lease.vancetope.io/admit-user"
	// AnnotationType is the lease type, which selects the revocation handler; default
	// DefaultType.
	AnnotationType = "lease.vancetope.io/admit-type"
	// AnnotationMaxWait bounds the wait (a Go duration, "10m"); without it the pod waits as
	// long as it exists.
	AnnotationMaxWait = "lease.vancetope.io/admit-max-wait"
)

// What admission records on the pod, in the write that removes the gate.
const (
	// AnnotationFence is the grant's fence (docs/fencing.md), for a pod admitted by one lease.
	AnnotationFence = "lease.vancetope.io/admitted-fence"
	// AnnotationFences are, for a pod admitted by several leases, the fence of each:
	// "name=fence" pairs separated by commas, in the order AnnotationLease lists the names
	// (fencesOf). Each part's resource numbers its own grants, so one fence would not do.
	AnnotationFences = "lease.vancetope.io/admitted-fences"
	// AnnotationAdmittedAt is when the lease was granted (RFC 3339, the manager's clock).
	AnnotationAdmittedAt = "lease.vancetope.io/admitted-at"
	// AnnotationHolder is the holder's public ID (`kubectl get leaseholders`).
	AnnotationHolder = "lease.vancetope.io/admitted-holder"
)

// Gate is the scheduling gate admission adds and removes; other gates are never touched.
const Gate = "lease.vancetope.io/admission"

// ConditionAdmitted is the pod condition that says why a gated pod waits, or that it was
// admitted.
const ConditionAdmitted corev1.PodConditionType = "lease.vancetope.io/Admitted"

// Reasons of ConditionAdmitted and of the Events admission records.
const (
	ReasonGranted          = "LeaseGranted"
	ReasonNotRequired      = "LeaseNotRequired"
	ReasonWaiting          = "WaitingForLease"
	ReasonDefinitionError  = "LeaseDefinitionError"
	ReasonStoreUnavailable = "LeaseStoreUnavailable"
	ReasonWaitExpired      = "LeaseWaitExpired"
)

// Defaults of the annotations.
const (
	DefaultProject = "default"
	DefaultType    = handlers.TypeNotify
)

// forever is the wait of a pod without AnnotationMaxWait: it ends when the pod does (the
// admitter cancels the acquisition).
const forever = 100 * 365 * 24 * time.Hour

// Wants reports whether pod asks for admission by lease.
func Wants(pod *corev1.Pod) bool { return pod.Annotations[AnnotationLease] != "" }

// Gated reports whether pod still carries admission's scheduling gate.
func Gated(pod *corev1.Pod) bool {
	for _, g := range pod.Spec.SchedulingGates {
		if g.Name == Gate {
			return true
		}
	}
	return false
}

// withGate returns the gates with admission's added (unchanged when present).
func withGate(gates []corev1.PodSchedulingGate) []corev1.PodSchedulingGate {
	for _, g := range gates {
		if g.Name == Gate {
			return gates
		}
	}
	return append(gates, corev1.PodSchedulingGate{Name: Gate})
}

// withoutGate returns the gates without admission's, keeping every other in its order; nil
// when none is left (the field is then omitted).
func withoutGate(gates []corev1.PodSchedulingGate) []corev1.PodSchedulingGate {
	var out []corev1.PodSchedulingGate
	for _, g := range gates {
		if g.Name != Gate {
			out = append(out, g)
		}
	}
	return out
}

// RequestOf is the acquisition pod asks for as tenant: its pod is the holder, bound to it.
// Bad annotation values are an *lease.InvalidError naming the annotation.
func RequestOf(pod *corev1.Pod, tenant string) (leasing.Request, error) {
	a := pod.Annotations
	names, err := leasesOf(a[AnnotationLease])
	if err != nil {
		return leasing.Request{}, err
	}
	req := leasing.Request{
		Type:      a[AnnotationType],
		Lease:     a[AnnotationLease],
		Tenant:    tenant,
		Project:   a[AnnotationProject],
		User:      a[AnnotationUser],
		HolderRef: "pod/" + pod.Namespace + "/" + pod.Name,
		Pod:       lease.PodRef{Namespace: pod.Namespace, Name: pod.Name, UID: string(pod.UID)},
		PodBound:  true,
	}
	if names != nil {
		req.Lease, req.Leases = "", names
	}
	if req.Type == "" {
		req.Type = DefaultType
	}
	if req.Project == "" {
		req.Project = DefaultProject
	}
	wait := forever
	if s, ok := a[AnnotationMaxWait]; ok {
		d, err := time.ParseDuration(s)
		if err != nil || d < 0 {
			return leasing.Request{}, lease.Invalid(AnnotationMaxWait, "%q is not a non-negative duration such as 10m", s)
		}
		wait = d
	}
	req.WaitFor = &wait
	return req, nil
}

// leasesOf reads the value of AnnotationLease as a list of several leases: nil for a value
// without a comma, which names one lease (or "none") exactly as before lists existed. A list
// has two to leasestore.MaxParts valid lease names, none twice and none "none"; spaces around
// a name are ignored. Its errors name the annotation, so that the webhook refuses the pod at
// creation and the admitter keeps a gated pod whose list was edited since gated with the
// reason; the acquisition service checks the same bounds again (leasing.Request.Leases).
func leasesOf(value string) ([]string, error) {
	if !strings.Contains(value, ",") {
		return nil, nil
	}
	if n := strings.Count(value, ",") + 1; n > leasestore.MaxParts {
		return nil, lease.Invalid(AnnotationLease, "names %d leases, at most %d", n, leasestore.MaxParts)
	}
	var names []string
	for _, name := range strings.Split(value, ",") {
		name = strings.TrimSpace(name)
		switch {
		case name == "":
			return nil, lease.Invalid(AnnotationLease, "has an empty lease name: separate the names with single commas, as in gpu,licence")
		case name == definition.NoneReference:
			return nil, lease.Invalid(AnnotationLease, "lists %q, which names no lease: leave it out of the list", name)
		case !definition.ValidName(name):
			return nil, lease.Invalid(AnnotationLease, "%q is not a valid lease name (want [A-Za-z0-9][A-Za-z0-9_-]{0,63})", lease.Clip(name, 64))
		case slices.Contains(names, name):
			return nil, lease.Invalid(AnnotationLease, "names %s twice", name)
		}
		names = append(names, name)
	}
	return names, nil
}

// admittedAnnotations are what the write that removes the gate records for a grant of the
// leases names (nil for a pod of one lease).
func admittedAnnotations(l leasing.Lease, names []string, at time.Time) map[string]string {
	out := map[string]string{AnnotationAdmittedAt: at.UTC().Format(time.RFC3339)}
	if l.NoOp {
		return out
	}
	out[AnnotationHolder] = lease.HolderID(l.Token)
	if names == nil {
		out[AnnotationFence] = strconv.FormatInt(l.Fence, 10)
	} else {
		out[AnnotationFences] = fencesOf(l, names)
	}
	return out
}

// fencesOf is AnnotationFences of a grant of several leases: "name=fence" for each of names
// in their order. A lease that caps no level books nothing and has no fence: it is left out.
func fencesOf(l leasing.Lease, names []string) string {
	var out []string
	for _, name := range names {
		for _, p := range l.Parts {
			if p.Name == name {
				out = append(out, name+"="+strconv.FormatInt(p.Fence, 10))
			}
		}
	}
	return strings.Join(out, ",")
}

// grantedNote is the Event's note of an admission by the leases named (nil for one lease).
func grantedNote(l leasing.Lease, names []string) string {
	switch {
	case l.NoOp && names != nil:
		return fmt.Sprintf("Leases %s apply no cap: admitted without a lease", strings.Join(names, ", "))
	case l.NoOp:
		return fmt.Sprintf("Lease %s applies no cap: admitted without a lease", l.Name)
	case names != nil:
		return fmt.Sprintf("Leases %s granted together (holder %s, fences %s); the scheduling gate %s is removed",
			strings.Join(names, ", "), lease.HolderID(l.Token), fencesOf(l, names), Gate)
	}
	return fmt.Sprintf("Lease %s granted (holder %s, fence %d); the scheduling gate %s is removed", l.Name, lease.HolderID(l.Token), l.Fence, Gate)
}

// heldFor reports whether h is the holder a grant for a pod asking for name (a pod of one
// lease) or names (a pod of several) would have booked. The store keeps the parts in the
// order of their resources, not the pod's, so the names are compared as sets; a lease of the
// list that caps no level books no part, so the holder's parts need only all be listed.
func heldFor(h lease.Holder, name string, names []string) bool {
	if names == nil {
		return len(h.Parts) == 0 && h.LeaseName == name
	}
	if len(h.Parts) == 0 {
		return false
	}
	for _, p := range h.Parts {
		if !slices.Contains(names, p.LeaseName) {
			return false
		}
	}
	return true
}

// isDefinitionError reports whether err comes from the lease's definition (broken, in
// conflict, refused) rather than the store.
func isDefinitionError(err error) bool {
	var ue *definition.UnavailableError
	return errors.As(err, &ue)
}
