package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"slices"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/definition/k8ssource"
	"github.com/vancetope/lease-operator/internal/serving"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/tenancy/k8stenancy"
)

// tenancyFlags are the manager's settings of tenancy: the system namespace and the built-in
// layer's ConfigMap (docs/tenancy.md). Agents need neither: they ask the manager (deflink).
type tenancyFlags struct {
	systemNamespace  string
	builtinConfigMap string
}

func (t *tenancyFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&t.systemNamespace, "system-namespace", serving.EnvOr(settings.EnvSystemNamespace, os.Getenv(settings.EnvPodNamespace)),
		"Namespace whose LeaseDefinitions may hold the system layer (env "+settings.EnvSystemNamespace+"; default: this pod's namespace, POD_NAMESPACE).")
	fs.StringVar(&t.builtinConfigMap, "builtin-configmap", os.Getenv(settings.EnvBuiltinConfigMap),
		"ConfigMap in the system namespace whose <name>.yaml entries extend the compiled-in definitions (env "+settings.EnvBuiltinConfigMap+
			"). If it cannot be read, every lease is unavailable.")
}

// check rejects settings under which the system layer could never count.
func (t tenancyFlags) check(namespaces []string) error {
	if t.systemNamespace == "" {
		return errors.New("--system-namespace is required (or POD_NAMESPACE from the downward API)")
	}
	if len(namespaces) > 0 && !slices.Contains(namespaces, t.systemNamespace) {
		return fmt.Errorf("--namespaces %v must include the system namespace %q", namespaces, t.systemNamespace)
	}
	return nil
}

// +kubebuilder:rbac:groups="",resources=configmaps,verbs=get

// setupTenancy checks the settings and returns the namespace-to-tenant map over the
// informers of the process's cache. Call it before the cache starts.
func setupTenancy(ctx context.Context, informers cache.Informers, t tenancyFlags, namespaces []string) (*k8stenancy.Informed, error) {
	if err := t.check(namespaces); err != nil {
		return nil, err
	}
	tenants, err := k8stenancy.NewInformed(ctx, informers, t.systemNamespace)
	if err != nil {
		return nil, err
	}
	return tenants, nil
}

// loadBuiltins returns the built-in layer: compiled in, extended from --defaults-dir or from
// --builtin-configmap (read through reader, which must not be a cache that is not started
// yet). A ConfigMap that cannot be read makes every lease unavailable (fail closed).
func loadBuiltins(ctx context.Context, reader client.Reader, defaultsDir string, t tenancyFlags) (*definition.Builtins, error) {
	var (
		builtins *definition.Builtins
		err      error
	)
	switch {
	case defaultsDir != "" && t.builtinConfigMap != "":
		return nil, errors.New("--defaults-dir and --builtin-configmap are exclusive: give the built-in layer once")
	case t.builtinConfigMap != "":
		builtins = k8ssource.LoadBuiltins(ctx, reader, client.ObjectKey{Namespace: t.systemNamespace, Name: t.builtinConfigMap})
	case defaultsDir != "":
		builtins, err = definition.LoadBuiltins(os.DirFS(defaultsDir))
	default:
		builtins, err = definition.LoadBuiltins(nil)
	}
	if err != nil {
		return nil, fmt.Errorf("loading built-in definitions: %w", err)
	}
	for _, p := range builtins.Problems() {
		ctrl.Log.WithName("setup").Error(p, "Broken built-in definition: its lease is unavailable")
	}
	return builtins, nil
}

// newTenantResolver sets up tenancy on mgr's cache and returns the resolver over the built-in
// layer and the permitted LeaseDefinitions of the cache, with the tenant map it decides with.
func newTenantResolver(ctx context.Context, mgr manager.Manager, defaultsDir string, t tenancyFlags, namespaces []string) (*definition.Resolver, *k8stenancy.Informed, error) {
	tenants, err := setupTenancy(ctx, mgr.GetCache(), t, namespaces)
	if err != nil {
		return nil, nil, err
	}
	builtins, err := loadBuiltins(ctx, mgr.GetAPIReader(), defaultsDir, t)
	if err != nil {
		return nil, nil, err
	}
	return definition.NewResolver(builtins, k8ssource.New(mgr.GetCache(), tenants)), tenants, nil
}
