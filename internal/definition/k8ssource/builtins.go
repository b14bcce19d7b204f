package k8ssource

import (
	"context"
	"fmt"
	"testing/fstest"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/definition"
)

// BuiltinsReadTimeout bounds the read of the built-in layer's ConfigMap.
const BuiltinsReadTimeout = 10 * time.Second

// LoadBuiltins loads the built-in layer from the ConfigMap key (one <name>.yaml entry per
// lease, like the files of --defaults-dir) on top of the compiled-in documents. The manager
// and every injected agent read the same ConfigMap, so that they resolve the same
// definitions (docs/tenancy.md). When the ConfigMap cannot be read, the result is
// definition.UnavailableBuiltins: every lease is unavailable in this process until it is
// restarted with the ConfigMap in place, never resolved without the layer.
func LoadBuiltins(ctx context.Context, reader client.Reader, key client.ObjectKey) *definition.Builtins {
	source := "built-in ConfigMap " + key.String()
	ctx, cancel := context.WithTimeout(ctx, BuiltinsReadTimeout)
	defer cancel()
	var cm corev1.ConfigMap
	if err := reader.Get(ctx, key, &cm); err != nil {
		return definition.UnavailableBuiltins(source, fmt.Errorf("reading: %w", err))
	}
	fsys := fstest.MapFS{}
	for name, data := range cm.Data {
		fsys[name] = &fstest.MapFile{Data: []byte(data)}
	}
	b, err := definition.LoadBuiltins(fsys)
	if err != nil {
		return definition.UnavailableBuiltins(source, err)
	}
	return b
}
