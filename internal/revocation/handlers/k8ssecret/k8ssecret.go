// Package k8ssecret reads the Secrets of the mcp handler's session DELETE from the API
// server: the manager's side of handlers.SecretReader, kept apart so that the lease agent,
// which reads no Secret, links no Kubernetes client.
package k8ssecret

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/revocation/handlers"
)

// Reader is a handlers.SecretReader over a controller-runtime reader.
type Reader struct {
	Reader client.Reader
}

var _ handlers.SecretReader = Reader{}

// ReadSecret gets the data of the Secret namespace/name.
func (c Reader) ReadSecret(ctx context.Context, namespace, name string) (handlers.Secret, error) {
	s := &corev1.Secret{}
	if err := c.Reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, s); err != nil {
		return handlers.Secret{}, fmt.Errorf("reading secret %s/%s: %w", namespace, name, err)
	}
	return handlers.Secret{Labels: s.Labels, Data: s.Data}, nil
}
