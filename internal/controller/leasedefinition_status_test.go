package controller

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

func TestBuildStatus(t *testing.T) {
	earlier := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	now := earlier.Add(time.Hour)
	texDef := definition.Definition{Name: "tex", Resource: "tex", Caps: definition.Caps{Global: 6, Tenant: 3, Project: 1},
		TTL: 2 * time.Minute, Wait: 10 * time.Second, Fairness: definition.FairGlobal}
	ready := func(s metav1.ConditionStatus, reason, msg string, at time.Time) metav1.Condition {
		return metav1.Condition{Type: leasev1alpha1.ConditionReady, Status: s, Reason: reason, Message: msg,
			ObservedGeneration: 2, LastTransitionTime: metav1.NewTime(at)}
	}
	noneIgnored := func(at time.Time) metav1.Condition {
		return metav1.Condition{Type: leasev1alpha1.ConditionFieldsIgnored, Status: metav1.ConditionFalse,
			Reason: leasev1alpha1.ReasonAllFieldsOwned, Message: "Every field set is owned by this layer",
			ObservedGeneration: 2, LastTransitionTime: metav1.NewTime(at)}
	}
	resolvedMsg := "Resolved: resource tex, caps global 6, tenant 3, project 1, ttl 2m0s, wait 10s, fairness global"
	texEffective := &leasev1alpha1.EffectiveDefinition{Resource: "tex",
		Levels:     &leasev1alpha1.LeaseLevels{Global: ptr.To[int32](6), Tenant: ptr.To[int32](3), Project: ptr.To[int32](1)},
		TTLSeconds: 120, WaitMs: ptr.To[int32](10000), Fairness: leasev1alpha1.FairnessGlobal}

	cases := map[string]struct {
		prev leasev1alpha1.LeaseDefinitionStatus
		v    verdict
		want leasev1alpha1.LeaseDefinitionStatus
	}{
		"resolved": {
			v: verdict{result: definition.Result{Definition: texDef}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, Effective: texEffective,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, resolvedMsg, now), noneIgnored(now)}},
		},
		"an unchanged condition keeps its transition time": {
			prev: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 1,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, "old", earlier), noneIgnored(earlier)}},
			v: verdict{result: definition.Result{Definition: texDef}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, Effective: texEffective,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, resolvedMsg, earlier), noneIgnored(earlier)}},
		},
		"NOOP": {
			v: verdict{result: definition.Result{Definition: definition.Definition{Name: "x", Resource: "x", TTL: time.Minute, Fairness: definition.FairProcess}}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2,
				Effective: &leasev1alpha1.EffectiveDefinition{Resource: "x", TTLSeconds: 60, WaitMs: ptr.To[int32](0), Fairness: leasev1alpha1.FairnessProcess, NoOp: true},
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved,
					"Resolved: no level is capped, acquisitions are NOOP (resource x)", now), noneIgnored(now)}},
		},
		"conflict, with an ignored field": {
			v: verdict{ignored: []definition.Field{definition.FieldLevelsGlobal},
				layerErr: fmt.Errorf("%w: a, b", definition.ErrConflict)},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, IgnoredFields: []string{"levels.global"},
				Conditions: []metav1.Condition{
					ready(metav1.ConditionFalse, leasev1alpha1.ReasonConflict, "Another LeaseDefinition has the same leaseName, tenant and project; the scopes that use them are unavailable until one is removed: conflicting lease definitions: a, b", now),
					{Type: leasev1alpha1.ConditionFieldsIgnored, Status: metav1.ConditionTrue, Reason: leasev1alpha1.ReasonFieldsNotOwned,
						Message: "Ignored because this layer does not own them: levels.global", ObservedGeneration: 2, LastTransitionTime: metav1.NewTime(now)},
				}},
		},
		"invalid": {
			v: verdict{layerErr: errors.Join(&lease.InvalidError{Field: "levels.user", Detail: "cap must be at least 1, got 0"},
				&lease.InvalidError{Field: "waitMs", Detail: "must be between 0 and 600000, got -1"})},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2,
				Conditions: []metav1.Condition{ready(metav1.ConditionFalse, leasev1alpha1.ReasonInvalid,
					"The definition is invalid; the scopes that use it are unavailable: levels.user: cap must be at least 1, got 0; waitMs: must be between 0 and 600000, got -1", now),
					noneIgnored(now)}},
		},
		"namespace not permitted, with an ignored field": {
			prev: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, Effective: texEffective,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, resolvedMsg, earlier), noneIgnored(earlier)}},
			v: verdict{notPermitted: `Namespace "team-a" may not hold the system layer`, ignored: []definition.Field{definition.FieldLevelsGlobal}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, IgnoredFields: []string{"levels.global"},
				Conditions: []metav1.Condition{
					ready(metav1.ConditionFalse, leasev1alpha1.ReasonNamespaceNotPermitted,
						`Namespace "team-a" may not hold the system layer; this object takes part in no merge and no conflict`, now),
					{Type: leasev1alpha1.ConditionFieldsIgnored, Status: metav1.ConditionTrue, Reason: leasev1alpha1.ReasonFieldsNotOwned,
						Message: "Ignored because this layer does not own them: levels.global", ObservedGeneration: 2, LastTransitionTime: metav1.NewTime(now)},
				}},
		},
		"a wider layer is unavailable": {
			prev: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, Effective: texEffective,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, resolvedMsg, earlier), noneIgnored(earlier)}},
			v: verdict{resolveErr: &definition.UnavailableError{Name: "tex", Tenant: "a", Project: "p", Source: "system layer",
				Err: definition.ErrConflict}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2,
				Conditions: []metav1.Condition{ready(metav1.ConditionFalse, leasev1alpha1.ReasonLayerUnavailable,
					`The merged definition at this scope is unavailable: lease definition "tex" unavailable in a/p: system layer: conflicting lease definitions`, now),
					noneIgnored(earlier)}},
		},
		"this object raises a cap of its resource": {
			prev: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, Effective: texEffective,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, resolvedMsg, earlier), noneIgnored(earlier)}},
			v: verdict{source: "LeaseDefinition acme/browser", resolveErr: &definition.UnavailableError{Name: "browser", Tenant: "acme", Project: "_tenant",
				Source: "LeaseDefinition acme/browser", Err: fmt.Errorf("%w: resource \"tex\"", definition.ErrCapNotPermitted)}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2,
				Conditions: []metav1.Condition{ready(metav1.ConditionFalse, leasev1alpha1.ReasonCapNotPermitted,
					`This definition would raise a cap the system layer sets for its resource, or move a lease with operator settings; the scopes that use it are unavailable: lease definition "browser" unavailable in acme/_tenant: LeaseDefinition acme/browser: not permitted by the system layer: resource "tex"`, now),
					noneIgnored(earlier)}},
		},
		"another object raises a cap": {
			prev: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2, Effective: texEffective,
				Conditions: []metav1.Condition{ready(metav1.ConditionTrue, leasev1alpha1.ReasonResolved, resolvedMsg, earlier), noneIgnored(earlier)}},
			v: verdict{source: "LeaseDefinition acme/browser-web", resolveErr: &definition.UnavailableError{Name: "browser", Tenant: "acme", Project: "web",
				Source: "LeaseDefinition acme/browser", Err: fmt.Errorf("%w: resource \"tex\"", definition.ErrCapNotPermitted)}},
			want: leasev1alpha1.LeaseDefinitionStatus{ObservedGeneration: 2,
				Conditions: []metav1.Condition{ready(metav1.ConditionFalse, leasev1alpha1.ReasonLayerUnavailable,
					`The merged definition at this scope is unavailable: lease definition "browser" unavailable in acme/web: LeaseDefinition acme/browser: not permitted by the system layer: resource "tex"`, now),
					noneIgnored(earlier)}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := buildStatus(2, tc.prev, tc.v, now)
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("buildStatus() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}
