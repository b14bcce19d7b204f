package liveapi

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// TestReviewStatus: what a review answers for each answer of the dry run.
func TestReviewStatus(t *testing.T) {
	broken := lease.Unavailable("resolving lease tex", &definition.UnavailableError{Name: "tex", Source: "lease-system/tex-a", Err: errors.New("two documents")})
	cases := map[string]struct {
		lease       leasing.Lease
		err         error
		wantOutcome string
		wantMessage string // a part of it
		wantErr     func(error) bool
	}{
		"granted": {lease: leasing.Lease{Resource: "tex2pdf", Levels: []leasing.LevelInfo{{Level: lease.LevelGlobal, Scope: "*", Cap: 6}}},
			wantOutcome: livev1alpha1.ReviewGranted, wantMessage: "would be granted"},
		"noop": {lease: leasing.Lease{NoOp: true}, wantOutcome: livev1alpha1.ReviewNoOp, wantMessage: "no lease applies"},
		"busy": {err: &lease.BusyError{Resource: "tex2pdf", Level: lease.LevelProject, Scope: "acme/p1", Count: 1, Cap: 1},
			wantOutcome: livev1alpha1.ReviewBusy, wantMessage: "full at level project"},
		"broken definition": {err: broken, wantOutcome: livev1alpha1.ReviewError,
			wantMessage: `the definition of lease "tex" is unavailable`},
		"invalid layer document": {err: &lease.InvalidError{Field: "ttlSeconds", Detail: "must be between 1 and 86400"},
			wantOutcome: livev1alpha1.ReviewError, wantMessage: "INVALID_REQUEST: ttlSeconds"},
		"invalid request field":  {err: &lease.InvalidError{Field: "user", Detail: "is required"}, wantErr: apierrors.IsInvalid},
		"invalid list of leases": {err: &lease.InvalidError{Field: "leases", Detail: "names gpu twice"}, wantErr: apierrors.IsInvalid},
		"store down":             {err: lease.Unavailable("probing tex2pdf", errors.New("no server")), wantErr: apierrors.IsServiceUnavailable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st, err := reviewStatus(tc.lease, tc.err)
			if tc.wantErr != nil {
				r := &livev1alpha1.LeaseAcquisitionReview{}
				if err == nil || !tc.wantErr(reviewError(logr.Discard(), r, err)) {
					t.Fatalf("reviewStatus = %+v, %v; want an error answered as wanted", st, err)
				}
				return
			}
			if err != nil || st.Outcome != tc.wantOutcome || !strings.Contains(st.Message, tc.wantMessage) {
				t.Errorf("reviewStatus = %+v, %v; want outcome %s saying %q", st, err, tc.wantOutcome, tc.wantMessage)
			}
			// The cause of a broken definition stays in the log.
			if strings.Contains(st.Message, "two documents") || strings.Contains(st.Message, "tex-a") {
				t.Errorf("message %q carries the definition's documents", st.Message)
			}
		})
	}
}

// TestReviewStatusJSON: a review's status as the wire carries it: a review of one lease
// exactly as before several leases could be reviewed at once (issue 45), one of several
// with its parts when granted and the full part's name when busy.
func TestReviewStatusJSON(t *testing.T) {
	global := []leasing.LevelInfo{{Level: lease.LevelGlobal, Scope: "*", Cap: 4}}
	cases := map[string]struct {
		lease leasing.Lease
		err   error
		want  string
	}{
		"granted, one lease": {lease: leasing.Lease{Name: "gpu", Resource: "gpu", Levels: global},
			want: `{"outcome":"granted","resource":"gpu","levels":[{"level":"global","scope":"*","cap":4}],` +
				`"message":"every capped level of resource gpu has room now: an acquisition would be granted"}`},
		"busy, one lease": {err: &lease.BusyError{Resource: "gpu", Level: lease.LevelGlobal, Scope: "*", Count: 4, Cap: 4, Explained: true},
			want: `{"outcome":"busy","resource":"gpu","busy":{"level":"global","scope":"*","count":4,"cap":4,"position":0},` +
				`"message":"LEASE_BUSY: resource gpu is full at level global (scope *): 4 of 4 in use, 0 waiting ahead"}`},
		"granted, two leases": {lease: leasing.Lease{Name: "gpu+licence", Parts: []leasing.PartLease{
			{Name: "gpu", Resource: "gpu", Levels: global},
			{Name: "licence", Resource: "licence", Levels: []leasing.LevelInfo{{Level: lease.LevelProject, Scope: "acme/thesis", Cap: 2}}}}},
			want: `{"outcome":"granted","resource":"gpu+licence","parts":[` +
				`{"lease":"gpu","resource":"gpu","levels":[{"level":"global","scope":"*","cap":4}]},` +
				`{"lease":"licence","resource":"licence","levels":[{"level":"project","scope":"acme/thesis","cap":2}]}],` +
				`"message":"every capped level of resources gpu, licence has room now: an acquisition of leases gpu, licence would be granted, all of them together"}`},
		"busy, two leases": {err: &lease.BusyError{Lease: "licence", Resource: "licence", Level: lease.LevelGlobal, Scope: "*", Count: 10, Cap: 10,
			Explained: true, Position: 3, EstimatedWait: 1500 * time.Millisecond},
			want: `{"outcome":"busy","resource":"licence",` +
				`"busy":{"lease":"licence","level":"global","scope":"*","count":10,"cap":10,"position":3,"estimatedWaitMs":1500},` +
				`"message":"LEASE_BUSY: resource licence is full at level global (scope *): 10 of 10 in use (part licence), 3 waiting ahead, a slot in about 1.5s"}`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			st, err := reviewStatus(tc.lease, tc.err)
			if err != nil {
				t.Fatal(err)
			}
			got, err := json.Marshal(st)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.want, string(got)); diff != "" {
				t.Errorf("status (-want +got):\n%s", diff)
			}
		})
	}
}

// TestReviewTenant: which tenant a review asks for, by the namespace it is created in.
func TestReviewTenant(t *testing.T) {
	cases := map[string]struct {
		sc      scope
		named   string
		want    string
		wantErr func(error) bool
	}{
		"tenant namespace":              {sc: scope{kind: scopeTenant, namespace: "acme", tenant: "acme"}, want: "acme"},
		"tenant namespace, own named":   {sc: scope{kind: scopeTenant, namespace: "acme-2", tenant: "acme"}, named: "acme", want: "acme"},
		"tenant namespace, other named": {sc: scope{kind: scopeTenant, namespace: "acme", tenant: "acme"}, named: "globex", wantErr: apierrors.IsForbidden},
		"system namespace":              {sc: scope{kind: scopeSystem, namespace: "lease-system"}, named: "globex", want: "globex"},
		"system namespace, none named":  {sc: scope{kind: scopeSystem, namespace: "lease-system"}, wantErr: apierrors.IsInvalid},
		"no tenant's namespace":         {sc: scope{kind: scopeNone, namespace: "default"}, named: "acme", wantErr: apierrors.IsForbidden},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := reviewTenant(tc.sc, tc.named)
			if tc.wantErr != nil {
				if !tc.wantErr(err) {
					t.Errorf("reviewTenant = %q, %v; want the refusal", got, err)
				}
				return
			}
			if diff := cmp.Diff(tc.want, got); diff != "" || err != nil {
				t.Errorf("reviewTenant (-want +got): %s %v", diff, err)
			}
		})
	}
}
