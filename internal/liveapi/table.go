package liveapi

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/duration"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

// Columns of `kubectl get leaseholders`; priority 1 columns appear with -o wide only.
var holderColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "The holder's public ID (never its token)."},
	{Name: "Resource", Type: "string", Description: "The resource the lease books; a holder of several resources books each of them, joined by \"+\" (spec.parts)."},
	{Name: "Project", Type: "string", Description: "The logical project ID."},
	{Name: "User", Type: "string", Description: "The logical user ID."},
	{Name: "Type", Type: "string", Description: "The lease type (selects the revocation handler)."},
	{Name: "Pod", Type: "string", Description: "namespace/name of the holding pod."},
	{Name: "Alive", Type: "string", Description: "Whether the pod is alive: True, False, Unknown."},
	{Name: "State", Type: "string", Description: "PENDING while booking, HELD afterwards."},
	{Name: "Fence", Type: "string", Description: "The grant's fencing token; it strictly increases with every grant of the resource. A holder of several resources has one per part, joined by \"+\" in the order of RESOURCE."},
	{Name: "Age", Type: "string", Description: "Time since acquisition."},
	{Name: "Idle", Type: "string", Description: "Time since the last check."},
	{Name: "TTL", Type: "string", Description: "Idle time after which the holder is reaped."},
	{Name: "Tenant", Type: "string", Priority: 1, Description: "The logical tenant ID."},
	{Name: "Lease", Type: "string", Priority: 1, Description: "The LeaseDefinition name; the parts' names joined by \"+\" for a holder of several resources."},
	{Name: "Pod-Bound", Type: "boolean", Priority: 1, Description: "Whether the lease dies with its pod."},
	{Name: "Holder-Ref", Type: "string", Priority: 1, Description: "The caller's reference."},
	{Name: "Levels", Type: "string", Priority: 1, Description: "The booked counter keys."},
	{Name: "Borrowed", Type: "boolean", Priority: 1, Description: "Whether the tenant slot was granted above the tenant cap (docs/borrowing.md)."},
}

// Columns of `kubectl get leasecounters`.
var counterColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "resource.level[.scope]."},
	{Name: "Resource", Type: "string", Description: "The counted resource."},
	{Name: "Level", Type: "string", Description: "user, project, tenant or global."},
	{Name: "Scope", Type: "string", Description: "tenant/user, tenant/project, tenant or *."},
	{Name: "Count", Type: "integer", Description: "The stored count."},
	{Name: "Cap", Type: "string", Description: "The level's cap in the bookers' current definitions; <ambiguous>, <none> (uncapped) or <unknown> without one."},
	{Name: "Booked", Type: "integer", Description: "Holders that book the counter."},
	{Name: "Drift", Type: "string", Description: "DRIFT when count and booked differ."},
	{Name: "Borrowed", Type: "integer", Description: "Booking holders whose slot was granted above the cap, from capacity other tenants left idle (docs/borrowing.md)."},
	{Name: "Waiting", Type: "integer", Description: "Acquisitions waiting in the counter's line."},
	{Name: "Updated", Type: "string", Description: "Time since the last change."},
	{Name: "Key", Type: "string", Priority: 1, Description: "The counter's key in the store."},
	{Name: "Cap-Note", Type: "string", Priority: 1, Description: "Why the counter publishes no cap."},
}

// Columns of `kubectl get leasewaiters`.
var waiterColumns = []metav1.TableColumnDefinition{
	{Name: "Name", Type: "string", Format: "name", Description: "The waiting holder's public ID (never its token)."},
	{Name: "Resource", Type: "string", Description: "The resource it waits for; for an acquisition of several resources, the part it waits on and the resources it is part of: licence (of gpu+licence)."},
	{Name: "Project", Type: "string", Description: "The logical project ID."},
	{Name: "User", Type: "string", Description: "The logical user ID."},
	{Name: "Pod", Type: "string", Description: "namespace/name of the waiting pod."},
	{Name: "Level", Type: "string", Description: "The full level it waits at."},
	{Name: "Scope", Type: "string", Description: "That level's scope."},
	{Name: "Position", Type: "integer", Description: "Live waiters ahead of it in the line, of every tenant: higher priorities first, then older ones."},
	{Name: "Est-Wait", Type: "string", Description: "Estimated wait from the resource's recent hold times; <unknown> before its first hand-over. Never a promise."},
	{Name: "Waiting", Type: "string", Description: "Time since it lined up."},
	{Name: "Tenant", Type: "string", Priority: 1, Description: "The logical tenant ID."},
	{Name: "Lease", Type: "string", Priority: 1, Description: "The LeaseDefinition name; for an acquisition of several resources, the part it waits on and the names of all of them."},
	{Name: "Cap", Type: "integer", Priority: 1, Description: "The level's cap when it lined up."},
	{Name: "Lapsed", Type: "boolean", Priority: 1, Description: "Its process stopped renewing its place; slots pass it over."},
	{Name: "Priority", Type: "integer", Priority: 1, Description: "Its priority: higher ones are served first (docs/waiting.md, \"Priority\")."},
	{Name: "Holder-Ref", Type: "string", Priority: 1, Description: "The caller's reference."},
}

func waiterTable(obj runtime.Object, now time.Time) (*metav1.Table, error) {
	t := &metav1.Table{ColumnDefinitions: waiterColumns}
	var items []livev1alpha1.LeaseWaiter
	switch o := obj.(type) {
	case *livev1alpha1.LeaseWaiter:
		items = []livev1alpha1.LeaseWaiter{*o}
	case *livev1alpha1.LeaseWaiterList:
		items = o.Items
		t.ResourceVersion = o.ResourceVersion // kubectl get -w watches from it
	default:
		return nil, fmt.Errorf("cannot print %T as leasewaiters", obj)
	}
	for i := range items {
		w := &items[i]
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells: []any{
				w.Name, partCell(w.Status.Resource, w.Spec.Resource, w.Spec.Parts), w.Spec.Project, orNone(w.Spec.User), orNone(w.Spec.Pod),
				w.Status.Level, w.Status.Scope, w.Status.Position, waitCell(w.Status.EstimatedWaitMs),
				since(w.Status.Since, now), w.Spec.Tenant, partCell(w.Status.Lease, w.Spec.Lease, w.Spec.Parts), w.Status.Cap, w.Status.Lapsed,
				w.Status.Priority, orNone(w.Spec.HolderRef),
			},
			Object: runtime.RawExtension{Object: w},
		})
	}
	return t, nil
}

func holderTable(obj runtime.Object, now time.Time) (*metav1.Table, error) {
	t := &metav1.Table{ColumnDefinitions: holderColumns}
	var items []livev1alpha1.LeaseHolder
	switch o := obj.(type) {
	case *livev1alpha1.LeaseHolder:
		items = []livev1alpha1.LeaseHolder{*o}
	case *livev1alpha1.LeaseHolderList:
		items = o.Items
		t.Continue = o.Continue
		t.ResourceVersion = o.ResourceVersion // kubectl get -w watches from it
	default:
		return nil, fmt.Errorf("cannot print %T as leaseholders", obj)
	}
	for i := range items {
		h := &items[i]
		pod, alive := h.Spec.Pod, h.Status.PodAlive
		if pod == "" {
			pod, alive = "<none>", "-"
		}
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells: []any{
				h.Name, h.Spec.Resource, h.Spec.Project, orNone(h.Spec.User), h.Spec.Type, pod, alive,
				h.Status.State, fenceCell(h), since(h.Status.AcquiredAt, now), since(h.Status.LastSeenAt, now),
				duration.HumanDuration(time.Duration(h.Spec.TTLSeconds) * time.Second),
				h.Spec.Tenant, h.Spec.Lease, h.Spec.PodBound, orNone(h.Spec.HolderRef),
				strings.Join(h.Status.Levels, ","), h.Status.Borrowed,
			},
			Object: runtime.RawExtension{Object: h},
		})
	}
	return t, nil
}

func counterTable(obj runtime.Object, now time.Time) (*metav1.Table, error) {
	t := &metav1.Table{ColumnDefinitions: counterColumns}
	var items []livev1alpha1.LeaseCounter
	switch o := obj.(type) {
	case *livev1alpha1.LeaseCounter:
		items = []livev1alpha1.LeaseCounter{*o}
	case *livev1alpha1.LeaseCounterList:
		items = o.Items
		t.ResourceVersion = o.ResourceVersion // kubectl get -w watches from it
	default:
		return nil, fmt.Errorf("cannot print %T as leasecounters", obj)
	}
	for i := range items {
		c := &items[i]
		drift := ""
		if c.Drift {
			drift = "DRIFT"
		}
		t.Rows = append(t.Rows, metav1.TableRow{
			Cells: []any{c.Name, c.Resource, c.Level, c.Scope, c.Count, capCell(c), c.Booked, drift, c.Borrowed, c.Waiting, since(c.UpdatedAt, now),
				c.Key, orNone(c.CapNote)},
			Object: runtime.RawExtension{Object: c},
		})
	}
	return t, nil
}

// partCell is what a waiter waits on: the part (its resource or lease name) and, for an
// acquisition of several resources, all of them: "licence (of gpu+licence)".
func partCell(part, all string, parts []livev1alpha1.LeasePart) string {
	if len(parts) == 0 || part == "" {
		return all
	}
	return part + " (of " + all + ")"
}

// fenceCell is the FENCE column: the grant's fence, or one per part joined by "+".
func fenceCell(h *livev1alpha1.LeaseHolder) string {
	if len(h.Status.Parts) == 0 {
		return strconv.FormatInt(h.Status.Fence, 10)
	}
	fences := make([]string, len(h.Status.Parts))
	for i, p := range h.Status.Parts {
		fences[i] = strconv.FormatInt(p.Fence, 10)
	}
	return strings.Join(fences, "+")
}

// capCell is the CAP column: the cap, or why there is none.
func capCell(c *livev1alpha1.LeaseCounter) string {
	switch {
	case c.Cap > 0:
		return strconv.FormatInt(c.Cap, 10)
	case c.CapReason == livev1alpha1.CapReasonAmbiguous:
		return "<ambiguous>"
	case c.CapReason == livev1alpha1.CapReasonUncapped:
		return "<none>"
	default:
		return "<unknown>"
	}
}

func since(t metav1.Time, now time.Time) string {
	if t.IsZero() {
		return "<unknown>"
	}
	return duration.HumanDuration(now.Sub(t.Time))
}

func orNone(s string) string {
	if s == "" {
		return "<none>"
	}
	return s
}
