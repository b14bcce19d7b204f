package liveapi

import (
	"encoding/base64"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/selection"
	"k8s.io/apimachinery/pkg/util/validation"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Pod liveness as shown in status.podAlive.
const (
	podAliveTrue    = "True"
	podAliveFalse   = "False"
	podAliveUnknown = "Unknown"
)

// holderObject renders a holder as the LeaseHolder it is in namespace ns.
func holderObject(h lease.Holder, ns string, pods PodStatus) livev1alpha1.LeaseHolder {
	obj := livev1alpha1.LeaseHolder{
		TypeMeta: metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "LeaseHolder"},
		ObjectMeta: metav1.ObjectMeta{
			Name:              h.ID,
			Namespace:         ns,
			CreationTimestamp: metav1.NewTime(h.AcquiredAt),
			Labels:            holderLabels(h),
		},
		Spec: livev1alpha1.LeaseHolderSpec{
			Lease:      h.LeaseNames(),
			Resource:   h.Resources(),
			Parts:      specParts(h),
			Type:       h.Type,
			Tenant:     h.Tenant,
			Project:    h.Project,
			User:       h.User,
			HolderRef:  h.HolderRef,
			Pod:        h.Pod.String(),
			PodUID:     h.Pod.UID,
			PodBound:   h.PodBound,
			TTLSeconds: int64(h.TTL.Seconds()),
			Payload:    h.Payload,
		},
		Status: livev1alpha1.LeaseHolderStatus{
			State:      string(h.State),
			Levels:     h.Levels,
			AcquiredAt: metav1.NewTime(h.AcquiredAt),
			LastSeenAt: metav1.NewTime(h.LastSeenAt),
			Fence:      h.Fence,
			Parts:      statusParts(h),
			Borrowed:   h.Borrowed,
		},
	}
	if h.Pod.String() != "" {
		obj.Status.PodAlive = podAliveUnknown
		if pods != nil {
			reason, alive := pods.Status(h.Pod)
			obj.Status.PodAlive = podAliveFalse
			if alive {
				obj.Status.PodAlive = podAliveTrue
			} else {
				obj.Status.PodReason = reason
			}
		}
	}
	return obj
}

// specParts are the parts of a holder of several resources as its spec shows them; nil for
// a holder of one.
func specParts(h lease.Holder) []livev1alpha1.LeasePart {
	if len(h.Parts) == 0 {
		return nil
	}
	out := make([]livev1alpha1.LeasePart, len(h.Parts))
	for i, p := range h.Parts {
		out[i] = livev1alpha1.LeasePart{Lease: p.LeaseName, Resource: p.Resource}
	}
	return out
}

// statusParts are the fences of a holder of several resources; nil for a holder of one.
func statusParts(h lease.Holder) []livev1alpha1.LeasePartStatus {
	if len(h.Parts) == 0 {
		return nil
	}
	out := make([]livev1alpha1.LeasePartStatus, len(h.Parts))
	for i, p := range h.Parts {
		out[i] = livev1alpha1.LeasePartStatus{Resource: p.Resource, Fence: p.Fence}
	}
	return out
}

// holderLabels are the selectable labels; values that are no valid label value are left
// out (field selectors on spec still find them). A holder of several resources has no
// resource label ("gpu+licence" is none): selectors on it match each part (matchesSpec).
func holderLabels(h lease.Holder) map[string]string {
	out := map[string]string{}
	add := func(k, v string) {
		if v != "" && len(validation.IsValidLabelValue(v)) == 0 {
			out[k] = v
		}
	}
	add(livev1alpha1.LabelResource, h.Resource)
	add(livev1alpha1.LabelType, h.Type)
	add(livev1alpha1.LabelProject, h.Project)
	add(livev1alpha1.LabelUser, h.User)
	add(livev1alpha1.LabelPodNamespace, h.Pod.Namespace)
	add(livev1alpha1.LabelPodName, h.Pod.Name)
	return out
}

// Field selectors of leaseholders.
const (
	fieldName     = "metadata.name"
	fieldNS       = "metadata.namespace"
	fieldResource = "spec.resource"
	fieldType     = "spec.type"
	fieldProject  = "spec.project"
	fieldUser     = "spec.user"
	fieldPod      = "spec.pod"
	fieldTenant   = "spec.tenant"
)

// fieldCounterTenant selects leasecounters by tenant (the global level has none).
const fieldCounterTenant = livev1alpha1.FieldCounterTenant

func counterFields(c *livev1alpha1.LeaseCounter) fields.Set {
	return fields.Set{fieldName: c.Name, fieldNS: c.Namespace, fieldCounterTenant: c.Tenant}
}

func holderFields(h *livev1alpha1.LeaseHolder) fields.Set {
	return fields.Set{
		fieldName: h.Name, fieldNS: h.Namespace, fieldResource: h.Spec.Resource, fieldType: h.Spec.Type,
		fieldProject: h.Spec.Project, fieldUser: h.Spec.User, fieldPod: h.Spec.Pod, fieldTenant: h.Spec.Tenant,
	}
}

// listSelection is a list request turned into a store filter (the equalities the store can
// answer) plus the full selectors, applied again to each object.
type listSelection struct {
	filter leasestore.HolderFilter
	after  string
	labels labels.Selector
	fields fields.Selector
}

func (s listSelection) matches(h *livev1alpha1.LeaseHolder) bool {
	return s.matchesSpec(h.Labels, holderFields(h), h.Spec.Parts)
}

// matchesSpec applies the selectors to an object's labels and fields. An object of several
// resources (parts) is matched on its resource by each part, as the store's resource filter
// does: an equality, set inclusion or existence holds when it holds for one part's resource,
// an inequality, exclusion or absence when it holds for every part's. So
// `resource=licence` finds the holder of gpu+licence and `resource!=gpu` leaves it out.
func (s listSelection) matchesSpec(labelSet map[string]string, fieldSet fields.Set, parts []livev1alpha1.LeasePart) bool {
	if len(parts) == 0 {
		return s.labels.Matches(labels.Set(labelSet)) && s.fields.Matches(fieldSet)
	}
	reqs, selectable := s.labels.Requirements()
	if !selectable {
		return false
	}
	for _, r := range reqs {
		if r.Key() != livev1alpha1.LabelResource {
			if !r.Matches(labels.Set(labelSet)) {
				return false
			}
			continue
		}
		negative := false
		switch r.Operator() {
		case selection.NotEquals, selection.NotIn, selection.DoesNotExist:
			negative = true
		}
		if !byParts(parts, negative, func(res string) bool {
			return r.Matches(labels.Set{livev1alpha1.LabelResource: res})
		}) {
			return false
		}
	}
	for _, r := range s.fields.Requirements() {
		negative := r.Operator == selection.NotEquals
		var ok bool
		if r.Field == fieldResource {
			ok = byParts(parts, negative, func(res string) bool { return (res == r.Value) != negative })
		} else {
			ok = (fieldSet[r.Field] == r.Value) != negative
		}
		if !ok {
			return false
		}
	}
	return true
}

// byParts is whether pass holds for one part's resource, or for every part's when every is
// set.
func byParts(parts []livev1alpha1.LeasePart, every bool, pass func(resource string) bool) bool {
	for _, p := range parts {
		if pass(p.Resource) != every {
			return !every
		}
	}
	return every
}

// holderSelection translates selectors. An unknown field is a 400, as Kubernetes answers.
func holderSelection(o *metainternalversion.ListOptions) (listSelection, error) {
	sel := listSelection{labels: labels.Everything(), fields: fields.Everything()}
	if o == nil {
		return sel, nil
	}
	if o.LabelSelector != nil {
		sel.labels = o.LabelSelector
		reqs, _ := o.LabelSelector.Requirements()
		for _, r := range reqs {
			v, ok := equality(r.Operator(), r.Values().List())
			if !ok {
				continue
			}
			setFilter(&sel.filter, map[string]string{
				livev1alpha1.LabelResource: fieldResource, livev1alpha1.LabelType: fieldType,
				livev1alpha1.LabelProject: fieldProject, livev1alpha1.LabelUser: fieldUser,
			}[r.Key()], v)
		}
	}
	if o.FieldSelector != nil {
		sel.fields = o.FieldSelector
		for _, r := range o.FieldSelector.Requirements() {
			switch r.Field {
			case fieldName, fieldNS, fieldResource, fieldType, fieldProject, fieldUser, fieldPod, fieldTenant:
			default:
				return sel, apierrors.NewBadRequest("field label not supported: " + r.Field +
					" (leaseholders select on metadata.name, metadata.namespace, spec.resource, spec.type, spec.project, spec.user, spec.pod, spec.tenant)")
			}
			if r.Operator == selection.Equals || r.Operator == selection.DoubleEquals {
				setFilter(&sel.filter, r.Field, r.Value)
			}
		}
	}
	return sel, nil
}

func equality(op selection.Operator, values []string) (string, bool) {
	switch op {
	case selection.Equals, selection.DoubleEquals:
		return values[0], true
	case selection.In:
		if len(values) == 1 {
			return values[0], true
		}
	}
	return "", false
}

func setFilter(f *leasestore.HolderFilter, field, v string) {
	switch field {
	case fieldName:
		if lease.ValidHolderID(v) {
			f.ID = v
		}
	case fieldResource:
		f.Resource = v
	case fieldType:
		f.Type = v
	case fieldProject:
		f.Project = v
	case fieldUser:
		f.User = v
	case fieldPod:
		if strings.Contains(v, "/") {
			f.Pod = v
		}
	case fieldTenant:
		// Narrows the store's read (its tenant index). The namespace's tenant still decides
		// what a namespace shows: List never lets this widen it (see holderStorage.List).
		f.Tenant = v
	}
}

// continuePrefix versions the continue token: h2 carries the namespace the list was
// asked in and the last public holder ID of the page (h1 carried a token, and is refused).
const continuePrefix = "h2:"

// encodeContinue makes the continue token of a page that ended at holder ID after, in
// namespace ns ("" for all namespaces). It holds no token, only an ID the same request
// showed or could have shown (the store was asked for that namespace's holders only).
func encodeContinue(after, ns string) string {
	return base64.RawURLEncoding.EncodeToString([]byte(continuePrefix + ns + "/" + after))
}

// decodeContinue reads a continue token of encodeContinue, refusing one made in another
// namespace.
func decodeContinue(s, ns string) (string, error) {
	bad := apierrors.NewBadRequest("invalid continue token; start the list again without it")
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil {
		return "", bad
	}
	rest, ok := strings.CutPrefix(string(b), continuePrefix)
	if !ok {
		return "", bad
	}
	gotNS, after, ok := strings.Cut(rest, "/")
	if !ok || gotNS != ns || !lease.ValidHolderID(after) {
		return "", bad
	}
	return after, nil
}

// counterName is a counter's object name: <resource>.<level>[.<scope>], '/' in the scope
// written ':' (IDs contain no ':'; a name cannot contain '/').
func counterName(c lease.Counter) string {
	if c.Level == lease.LevelGlobal {
		return c.Resource + "." + string(c.Level)
	}
	return c.Resource + "." + string(c.Level) + "." + strings.ReplaceAll(c.Scope, "/", ":")
}

func counterObject(c lease.Counter, ns string) livev1alpha1.LeaseCounter {
	return livev1alpha1.LeaseCounter{
		TypeMeta: metav1.TypeMeta{APIVersion: livev1alpha1.GroupVersion.String(), Kind: "LeaseCounter"},
		ObjectMeta: metav1.ObjectMeta{
			Name:      counterName(c),
			Namespace: ns,
			Labels: map[string]string{
				livev1alpha1.LabelResource: c.Resource,
				livev1alpha1.LabelLevel:    string(c.Level),
			},
		},
		Resource:  c.Resource,
		Level:     string(c.Level),
		Scope:     c.Scope,
		Tenant:    counterTenant(c),
		Key:       c.Key,
		Count:     int64(c.Count),
		Booked:    int64(c.Booked),
		Drift:     c.Drift(),
		Holders:   c.Holders,
		Gone:      c.Gone,
		Waiting:   int64(c.Waiting),
		Borrowed:  int64(c.Borrowed),
		UpdatedAt: metav1.NewTime(c.UpdatedAt),
	}
}
