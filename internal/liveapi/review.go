package liveapi

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation/field"
	genericapirequest "k8s.io/apiserver/pkg/endpoints/request"
	"k8s.io/apiserver/pkg/registry/rest"

	"github.com/go-logr/logr"
	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// An acquisition review is the admission API's dry run (docs/api.md, "Dry run") for people:
// created in a tenant's namespace, it asks what an acquisition for that tenant would answer
// now, and the answer is its status. Like the operator's actions it is create-only and
// nothing is kept; unlike them it is created where the tenant's leases appear, so that the
// RBAC that shows a namespace's counters also lets one ask (docs/live-api.md, "Acquisition
// reviews").

// Reviewer answers what an acquisition would answer now, writing nothing
// (*leasing.Service).
type Reviewer interface {
	Review(ctx context.Context, req leasing.Request) (leasing.Lease, error)
}

var _ Reviewer = (*leasing.Service)(nil)

var reviewsResource = livev1alpha1.Resource(livev1alpha1.ResourceAcquisitionReviews)

const reviewKind = "LeaseAcquisitionReview"

// reviewStorage serves leaseacquisitionreviews: create only.
type reviewStorage action

var (
	_ rest.Creater              = (*reviewStorage)(nil) //nolint:misspell // the apiserver spells its interface so
	_ rest.SingularNameProvider = (*reviewStorage)(nil)
)

func (s *reviewStorage) New() runtime.Object     { return &livev1alpha1.LeaseAcquisitionReview{} }
func (s *reviewStorage) Destroy()                {}
func (s *reviewStorage) NamespaceScoped() bool   { return true }
func (s *reviewStorage) GetSingularName() string { return "leaseacquisitionreview" }

// Create runs the review. --dry-run=server changes nothing either: a review writes nothing.
func (s *reviewStorage) Create(ctx context.Context, obj runtime.Object, validate rest.ValidateObjectFunc, _ *metav1.CreateOptions) (runtime.Object, error) {
	if validate != nil {
		if err := validate(ctx, obj); err != nil {
			return nil, err
		}
	}
	in, ok := obj.(*livev1alpha1.LeaseAcquisitionReview)
	if !ok {
		return nil, apierrors.NewBadRequest(fmt.Sprintf("unexpected object %T", obj))
	}
	out := in.DeepCopy()
	out.Namespace = genericapirequest.NamespaceValue(ctx)
	out.Name = generatedName(out.ObjectMeta, s.deps)
	out.Status = livev1alpha1.LeaseAcquisitionReviewStatus{}
	if s.deps.Reviewer == nil {
		return nil, apierrors.NewServiceUnavailable("this manager serves no acquisition reviews")
	}
	tenant, err := reviewTenant(s.views.scopeOf(out.Namespace), out.Spec.Tenant)
	if err != nil {
		return nil, err
	}
	req := leasing.Request{Type: out.Spec.Type, Lease: out.Spec.Lease, Leases: out.Spec.Leases, Tenant: tenant,
		Project: out.Spec.Project, User: out.Spec.User}
	l, err := s.deps.Reviewer.Review(ctx, req)
	status, err := reviewStatus(l, err)
	if err != nil {
		var ue *definition.UnavailableError
		if errors.As(err, &ue) {
			// The cause (a definition's documents) goes to the log, as the admission API
			// keeps it out of its answer (docs/security.md).
			s.deps.Log.Error(err, "Acquisition review: the definition is unavailable", "namespace", out.Namespace, "name", out.Name)
		}
		return nil, reviewError(s.deps.Log, out, err)
	}
	status.Tenant = tenant
	out.Status = status
	return out, nil
}

// reviewTenant decides which tenant a review created in a namespace of scope sc asks for,
// from the tenant its spec names (empty: none). A tenant's namespace asks for its own
// tenant and for no other, as a pod of that namespace acquires (docs/tenancy.md); the system
// namespace asks for the tenant it names; any other namespace asks for none.
func reviewTenant(sc scope, named string) (string, error) {
	switch sc.kind {
	case scopeTenant:
		if named != "" && named != sc.tenant {
			return "", apierrors.NewForbidden(reviewsResource, "", fmt.Errorf(
				"namespace %q speaks for tenant %q: a review in it may not ask for tenant %q (create it in a namespace of that tenant, or in the system namespace)",
				sc.namespace, sc.tenant, named))
		}
		return sc.tenant, nil
	case scopeSystem:
		if named == "" {
			return "", apierrors.NewInvalid(livev1alpha1.GroupVersion.WithKind(reviewKind).GroupKind(), "",
				field.ErrorList{field.Required(field.NewPath("spec", "tenant"), "a review in the system namespace names the tenant it asks for")})
		}
		return named, nil
	}
	return "", apierrors.NewForbidden(reviewsResource, "", fmt.Errorf(
		"namespace %q speaks for no tenant (no %s label): create the review in a namespace of the tenant, or in the system namespace", sc.namespace, tenancy.TenantLabel))
}

// specFields are the fields of a review's spec, by the admission API's names for them, with
// their values as a refusal shows them. The service refuses a bad list of several leases
// (a name twice, two leases of one resource) under "leases": a field of the request, so a
// 422 naming spec.leases, not the definitions' error outcome.
var specFields = map[string]func(livev1alpha1.LeaseAcquisitionReviewSpec) any{
	"type":    func(s livev1alpha1.LeaseAcquisitionReviewSpec) any { return s.Type },
	"lease":   func(s livev1alpha1.LeaseAcquisitionReviewSpec) any { return s.Lease },
	"leases":  func(s livev1alpha1.LeaseAcquisitionReviewSpec) any { return s.Leases },
	"tenant":  func(s livev1alpha1.LeaseAcquisitionReviewSpec) any { return s.Tenant },
	"project": func(s livev1alpha1.LeaseAcquisitionReviewSpec) any { return s.Project },
	"user":    func(s livev1alpha1.LeaseAcquisitionReviewSpec) any { return s.User },
}

// reviewStatus turns the dry run's answer into a review's status: a grant, a NOOP, a full
// level, or a definition that cannot be used now (outcome error). Any other error is
// returned: the review could not be made (reviewError).
func reviewStatus(l leasing.Lease, err error) (livev1alpha1.LeaseAcquisitionReviewStatus, error) {
	var (
		busy *lease.BusyError
		ue   *definition.UnavailableError
		inv  *lease.InvalidError
	)
	switch {
	case err == nil && l.NoOp:
		return livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewNoOp,
			Message: "no lease applies (no reference, or a definition that caps no level): an acquisition succeeds without booking"}, nil
	case err == nil && l.Parts != nil:
		return grantedParts(l), nil
	case err == nil:
		return livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewGranted, Resource: l.Resource,
			Levels:  reviewLevels(l.Levels),
			Message: fmt.Sprintf("every capped level of resource %s has room now: an acquisition would be granted", l.Resource)}, nil
	case errors.As(err, &busy):
		return livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewBusy, Resource: busy.Resource,
			Busy:    busyLevel(busy),
			Message: busy.Error()}, nil
	case errors.As(err, &ue):
		return livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewError, Message: fmt.Sprintf(
			"%s: the definition of lease %q is unavailable (broken, in conflict, refused or unreadable); the Ready condition of its LeaseDefinitions says why",
			lease.ErrUnavailable, ue.Name)}, nil
	case errors.As(err, &inv) && specFields[inv.Field] == nil:
		// A field of the definition, not of the request: the lease's definition is what an
		// acquisition would be refused for.
		return livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewError,
			Message: fmt.Sprintf("%s: %v", lease.ErrInvalid, err)}, nil
	}
	return livev1alpha1.LeaseAcquisitionReviewStatus{}, err
}

// grantedParts is the status of a granted review of several leases: each part with the
// levels it would book, in the order of the resources, and the resources joined by "+" as
// a holder of several shows them (docs/live-api.md, "Group, resources, names").
func grantedParts(l leasing.Lease) livev1alpha1.LeaseAcquisitionReviewStatus {
	st := livev1alpha1.LeaseAcquisitionReviewStatus{Outcome: livev1alpha1.ReviewGranted}
	names, resources := make([]string, len(l.Parts)), make([]string, len(l.Parts))
	for i, p := range l.Parts {
		names[i], resources[i] = p.Name, p.Resource
		st.Parts = append(st.Parts, livev1alpha1.ReviewPart{Lease: p.Name, Resource: p.Resource, Levels: reviewLevels(p.Levels)})
	}
	st.Resource = strings.Join(resources, "+")
	st.Message = fmt.Sprintf("every capped level of resources %s has room now: an acquisition of leases %s would be granted, all of them together",
		strings.Join(resources, ", "), strings.Join(names, ", "))
	return st
}

// reviewLevels are the levels a grant would book, as a review shows them.
func reviewLevels(levels []leasing.LevelInfo) []livev1alpha1.ReviewLevel {
	var out []livev1alpha1.ReviewLevel
	for _, lv := range levels {
		out = append(out, livev1alpha1.ReviewLevel{Level: string(lv.Level), Scope: lv.Scope, Cap: int64(lv.Cap)})
	}
	return out
}

// reviewError answers a review that could not be made: a spec field the admission API
// refuses is 422 naming spec.<field>, a store that does not answer 503.
func reviewError(log logr.Logger, r *livev1alpha1.LeaseAcquisitionReview, err error) error {
	var inv *lease.InvalidError
	if errors.As(err, &inv) {
		var value any = ""
		if get := specFields[inv.Field]; get != nil {
			value = get(r.Spec)
		}
		return apierrors.NewInvalid(livev1alpha1.GroupVersion.WithKind(reviewKind).GroupKind(), r.Name,
			field.ErrorList{field.Invalid(field.NewPath("spec", inv.Field), value, inv.Detail)})
	}
	return storeError(log, "reviewing the acquisition", err)
}

// busyLevel is a review's diagnosis of the full level, with the position and the estimate
// when the dry run learnt them, and the full lease's name for a review of several.
func busyLevel(b *lease.BusyError) *livev1alpha1.ReviewBusyLevel {
	out := &livev1alpha1.ReviewBusyLevel{Lease: b.Lease, Level: string(b.Level), Scope: b.Scope, Count: int64(b.Count), Cap: int64(b.Cap)}
	if b.Explained {
		pos := int64(b.Position)
		out.Position, out.EstimatedWaitMs = &pos, b.EstimatedWait.Milliseconds()
	}
	return out
}
