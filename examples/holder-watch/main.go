// Command holder-watch is an example controller that reacts to the live API's holders as
// they change, with a client-go informer (docs/live-api.md, "Watch"): it prints a line when
// a lease is granted (a holder becomes HELD), when a lease ends (released, revoked, reaped),
// and says so when the lease that ended held a borrowed slot, which a reclaim is the first to
// take back (docs/borrowing.md). A real controller would start a job on a grant or scale down
// on a reclaim where this one prints.
//
// It uses the kubeconfig's credentials: it sees what RBAC lets it list and watch.
//
//	holder-watch -n acme [-l live.lease.vancetope.io/resource=tex2pdf] [--kubeconfig FILE]
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "holder-watch:", err)
		os.Exit(1)
	}
}

func run() error {
	var namespace, selector, kubeconfig string
	flag.StringVar(&namespace, "n", "", "namespace to watch (empty: every namespace RBAC lets you watch)")
	flag.StringVar(&selector, "l", "", "label selector, e.g. live.lease.vancetope.io/resource=tex2pdf")
	flag.StringVar(&kubeconfig, "kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig (empty: in-cluster)")
	flag.Parse()

	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return err
	}
	client, err := dynamic.NewForConfig(cfg)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()

	// The informer lists, then watches from the list's resourceVersion, and lists again by
	// itself when the watch can no longer resume (a manager restart answers 410).
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client, 10*time.Minute, namespace,
		func(o *metav1.ListOptions) { o.LabelSelector = selector })
	informer := factory.ForResource(livev1alpha1.GroupVersion.WithResource(livev1alpha1.ResourceHolders)).Informer()
	if _, err := informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: func(obj any) { granted(nil, holderOf(obj)) },
		UpdateFunc: func(old, cur any) {
			granted(holderOf(old), holderOf(cur))
		},
		DeleteFunc: func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			if h := holderOf(obj); h != nil {
				ended(h)
			}
		},
	}); err != nil {
		return err
	}
	go informer.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), informer.HasSynced) {
		return fmt.Errorf("the informer did not sync: is the live API served (kubectl get lh)?")
	}
	fmt.Println("watching", describe(namespace, selector))
	<-ctx.Done()
	return nil
}

// granted reports a holder that is HELD now and was not before (a new holder, or one whose
// grant the informer saw while it still booked its levels).
func granted(old, cur *livev1alpha1.LeaseHolder) {
	if cur == nil || cur.Status.State != "HELD" || (old != nil && old.Status.State == "HELD") {
		return
	}
	borrowed := ""
	if cur.Status.Borrowed {
		borrowed = " (borrowed: the first to be reclaimed)"
	}
	fmt.Printf("granted %s/%s: %s for %s/%s, fence %d%s\n", cur.Namespace, cur.Name, cur.Spec.Resource,
		cur.Spec.Project, cur.Spec.User, cur.Status.Fence, borrowed)
}

// ended reports a holder that is gone: released by its caller, revoked, reaped, or reclaimed.
func ended(h *livev1alpha1.LeaseHolder) {
	how := "released, revoked or reaped"
	if h.Status.Borrowed {
		how = "released, or reclaimed for a tenant within its cap"
	}
	fmt.Printf("ended %s/%s: %s (%s)\n", h.Namespace, h.Name, h.Spec.Resource, how)
}

// holderOf reads an informer object as a LeaseHolder (nil if it is none).
func holderOf(obj any) *livev1alpha1.LeaseHolder {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return nil
	}
	var h livev1alpha1.LeaseHolder
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &h); err != nil {
		fmt.Fprintln(os.Stderr, "holder-watch: reading a holder:", err)
		return nil
	}
	return &h
}

func describe(namespace, selector string) string {
	s := "leaseholders in namespace " + namespace
	if namespace == "" {
		s = "leaseholders in every namespace"
	}
	if selector != "" {
		s += " with " + selector
	}
	return s
}
