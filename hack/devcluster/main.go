// Command devcluster runs a local Kubernetes control plane (envtest's kube-apiserver and
// etcd, no nodes) for `make run` on a machine without a cluster. It installs the CRDs from
// config/crd/bases, writes an admin kubeconfig and waits until interrupted. With
// --live-api-port the aggregation layer is on, the live API (docs/live-api.md) is
// registered at 127.0.0.1:PORT, where the manager serves it, and its ClusterRoles
// (config/rbac/live_*_role.yaml) are installed under the names a kustomize install gives
// them (config/default's namePrefix: lease-operator-live-viewer, ...), so that the README's
// RoleBindings work here too.
//
//	go run ./hack/devcluster --write-kubeconfig bin/dev.kubeconfig
//
// With --kwok, pods run: kwok (hack/kwok-bin.sh) plays the kubelet of one node and a binder
// places every pod on it (internal/testutil/kwoktest), so a pod becomes Running and Ready with
// an IP on loopback (127.1.0.x) that this host can send from (docs/operations.md#the-development-cluster).
//
// `devcluster await` (await.go) waits until a manager started against it is ready.
//
// With --webhooks config/webhook the manager's webhooks are installed, pointed at
// 127.0.0.1 (the manager serves them with the printed --webhook-port and --webhook-cert-dir):
// pods annotated for a lease are gated and admitted, pods annotated for injection get the
// agent. No container runs under kwok, so `devcluster agents` (agents.go) runs each injected
// pod's agent as a local process on the pod's address.
//
// KUBEBUILDER_ASSETS must name the directory with the binaries (hack/envtest-bins.sh).
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	sigsyaml "sigs.k8s.io/yaml"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
	"github.com/vancetope/lease-operator/internal/testutil/kwoktest"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "agents" {
		if err := runAgents(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "devcluster agents:", err)
			os.Exit(1)
		}
		return
	}
	if len(os.Args) > 1 && os.Args[1] == "await" {
		if err := runAwait(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "devcluster await:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "devcluster:", err)
		os.Exit(1)
	}
}

func run() error {
	kubeconfig := flag.String("write-kubeconfig", "bin/dev.kubeconfig", "where to write the admin kubeconfig")
	crds := flag.String("crds", filepath.Join("config", "crd", "bases"), "directory of CRD manifests to install")
	apply := flag.String("apply", "", "comma-separated directories of manifests to create once the control plane is up, in order (e.g. config/policy,config/samples)")
	livePort := flag.Int("live-api-port", 0, "register the live API served on 127.0.0.1:PORT (0: no aggregation)")
	system := flag.String("system-namespace", "lease-system", "namespace of the live API's Service (the manager's system namespace)")
	rbacDir := flag.String("rbac", filepath.Join("config", "rbac"), "directory of the live API's ClusterRoles (live_*_role.yaml), installed with --live-api-port")
	install := flag.String("kustomization", filepath.Join("config", "default", "kustomization.yaml"), "the install whose namePrefix the live API's ClusterRoles get")
	withKwok := flag.Bool("kwok", false, "make pods run: start kwok ($KWOK_BIN, else hack/kwok-bin.sh) with one node and bind every pod to it")
	kwokDir := flag.String("kwok-dir", "", "with --kwok: where kwok's log and kubeconfig go (default a temporary directory)")
	webhooks := flag.String("webhooks", "", "directory of webhook configurations (config/webhook) to install, pointed at a server on 127.0.0.1 whose port and certificates are printed (with --live-api-port)")
	flag.Parse()

	var (
		env *envtest.Environment
		cfg *rest.Config
	)
	if *livePort > 0 {
		agg, err := aggregatortest.StartWithWebhooks(*webhooks, *crds)
		if err != nil {
			return err
		}
		defer func() { _ = agg.Stop() }()
		env, cfg = agg.Env, agg.Config
		if err := aggregatortest.RegisterAPIService(context.Background(), cfg, livev1alpha1.GroupVersion, *system, *livePort); err != nil {
			return fmt.Errorf("registering the live API: %w", err)
		}
		if err := installLiveRoles(cfg, *rbacDir, *install); err != nil {
			return err
		}
	} else {
		env = &envtest.Environment{CRDDirectoryPaths: []string{*crds}, ErrorIfCRDPathMissing: true}
		var err error
		if cfg, err = env.Start(); err != nil {
			return fmt.Errorf("starting the control plane: %w", err)
		}
		defer func() { _ = env.Stop() }()
	}

	user, err := env.AddUser(envtest.User{Name: "dev-admin", Groups: []string{"system:masters"}}, cfg)
	if err != nil {
		return fmt.Errorf("adding the admin user: %w", err)
	}
	data, err := user.KubeConfig()
	if err != nil {
		return fmt.Errorf("rendering the kubeconfig: %w", err)
	}
	if err := os.WriteFile(*kubeconfig, data, 0o600); err != nil {
		return fmt.Errorf("writing %s: %w", *kubeconfig, err)
	}
	for _, dir := range strings.Split(*apply, ",") {
		if dir = strings.TrimSpace(dir); dir == "" {
			continue
		}
		if err := applyDir(cfg, dir); err != nil {
			return err
		}
	}
	if *withKwok {
		k, err := kwoktest.Start(context.Background(), cfg, kwoktest.Options{Dir: *kwokDir})
		if err != nil {
			return fmt.Errorf("starting kwok: %w", err)
		}
		defer func() { _ = k.Stop() }()
		fmt.Printf("devcluster kwok: node %s Ready in %v; pods run, with IPs from %s (kwok's log: %s)\n",
			k.NodeName, k.Startup.Round(time.Millisecond), k.PodCIDR, filepath.Join(k.Dir, "kwok.log"))
	}
	if wio := env.WebhookInstallOptions; *webhooks != "" {
		fmt.Printf("devcluster webhooks: --webhook-port %d --webhook-cert-dir %s\n", wio.LocalServingPort, wio.LocalServingCertDir)
	}
	fmt.Printf("devcluster ready: KUBECONFIG=%s (API server %s)\n", *kubeconfig, cfg.Host)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, os.Interrupt, syscall.SIGTERM)
	<-stop
	return nil
}

// applyDir creates every object of the YAML files in dir (kustomization files are skipped),
// Namespaces first; a namespaced object goes to the default namespace unless it names its own.
func applyDir(cfg *rest.Config, dir string) error {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return err
	}
	var objs []*unstructured.Unstructured
	for _, file := range files {
		if filepath.Base(file) == "kustomization.yaml" {
			continue
		}
		data, err := os.ReadFile(file)
		if err != nil {
			return err
		}
		dec := utilyaml.NewYAMLOrJSONDecoder(bytes.NewReader(data), 4096)
		for {
			var u unstructured.Unstructured
			if err := dec.Decode(&u.Object); err != nil {
				if errors.Is(err, io.EOF) {
					break
				}
				return fmt.Errorf("decoding %s: %w", file, err)
			}
			if len(u.Object) == 0 {
				continue
			}
			objs = append(objs, &u)
		}
	}
	// Namespaces before what lives in them.
	slices.SortStableFunc(objs, func(a, b *unstructured.Unstructured) int {
		return cmp.Compare(rank(a), rank(b))
	})
	for _, u := range objs {
		namespaced, err := c.IsObjectNamespaced(u)
		if err != nil {
			return fmt.Errorf("mapping %s %s: %w", u.GetKind(), u.GetName(), err)
		}
		if namespaced && u.GetNamespace() == "" {
			u.SetNamespace("default")
		}
		err = c.Create(context.Background(), u)
		if apierrors.IsAlreadyExists(err) && u.GetKind() == "Namespace" {
			// The live API's registration may have created the system namespace already;
			// the manifest's labels still apply.
			err = mergeLabels(c, u)
		}
		if err != nil {
			return fmt.Errorf("creating %s %s from %s: %w", u.GetKind(), u.GetName(), dir, err)
		}
	}
	return nil
}

// mergeLabels adds u's labels to the existing object of the same name.
func mergeLabels(c client.Client, u *unstructured.Unstructured) error {
	existing := &unstructured.Unstructured{}
	existing.SetGroupVersionKind(u.GroupVersionKind())
	if err := c.Get(context.Background(), client.ObjectKeyFromObject(u), existing); err != nil {
		return err
	}
	labels := existing.GetLabels()
	if labels == nil {
		labels = map[string]string{}
	}
	for k, v := range u.GetLabels() {
		labels[k] = v
	}
	existing.SetLabels(labels)
	return c.Update(context.Background(), existing)
}

func rank(u *unstructured.Unstructured) int {
	if u.GetKind() == "Namespace" {
		return 0
	}
	return 1
}

// installLiveRoles creates the live API's ClusterRoles of rbacDir named as the install of
// kustomization names them (its namePrefix), as `kubectl apply -k config/default` would.
// A cluster without a controller manager does not aggregate them into view and admin:
// here they are granted only by binding them.
func installLiveRoles(cfg *rest.Config, rbacDir, kustomization string) error {
	raw, err := os.ReadFile(kustomization)
	if err != nil {
		return fmt.Errorf("reading the name prefix: %w", err)
	}
	var k struct {
		NamePrefix string `json:"namePrefix"`
	}
	if err := sigsyaml.Unmarshal(raw, &k); err != nil {
		return fmt.Errorf("reading the name prefix from %s: %w", kustomization, err)
	}
	files, err := filepath.Glob(filepath.Join(rbacDir, "live_*_role.yaml"))
	if err != nil {
		return err
	}
	if len(files) == 0 {
		return fmt.Errorf("no live_*_role.yaml in %s", rbacDir)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return fmt.Errorf("creating a client: %w", err)
	}
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return err
		}
		var u unstructured.Unstructured
		if err := sigsyaml.Unmarshal(data, &u.Object); err != nil {
			return fmt.Errorf("decoding %s: %w", f, err)
		}
		if u.GetKind() != "ClusterRole" {
			return fmt.Errorf("%s is a %s, want a ClusterRole", f, u.GetKind())
		}
		u.SetName(k.NamePrefix + u.GetName())
		if err := c.Create(context.Background(), &u); err != nil {
			return fmt.Errorf("creating ClusterRole %s from %s: %w", u.GetName(), f, err)
		}
	}
	return nil
}
