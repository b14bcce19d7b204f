package liveapi_test

import (
	"errors"
	"slices"
	"testing"

	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/vancetope/lease-operator/internal/lease"
)

func action(kind string, fields map[string]any) *unstructured.Unstructured {
	obj := map[string]any{
		"apiVersion": "live.lease.vancetope.io/v1alpha1", "kind": kind,
		"metadata": map[string]any{"generateName": "test-"},
	}
	for k, v := range fields {
		obj[k] = v
	}
	return &unstructured.Unstructured{Object: obj}
}

// TestOperatorActions: revoking a pod's holders and a reconcile are API calls that RBAC
// grants to the operator only, and only in the system namespace.
func TestOperatorActions(t *testing.T) {
	h := acquire(t, "globex", "act", "u1")
	before := promtestutil.ToFloat64(reaps.Reap.WithLabelValues("revoke"))
	req := action("PodRevocation", map[string]any{"podNamespace": self.Namespace, "podName": "no-such-pod"})

	if _, err := client(t, alice).Resource(podRevGVR).Namespace(nsAcme).Create(ctxT(t), req, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("alice creates a podrevocation in acme: err = %v, want Forbidden", err)
	}
	if _, err := client(t, operator).Resource(podRevGVR).Namespace(nsAcme).Create(ctxT(t), req, metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("operator creates a podrevocation outside the system namespace: err = %v, want Forbidden", err)
	}
	got, err := client(t, operator).Resource(podRevGVR).Namespace(systemNS).Create(ctxT(t), req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("operator revokes a pod without holders: %v", err)
	}
	if revoked, _, _ := unstructured.NestedStringSlice(got.Object, "revoked"); len(revoked) != 0 {
		t.Errorf("revoked %v for a pod without holders", revoked)
	}
	if err := store.Touch(ctxT(t), h.Token); err != nil {
		t.Fatalf("holder of another pod after the revocation: %v", err)
	}

	// The manager's own pod holds h (and whatever other tests hold at the moment): all go.
	req = action("PodRevocation", map[string]any{"podNamespace": self.Namespace, "podName": self.Name})
	got, err = client(t, operator).Resource(podRevGVR).Namespace(systemNS).Create(ctxT(t), req, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("operator revokes the manager pod's holders: %v", err)
	}
	revoked, _, _ := unstructured.NestedStringSlice(got.Object, "revoked")
	if !slices.Contains(revoked, h.ID) {
		t.Errorf("revoked %v, want it to contain %s", revoked, h.ID)
	}
	if err := store.Touch(ctxT(t), h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("check after revoke-pod: %v, want ErrLost", err)
	}
	if moved := promtestutil.ToFloat64(reaps.Reap.WithLabelValues("revoke")) - before; moved != float64(len(revoked)) {
		t.Errorf("reap{revoke} moved by %v, want %d", moved, len(revoked))
	}

	got, err = client(t, operator).Resource(reconGVR).Namespace(systemNS).Create(ctxT(t), action("Reconcile", nil), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("operator reconciles: %v", err)
	}
	if _, found, _ := unstructured.NestedMap(got.Object, "result"); !found {
		t.Errorf("reconcile answered without a result: %v", got.Object)
	}
	if _, err := client(t, bob).Resource(reconGVR).Namespace(systemNS).Create(ctxT(t), action("Reconcile", nil), metav1.CreateOptions{}); !apierrors.IsForbidden(err) {
		t.Errorf("bob reconciles: err = %v, want Forbidden", err)
	}
	// This server has no sweeper: the answer says so instead of pretending.
	_, err = client(t, operator).Resource(sweepsGVR).Namespace(systemNS).Create(ctxT(t), action("Sweep", nil), metav1.CreateOptions{})
	if !apierrors.IsServiceUnavailable(err) {
		t.Errorf("sweep without a sweeper: err = %v, want ServiceUnavailable", err)
	}
}
