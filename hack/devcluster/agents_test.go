package main

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The local agent gets what the webhook wrote into its container, except what comes from a
// Secret (the store URI, which make run gives), and the pod's identity.
func TestAgentEnv(t *testing.T) {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "acme", Name: "tex", UID: "u-1"},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "lease-agent", Env: []corev1.EnvVar{
				{Name: "LEASE_MANAGER_URL", Value: "http://127.0.0.1:8082"},
				{Name: "LEASE_AGENT_KEY", Value: "k"},
				{Name: "MONGODB_URI", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{Key: "uri"}}},
				{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
			}}},
			Containers: []corev1.Container{{Name: "app", Env: []corev1.EnvVar{{Name: "APP", Value: "x"}}}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.1.0.7"},
	}
	got, err := agentEnv(pod, "mongodb://127.0.0.1:27017")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"LEASE_MANAGER_URL=http://127.0.0.1:8082", "LEASE_AGENT_KEY=k", "MONGODB_URI=mongodb://127.0.0.1:27017",
		"POD_NAMESPACE=acme", "POD_NAME=tex", "POD_UID=u-1", "POD_IP=127.1.0.7"}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("agentEnv (-want +got):\n%s", diff)
	}
	pod.Spec.InitContainers = nil
	if _, err := agentEnv(pod, ""); err == nil {
		t.Error("agentEnv of a pod without the agent container: no error")
	}
}

func TestAgentDue(t *testing.T) {
	now := metav1.Now()
	for name, c := range map[string]struct {
		status  corev1.PodStatus
		deleted bool
		want    bool
	}{
		"running with an address": {status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.1.0.1"}, want: true},
		"running, no address yet": {status: corev1.PodStatus{Phase: corev1.PodRunning}},
		"pending":                 {status: corev1.PodStatus{Phase: corev1.PodPending, PodIP: "127.1.0.1"}},
		"finished":                {status: corev1.PodStatus{Phase: corev1.PodSucceeded, PodIP: "127.1.0.1"}},
		"being deleted":           {status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: "127.1.0.1"}, deleted: true},
	} {
		pod := &corev1.Pod{Status: c.status}
		if c.deleted {
			pod.DeletionTimestamp = &now
		}
		if got := agentDue(pod); got != c.want {
			t.Errorf("%s: agentDue = %v, want %v", name, got, c.want)
		}
	}
}
