package controller

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
)

// verdict is what the definition package decided about one object.
type verdict struct {
	// source names the object in the definition package's messages (k8ssource.SourceName).
	source string
	// notPermitted is set when the object's namespace may not hold its layer (the message of
	// k8stenancy.Permits); the object then takes part in nothing.
	notPermitted string
	// ignored are the fields the object sets that its layer does not own.
	ignored []definition.Field
	// layerErr is set when the object is invalid or in conflict (definition.CheckLayer).
	layerErr error
	// result is the merged definition at the object's scope, unless resolveErr is set.
	result     definition.Result
	resolveErr error
}

// capNotPermitted reports whether the resolution failed because this object would raise a cap of its resource, or move a lease
// with operator settings (definition.Bound).
func (v verdict) capNotPermitted() bool {
	var ue *definition.UnavailableError
	return errors.Is(v.resolveErr, definition.ErrCapNotPermitted) && errors.As(v.resolveErr, &ue) && ue.Source == v.source
}

// buildStatus turns a verdict into the object's status. prev supplies the conditions whose
// transition times are kept when their status does not change.
func buildStatus(generation int64, prev leasev1alpha1.LeaseDefinitionStatus, v verdict, now time.Time) leasev1alpha1.LeaseDefinitionStatus {
	status := leasev1alpha1.LeaseDefinitionStatus{
		ObservedGeneration: generation,
		Conditions:         append([]metav1.Condition(nil), prev.Conditions...),
	}
	set := func(typ string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&status.Conditions, metav1.Condition{
			Type: typ, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: generation, LastTransitionTime: metav1.NewTime(now),
		})
	}

	switch {
	case v.notPermitted != "":
		set(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonNamespaceNotPermitted,
			v.notPermitted+"; this object takes part in no merge and no conflict")
	case errors.Is(v.layerErr, definition.ErrConflict):
		set(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonConflict,
			"Another LeaseDefinition has the same leaseName, tenant and project; the scopes that use them are unavailable until one is removed: "+v.layerErr.Error())
	case v.layerErr != nil:
		set(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonInvalid,
			"The definition is invalid; the scopes that use it are unavailable: "+oneLine(v.layerErr))
	case v.capNotPermitted():
		set(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonCapNotPermitted,
			"This definition would raise a cap the system layer sets for its resource, or move a lease with operator settings; the scopes that use it are unavailable: "+oneLine(v.resolveErr))
	case v.resolveErr != nil:
		set(leasev1alpha1.ConditionReady, metav1.ConditionFalse, leasev1alpha1.ReasonLayerUnavailable,
			"The merged definition at this scope is unavailable: "+oneLine(v.resolveErr))
	default:
		set(leasev1alpha1.ConditionReady, metav1.ConditionTrue, leasev1alpha1.ReasonResolved, describe(v.result.Definition))
		status.Effective = effective(v.result.Definition)
	}

	if len(v.ignored) > 0 {
		fields := make([]string, 0, len(v.ignored))
		for _, f := range v.ignored {
			fields = append(fields, string(f))
		}
		status.IgnoredFields = fields
		set(leasev1alpha1.ConditionFieldsIgnored, metav1.ConditionTrue, leasev1alpha1.ReasonFieldsNotOwned,
			fmt.Sprintf("Ignored because this layer does not own them: %s", strings.Join(fields, ", ")))
	} else {
		set(leasev1alpha1.ConditionFieldsIgnored, metav1.ConditionFalse, leasev1alpha1.ReasonAllFieldsOwned,
			"Every field set is owned by this layer")
	}
	return status
}

func readyCondition(s leasev1alpha1.LeaseDefinitionStatus) metav1.Condition {
	if c := meta.FindStatusCondition(s.Conditions, leasev1alpha1.ConditionReady); c != nil {
		return *c
	}
	return metav1.Condition{Type: leasev1alpha1.ConditionReady, Status: metav1.ConditionUnknown}
}

func effective(d definition.Definition) *leasev1alpha1.EffectiveDefinition {
	e := &leasev1alpha1.EffectiveDefinition{
		Resource:   d.Resource,
		TTLSeconds: int32(d.TTL / time.Second),
		WaitMs:     ptr.To(int32(d.Wait / time.Millisecond)),
		Fairness:   leasev1alpha1.Fairness(d.Fairness),
		NoOp:       d.NoOp(),

		MaxPriority:             int32(d.MaxPriority),
		PriorityAgeBoundSeconds: int32(d.PriorityAgeBound / time.Second),
	}
	if d.Borrowing.Enabled {
		e.Borrowing = &leasev1alpha1.EffectiveBorrowing{
			MaxBorrowed: int32(d.Borrowing.MaxBorrowed), GraceSeconds: int32(d.Borrowing.Grace / time.Second),
		}
	}
	if !d.NoOp() {
		e.Levels = &leasev1alpha1.LeaseLevels{
			Global: capPtr(d.Caps.Global), Tenant: capPtr(d.Caps.Tenant),
			Project: capPtr(d.Caps.Project), User: capPtr(d.Caps.User),
		}
	}
	return e
}

func capPtr(c int) *int32 {
	if c == 0 {
		return nil
	}
	v := int32(c)
	return &v
}

// describe summarises a merged definition for the Ready message.
func describe(d definition.Definition) string {
	if d.NoOp() {
		return fmt.Sprintf("Resolved: no level is capped, acquisitions are NOOP (resource %s)", d.Resource)
	}
	var caps []string
	for _, c := range []struct {
		level string
		v     int
	}{{"global", d.Caps.Global}, {"tenant", d.Caps.Tenant}, {"project", d.Caps.Project}, {"user", d.Caps.User}} {
		if c.v > 0 {
			caps = append(caps, fmt.Sprintf("%s %d", c.level, c.v))
		}
	}
	return fmt.Sprintf("Resolved: resource %s, caps %s, ttl %s, wait %s, fairness %s", d.Resource, strings.Join(caps, ", "), d.TTL, d.Wait, d.Fairness)
}

// oneLine joins a multi-line (errors.Join) message.
func oneLine(err error) string {
	return strings.ReplaceAll(err.Error(), "\n", "; ")
}
