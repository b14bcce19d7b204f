package kwoktest

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corev1listers "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/util/workqueue"
	logf "sigs.k8s.io/controller-runtime/pkg/log"
)

// unscheduled selects the pods without a node: the ones the binder places.
const unscheduled = "spec.nodeName="

// runBinder binds every pod without a node to node until ctx ends: the whole of scheduling on
// a control plane with one node and no kube-scheduler. It posts the same Binding a scheduler
// posts (pods/binding, with the pod's UID as precondition), so the API server sets
// spec.nodeName and the PodScheduled condition as in a cluster. Taints, resources, affinity
// and schedulerName are not looked at: there is one node, and it takes everything.
//
// Building kube-scheduler instead, as hack/envtest-bins.sh builds kube-apiserver, would cost
// minutes of build per Kubernetes version and seconds of start per suite, for decisions that
// one node makes moot.
func runBinder(ctx context.Context, cs kubernetes.Interface, node string) {
	log := logf.FromContext(ctx).WithName("kwoktest-binder")
	factory := informers.NewSharedInformerFactoryWithOptions(cs, 0,
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.FieldSelector = unscheduled }))
	pods := factory.Core().V1().Pods()
	queue := workqueue.NewTypedRateLimitingQueue(workqueue.DefaultTypedControllerRateLimiter[cache.ObjectName]())
	enqueue := func(obj any) {
		if pod, ok := obj.(*corev1.Pod); ok && pod.Spec.NodeName == "" && pod.DeletionTimestamp == nil {
			queue.Add(cache.MetaObjectToName(pod))
		}
	}
	if _, err := pods.Informer().AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
	}); err != nil {
		log.Error(err, "Cannot watch pods; nothing will be bound")
		return
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	go func() {
		<-ctx.Done()
		queue.ShutDown()
	}()
	lister := pods.Lister()
	for {
		key, shutdown := queue.Get()
		if shutdown {
			return
		}
		err := bind(ctx, cs, lister, key, node)
		if err != nil && ctx.Err() == nil {
			log.Error(err, "Binding a pod; retrying", "pod", key.String())
			queue.AddRateLimited(key)
		} else {
			queue.Forget(key)
		}
		queue.Done(key)
	}
}

// ours reports whether a scheduler would place pod now, as kube-scheduler decides: pods that
// name the default scheduler (another scheduler's pods are left alone; the suites make pods
// they run by hand that way) and carry no scheduling gate (a gate's owner removes it first;
// its removal is an update, which enqueues the pod again).
func ours(pod *corev1.Pod) bool {
	return (pod.Spec.SchedulerName == "" || pod.Spec.SchedulerName == corev1.DefaultSchedulerName) &&
		len(pod.Spec.SchedulingGates) == 0
}

// bind posts the Binding of the pod key to node, unless it is gone, bound, being deleted,
// gated or another scheduler's.
func bind(ctx context.Context, cs kubernetes.Interface, lister corev1listers.PodLister, key cache.ObjectName, node string) error {
	pod, err := lister.Pods(key.Namespace).Get(key.Name)
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		return err
	}
	if pod.Spec.NodeName != "" || pod.DeletionTimestamp != nil || !ours(pod) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	err = cs.CoreV1().Pods(pod.Namespace).Bind(ctx, &corev1.Binding{
		ObjectMeta: metav1.ObjectMeta{Namespace: pod.Namespace, Name: pod.Name, UID: pod.UID},
		Target:     corev1.ObjectReference{Kind: "Node", Name: node},
	}, metav1.CreateOptions{})
	switch {
	case err == nil, apierrors.IsNotFound(err):
		return nil
	case apierrors.IsConflict(err):
		// Bound meanwhile (the field selector's watch tells of it a moment later), or a new
		// pod of the same name, which has its own event.
		return nil
	default:
		return fmt.Errorf("binding %s to %s: %w", key, node, err)
	}
}
