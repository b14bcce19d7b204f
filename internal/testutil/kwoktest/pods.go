package kwoktest

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/uuid"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Complete makes the running pod's containers finish: kwok's pod-complete stage turns a
// Running pod owned by a Job into Succeeded, its containers terminated with exit code 0.
// Complete gives the pod such an owner reference. No Job controller or garbage collector runs
// on the local control plane, so the Job it names need not exist. A pod created with a Job
// owner reference completes as soon as it runs.
func Complete(ctx context.Context, c client.Client, pod *corev1.Pod) error {
	orig := pod.DeepCopy()
	pod.OwnerReferences = append(pod.OwnerReferences, metav1.OwnerReference{
		APIVersion: "batch/v1", Kind: "Job", Name: pod.Name, UID: uuid.NewUUID(),
	})
	if err := c.Patch(ctx, pod, client.MergeFromWithOptions(orig, client.MergeFromWithOptimisticLock{})); err != nil {
		return fmt.Errorf("giving pod %s/%s a Job owner: %w", pod.Namespace, pod.Name, err)
	}
	return nil
}
