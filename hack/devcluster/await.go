package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"slices"
	"syscall"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

// `devcluster await` is how `make run` knows the manager is ready before it prints the
// lines to paste: the admission API answers, and (with --live) the live API's APIService is
// Available and the cluster's discovery, which kubectl reads, lists its resources. Until
// then kubectl answers `the server doesn't have a resource type "leaseholders"`.
//
//	devcluster await --admission http://127.0.0.1:8082 --kubeconfig bin/dev.kubeconfig --live --pid 1234

var apiServices = schema.GroupVersionResource{Group: "apiregistration.k8s.io", Version: "v1", Resource: "apiservices"}

func runAwait(args []string) error {
	fs := flag.NewFlagSet("devcluster await", flag.ContinueOnError)
	admission := fs.String("admission", "", "base URL of the admission API, e.g. http://127.0.0.1:8082 (required)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the cluster (required with --live)")
	live := fs.Bool("live", false, "also wait until the live API is Available and listed by discovery")
	pid := fs.Int("pid", 0, "give up as soon as this process (the manager) has exited")
	timeout := fs.Duration("timeout", 2*time.Minute, "give up after this long")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *admission == "" || (*live && *kubeconfig == "") {
		return errors.New("await: --admission is required, and --kubeconfig with --live")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()

	checks := []check{{what: "the admission API at " + *admission, ready: admissionAnswers(*admission)}}
	if *live {
		cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
		if err != nil {
			return fmt.Errorf("await: loading %s: %w", *kubeconfig, err)
		}
		apiService := livev1alpha1.GroupVersion.Version + "." + livev1alpha1.GroupVersion.Group
		checks = append(checks,
			check{what: "the APIService " + apiService, ready: apiServiceAvailable(cfg, apiService)},
			check{what: "the discovery of " + livev1alpha1.GroupVersion.String(), ready: discoveryLists(cfg, livev1alpha1.GroupVersion, livev1alpha1.ResourceHolders)})
	}
	for _, c := range checks {
		if err := c.wait(ctx, *pid); err != nil {
			return err
		}
	}
	return nil
}

// check is one condition of readiness; ready returns nil when it holds, else what it saw.
type check struct {
	what  string
	ready func(context.Context) error
}

func (c check) wait(ctx context.Context, pid int) error {
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		last := c.ready(ctx)
		if last == nil {
			return nil
		}
		if pid > 0 && syscall.Kill(pid, 0) != nil {
			return fmt.Errorf("the manager (pid %d) exited before %s was ready (last: %v)", pid, c.what, last)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s is not ready in time: %v", c.what, last)
		case <-tick.C:
		}
	}
}

func admissionAnswers(base string) func(context.Context) error {
	client := &http.Client{Timeout: 2 * time.Second}
	return func(ctx context.Context) error {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/openapi.json", nil)
		if err != nil {
			return err
		}
		resp, err := client.Do(req)
		if err != nil {
			return err
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("GET /openapi.json answered %s", resp.Status)
		}
		return nil
	}
}

// apiServiceAvailable holds when the APIService's Available condition is True; otherwise it
// reports the condition's reason and message (the aggregator's word on what fails).
func apiServiceAvailable(cfg *rest.Config, name string) func(context.Context) error {
	dyn, err := dynamic.NewForConfig(cfg)
	return func(ctx context.Context) error {
		if err != nil {
			return err
		}
		u, err := dyn.Resource(apiServices).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		conds, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
		for _, c := range conds {
			m, _ := c.(map[string]any)
			if m["type"] != "Available" {
				continue
			}
			if m["status"] == "True" {
				return nil
			}
			return fmt.Errorf("condition Available=%v: %v: %v", m["status"], m["reason"], m["message"])
		}
		return errors.New("no Available condition yet")
	}
}

// discoveryLists holds when the cluster's discovery, as kubectl reads it, lists resource in
// gv.
func discoveryLists(cfg *rest.Config, gv schema.GroupVersion, resource string) func(context.Context) error {
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	return func(context.Context) error {
		if err != nil {
			return err
		}
		_, lists, err := dc.ServerGroupsAndResources()
		for _, l := range lists {
			if l.GroupVersion != gv.String() {
				continue
			}
			if slices.ContainsFunc(l.APIResources, func(r metav1.APIResource) bool { return r.Name == resource }) {
				return nil
			}
		}
		if err != nil {
			return err
		}
		return fmt.Errorf("%s is not listed yet", resource)
	}
}
