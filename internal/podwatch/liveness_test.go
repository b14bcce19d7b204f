package podwatch

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestLiveness(t *testing.T) {
	now := time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)
	holder := lease.PodRef{Namespace: "ns", Name: "app-0", UID: "uid-1"}
	self := lease.PodRef{Namespace: "ops", Name: "manager-abc", UID: "uid-m"}
	pod := func(mut ...func(*corev1.Pod)) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "app-0", UID: types.UID("uid-1")},
			Status:     corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7"},
		}
		for _, m := range mut {
			m(p)
		}
		return p
	}
	deleting := func(at time.Time) func(*corev1.Pod) {
		return func(p *corev1.Pod) { p.DeletionTimestamp = &metav1.Time{Time: at} }
	}
	type want struct {
		Reason string
		Alive  bool
	}
	cases := map[string]struct {
		holder lease.PodRef
		self   lease.PodRef
		pod    *corev1.Pod
		want   want
	}{
		"running with recorded UID and IP": {holder, self, pod(), want{liveness.ReasonRunning, true}},
		"pending without IP (not started)": {holder, self, pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodPending; p.Status.PodIP = "" }), want{liveness.ReasonPending, true}},
		"running without IP (torn down)":   {holder, self, pod(func(p *corev1.Pod) { p.Status.PodIP = "" }), want{liveness.ReasonNoEndpoint, false}},
		"pending, deletion overdue": {holder, self, pod(func(p *corev1.Pod) {
			p.Status.Phase, p.Status.PodIP = corev1.PodPending, ""
			p.DeletionTimestamp = &metav1.Time{Time: now.Add(-time.Second)}
		}), want{liveness.ReasonDeletionOverdue, false}},
		"running, IP only in podIPs": {holder, self, pod(func(p *corev1.Pod) {
			p.Status.PodIP = ""
			p.Status.PodIPs = []corev1.PodIP{{IP: "fd00::7"}}
		}), want{liveness.ReasonRunning, true}},
		"missing (deleted)":                      {holder, self, nil, want{liveness.ReasonNotFound, false}},
		"recreated under the same name":          {holder, self, pod(func(p *corev1.Pod) { p.UID = "uid-2" }), want{liveness.ReasonUIDMismatch, false}},
		"succeeded":                              {holder, self, pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodSucceeded }), want{liveness.ReasonFinished, false}},
		"failed, IP still recorded":              {holder, self, pod(func(p *corev1.Pod) { p.Status.Phase = corev1.PodFailed }), want{liveness.ReasonFinished, false}},
		"terminating within its grace period":    {holder, self, pod(deleting(now.Add(10 * time.Second))), want{liveness.ReasonRunning, true}},
		"terminating past its deletion deadline": {holder, self, pod(deleting(now.Add(-time.Second))), want{liveness.ReasonDeletionOverdue, false}},
		"terminating exactly at the deadline":    {holder, self, pod(deleting(now)), want{liveness.ReasonDeletionOverdue, false}},
		"recorded UID empty matches any UID":     {lease.PodRef{Namespace: "ns", Name: "app-0"}, self, pod(func(p *corev1.Pod) { p.UID = "uid-9" }), want{liveness.ReasonRunning, true}},
		"no pod recorded":                        {lease.PodRef{}, self, nil, want{liveness.ReasonNoPod, false}},
		"self, although the cache has nothing":   {self, self, nil, want{liveness.ReasonSelf, true}},
		"self, although the cache says finished": {self, self, pod(func(p *corev1.Pod) {
			p.Namespace, p.Name, p.UID = "ops", "manager-abc", "uid-m"
			p.Status.Phase = corev1.PodFailed
		}), want{liveness.ReasonSelf, true}},
		"self without a known UID":                   {self, lease.PodRef{Namespace: "ops", Name: "manager-abc"}, nil, want{liveness.ReasonSelf, true}},
		"previous incarnation of our own name":       {lease.PodRef{Namespace: "ops", Name: "manager-abc", UID: "uid-old"}, self, nil, want{liveness.ReasonNotFound, false}},
		"same name in another namespace is not self": {lease.PodRef{Namespace: "other", Name: "manager-abc", UID: "uid-m"}, self, nil, want{liveness.ReasonNotFound, false}},
		"no self configured":                         {holder, lease.PodRef{}, pod(), want{liveness.ReasonRunning, true}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			reason, alive := Liveness(tc.holder, tc.self, tc.pod, now)
			if diff := cmp.Diff(tc.want, want{reason, alive}); diff != "" {
				t.Errorf("Liveness (-want +got):\n%s", diff)
			}
		})
	}
}

func TestStripPod(t *testing.T) {
	del := metav1.NewTime(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	in := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "app-0", UID: "uid-1", ResourceVersion: "42",
			DeletionTimestamp: &del,
			Labels:            map[string]string{"app": "x", "lease.vancetope.io/agent": "true"},
			Annotations:       map[string]string{"big": "yes"},
			ManagedFields:     []metav1.ManagedFieldsEntry{{Manager: "kubectl"}},
		},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
		Status: corev1.PodStatus{
			Phase: corev1.PodRunning, PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}, {IP: "fd00::7"}},
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
		},
	}
	want := &corev1.Pod{
		TypeMeta: metav1.TypeMeta{Kind: "Pod", APIVersion: "v1"},
		ObjectMeta: metav1.ObjectMeta{
			Namespace: "ns", Name: "app-0", UID: "uid-1", ResourceVersion: "42",
			DeletionTimestamp: &del,
			Labels:            map[string]string{"lease.vancetope.io/agent": "true"},
		},
		Spec:   corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}, {IP: "fd00::7"}}},
	}
	got, err := StripPod(in)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("StripPod (-want +got):\n%s", diff)
	}
	other := &corev1.Node{}
	if got, _ := StripPod(other); got != other {
		t.Errorf("StripPod changed a non-pod object")
	}
}

func TestPodIPIndex(t *testing.T) {
	cases := map[string]struct {
		pod  *corev1.Pod
		want []string
	}{
		"none":       {&corev1.Pod{}, nil},
		"v4":         {&corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}}}}, []string{"10.0.0.7"}},
		"dual stack": {&corev1.Pod{Status: corev1.PodStatus{PodIP: "10.0.0.7", PodIPs: []corev1.PodIP{{IP: "10.0.0.7"}, {IP: "FD00::7"}}}}, []string{"10.0.0.7", "fd00::7"}},
		"garbage":    {&corev1.Pod{Status: corev1.PodStatus{PodIP: "not-an-ip"}}, nil},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, podIPs(tc.pod)); diff != "" {
				t.Errorf("podIPs (-want +got):\n%s", diff)
			}
		})
	}
	for in, want := range map[string]string{"10.0.0.7": "10.0.0.7", "::ffff:10.0.0.7": "10.0.0.7", "fe80::1%eth0": "fe80::1"} {
		if got, ok := normalizeIP(in); !ok || got != want {
			t.Errorf("normalizeIP(%q) = %q, %v; want %q", in, got, ok, want)
		}
	}
}
