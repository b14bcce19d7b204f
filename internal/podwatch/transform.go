package podwatch

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// LabelPrefix is the prefix of the labels the cache keeps on a pod; all others are dropped.
const LabelPrefix = "lease.vancetope.io/"

// StripPod is the cache's TransformFunc for pods: it keeps only what liveness, the IP lookup
// and the operational views read (namespace, name, UID, resourceVersion, deletionTimestamp,
// the lease.vancetope.io/ labels, nodeName, hostNetwork, phase, podIP, podIPs) and drops the
// rest (specs, container statuses, annotations, managed fields), so that watching all pods
// of a big cluster stays cheap. Objects that are not pods pass unchanged.
func StripPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	var labels map[string]string
	for k, v := range pod.Labels {
		if strings.HasPrefix(k, LabelPrefix) {
			if labels == nil {
				labels = map[string]string{}
			}
			labels[k] = v
		}
	}
	var ips []corev1.PodIP
	if len(pod.Status.PodIPs) > 0 {
		ips = make([]corev1.PodIP, len(pod.Status.PodIPs))
		for i, ip := range pod.Status.PodIPs {
			ips[i] = corev1.PodIP{IP: ip.IP}
		}
	}
	return &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Namespace:         pod.Namespace,
			Name:              pod.Name,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			DeletionTimestamp: pod.DeletionTimestamp,
			Labels:            labels,
		},
		Spec: corev1.PodSpec{
			NodeName:    pod.Spec.NodeName,
			HostNetwork: pod.Spec.HostNetwork,
		},
		Status: corev1.PodStatus{
			Phase:  pod.Status.Phase,
			PodIP:  pod.Status.PodIP,
			PodIPs: ips,
		},
	}, nil
}
