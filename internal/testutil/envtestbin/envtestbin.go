// Package envtestbin finds the envtest control-plane binaries for test suites.
package envtestbin

import (
	"fmt"
	"os"
	"path/filepath"
)

// VersionDir is the directory hack/envtest-bins.sh builds the control plane into, under
// ${XDG_CACHE_HOME:-~/.cache}/lease-operator/envtest. Keep it in step with the script.
const VersionDir = "k8s-1.37.2-etcd-3.6.16"

// AssetsDir returns $KUBEBUILDER_ASSETS if set, otherwise the cache directory of
// hack/envtest-bins.sh when it holds both binaries. The error says how to build them; suites
// skip with it (`make test` always sets KUBEBUILDER_ASSETS, building the binaries if needed).
func AssetsDir() (string, error) {
	if dir := os.Getenv("KUBEBUILDER_ASSETS"); dir != "" {
		return dir, nil
	}
	const hint = "run the tests with `make test`, or KUBEBUILDER_ASSETS=$(hack/envtest-bins.sh) go test ./..."
	cache, err := os.UserCacheDir()
	if err != nil {
		return "", fmt.Errorf("KUBEBUILDER_ASSETS is unset and there is no cache directory (%w); %s", err, hint)
	}
	dir := filepath.Join(cache, "lease-operator", "envtest", VersionDir)
	for _, bin := range []string{"kube-apiserver", "etcd"} {
		if _, err := os.Stat(filepath.Join(dir, bin)); err != nil {
			return "", fmt.Errorf("KUBEBUILDER_ASSETS is unset and %s has no %s; %s", dir, bin, hint)
		}
	}
	return dir, nil
}
