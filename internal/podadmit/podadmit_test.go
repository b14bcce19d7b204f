package podadmit

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
)

func TestRequestOfLeases(t *testing.T) {
	cases := map[string]struct {
		value      string
		wantLease  string
		wantLeases []string
		wantErr    string
	}{
		"one lease, as before lists": {value: "gpu", wantLease: "gpu"},
		"none, as before lists":      {value: "none", wantLease: "none"},
		// A single name is the acquisition's to check, as it always was (the pod waits with
		// LeaseDefinitionError).
		"one invalid name, as before lists": {value: "Bad!", wantLease: "Bad!"},
		"two leases":                        {value: "gpu,licence", wantLeases: []string{"gpu", "licence"}},
		"spaces around the names":           {value: " licence , gpu", wantLeases: []string{"licence", "gpu"}},
		"eight leases":                      {value: "a,b,c,d,e,f,g,h", wantLeases: []string{"a", "b", "c", "d", "e", "f", "g", "h"}},
		"nine leases":                       {value: "a,b,c,d,e,f,g,h,i", wantErr: "names 9 leases, at most 8"},
		"a name twice":                      {value: "gpu,licence,gpu", wantErr: "names gpu twice"},
		"an invalid name":                   {value: "gpu,Bad!", wantErr: `"Bad!" is not a valid lease name`},
		"an empty name":                     {value: "gpu,,licence", wantErr: "has an empty lease name"},
		"a trailing comma":                  {value: "gpu,", wantErr: "has an empty lease name"},
		"none in a list":                    {value: "gpu,none", wantErr: `lists "none", which names no lease`},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "p", UID: "u",
				Annotations: map[string]string{AnnotationLease: tc.value}}}
			req, err := RequestOf(pod, "acme")
			if tc.wantErr != "" {
				var inv *lease.InvalidError
				if !errors.As(err, &inv) || inv.Field != AnnotationLease || !strings.Contains(inv.Detail, tc.wantErr) {
					t.Fatalf("RequestOf(%q) error = %v, want an invalid %s saying %q", tc.value, err, AnnotationLease, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("RequestOf(%q): %v", tc.value, err)
			}
			got := struct {
				Lease  string
				Leases []string
			}{req.Lease, req.Leases}
			want := struct {
				Lease  string
				Leases []string
			}{tc.wantLease, tc.wantLeases}
			if diff := cmp.Diff(want, got); diff != "" {
				t.Errorf("RequestOf(%q) (-want +got):\n%s", tc.value, diff)
			}
		})
	}
}

func TestAdmittedAnnotations(t *testing.T) {
	at := time.Date(2026, 12, 7, 18, 0, 0, 0, time.UTC)
	token := "tok-admitted"
	cases := map[string]struct {
		lease leasing.Lease
		names []string
		want  map[string]string
	}{
		"one lease": {
			lease: leasing.Lease{Token: token, Name: "gpu", Resource: "gpu", Fence: 7},
			want:  map[string]string{AnnotationAdmittedAt: "2026-12-07T18:00:00Z", AnnotationHolder: lease.HolderID(token), AnnotationFence: "7"},
		},
		"several leases: each fence, in the pod's order": {
			lease: leasing.Lease{Token: token, Name: "gpu+licence", Parts: []leasing.PartLease{
				{Name: "gpu", Resource: "gpu", Fence: 7}, {Name: "licence", Resource: "licence", Fence: 3}}},
			names: []string{"licence", "gpu"},
			want:  map[string]string{AnnotationAdmittedAt: "2026-12-07T18:00:00Z", AnnotationHolder: lease.HolderID(token), AnnotationFences: "licence=3,gpu=7"},
		},
		"several leases, one capping nothing": {
			lease: leasing.Lease{Token: token, Name: "gpu", Parts: []leasing.PartLease{{Name: "gpu", Resource: "gpu", Fence: 7}}},
			names: []string{"free", "gpu"},
			want:  map[string]string{AnnotationAdmittedAt: "2026-12-07T18:00:00Z", AnnotationHolder: lease.HolderID(token), AnnotationFences: "gpu=7"},
		},
		"several leases, none capping anything": {
			lease: leasing.Lease{NoOp: true},
			names: []string{"free", "open"},
			want:  map[string]string{AnnotationAdmittedAt: "2026-12-07T18:00:00Z"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, admittedAnnotations(tc.lease, tc.names, at)); diff != "" {
				t.Errorf("admittedAnnotations (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHeldFor(t *testing.T) {
	one := lease.Holder{LeaseName: "gpu", Resource: "gpu"}
	// The store keeps the parts in the order of their resources; LeaseName is the first's.
	two := lease.Holder{LeaseName: "gpu", Resource: "gpu", Parts: []lease.Part{
		{LeaseName: "gpu", Resource: "gpu", Fence: 4}, {LeaseName: "licence", Resource: "licence", Fence: 2}}}
	cases := map[string]struct {
		holder lease.Holder
		lease  string
		names  []string
		want   bool
	}{
		"one lease, its holder":                 {holder: one, lease: "gpu", want: true},
		"one lease, another lease's holder":     {holder: one, lease: "licence", want: false},
		"one lease, a holder of several":        {holder: two, lease: "gpu", want: false},
		"several, in the store's order":         {holder: two, names: []string{"gpu", "licence"}, want: true},
		"several, in another order":             {holder: two, names: []string{"licence", "gpu"}, want: true},
		"several, one capping nothing":          {holder: two, names: []string{"free", "licence", "gpu"}, want: true},
		"several, a part the pod does not list": {holder: two, names: []string{"gpu", "disk"}, want: false},
		"several, a holder of one of them":      {holder: one, names: []string{"gpu", "licence"}, want: false},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := heldFor(tc.holder, tc.lease, tc.names); got != tc.want {
				t.Errorf("heldFor(%s, %q, %v) = %v, want %v", tc.holder.LeaseNames(), tc.lease, tc.names, got, tc.want)
			}
		})
	}
}
