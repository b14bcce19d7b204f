package main

import (
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/vancetope/lease-operator/internal/testutil/testenv"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// TestEnsureInternalSecret: the path every shipped install takes (no --internal-secret).
// Replicas starting together agree on one secret, a restart reads it back, and a Secret
// without a usable key stops the manager with a message that names it.
func TestEnsureInternalSecret(t *testing.T) {
	env, err := testenv.Start(testenv.AssetsOrSkip(t), testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Stop() })
	ctx := t.Context()
	namespace := func(name string) string {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}); err != nil {
			t.Fatal(err)
		}
		return name
	}
	ns := namespace("secret")

	// Three replicas at once: one creates, the others read what it created.
	got := make([]string, 3)
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range got {
		wg.Go(func() { got[i], errs[i] = ensureInternalSecret(ctx, env.Config, ns) })
	}
	waitfor.Group(t, &wg, "three replicas to ensure the internal secret")
	for i := range got {
		if errs[i] != nil {
			t.Fatalf("replica %d: %v", i, errs[i])
		}
		if len(got[i]) < 16 || got[i] != got[0] {
			t.Fatalf("replicas disagree or the secret is short: %q", got)
		}
	}
	again, err := ensureInternalSecret(ctx, env.Config, ns)
	if err != nil || again != got[0] {
		t.Fatalf("after a restart: %q, %v; want %q", again, err, got[0])
	}

	bad := namespace("badsecret")
	if err := env.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: bad, Name: InternalSecretName},
		Data: map[string][]byte{internalSecretKey: []byte("short")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ensureInternalSecret(ctx, env.Config, bad); err == nil || !strings.Contains(err.Error(), InternalSecretName) {
		t.Fatalf("a Secret with a short key: %v, want an error naming it", err)
	}
}
