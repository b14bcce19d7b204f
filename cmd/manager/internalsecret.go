package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// InternalSecretName is the Secret in the system namespace that holds the internal secret
// when --internal-secret is not given: created by the first replica that starts, read by
// the others (docs/security.md, "Forwarded revocations").
const InternalSecretName = "lease-internal-secret"

// internalSecretKey is the Secret's data key.
const internalSecretKey = "secret"

// ensureInternalSecret returns the internal secret stored in namespace, creating it with
// 32 random bytes when it does not exist yet. Unsigned revocations are never accepted, so a
// manager without a secret would refuse every forward; this gives every installation one.
func ensureInternalSecret(ctx context.Context, cfg *rest.Config, namespace string) (string, error) {
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return "", fmt.Errorf("internal secret: %w", err)
	}
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	key := client.ObjectKey{Namespace: namespace, Name: InternalSecretName}
	for range 3 {
		var s corev1.Secret
		err := c.Get(ctx, key, &s)
		if err == nil {
			if v := string(s.Data[internalSecretKey]); len(v) >= 16 {
				return v, nil
			}
			return "", fmt.Errorf("internal secret: Secret %s has no key %q of at least 16 bytes", key, internalSecretKey)
		}
		if !apierrors.IsNotFound(err) {
			return "", fmt.Errorf("internal secret: reading Secret %s: %w", key, err)
		}
		buf := make([]byte, 32)
		if _, err := rand.Read(buf); err != nil {
			return "", fmt.Errorf("internal secret: %w", err)
		}
		s = corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: InternalSecretName,
			Labels: map[string]string{"app.kubernetes.io/part-of": "lease-operator"}},
			Data: map[string][]byte{internalSecretKey: []byte(hex.EncodeToString(buf))}}
		err = c.Create(ctx, &s)
		if err == nil {
			return string(s.Data[internalSecretKey]), nil
		}
		if !apierrors.IsAlreadyExists(err) {
			return "", fmt.Errorf("internal secret: creating Secret %s: %w", key, err)
		}
		// another replica created it first: read theirs
	}
	return "", fmt.Errorf("internal secret: Secret %s could not be read or created", key)
}
