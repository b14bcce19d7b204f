// Package admitwatch samples the pods of a namespace while pod admission runs
// (docs/pod-admission.md): how many were admitted and unfinished at once at most, and the
// order in which they were admitted. The pod admission tests of internal/podadmit and
// test/e2e assert on it.
package admitwatch

import (
	"context"
	"slices"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/podadmit"
)

// Watch lists the pods of ns matching opts every few milliseconds until Stop.
type Watch struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	most     int
	admitted []string
}

// Start begins sampling with c.
func Start(c client.Reader, ns string, opts ...client.ListOption) *Watch {
	ctx, cancel := context.WithCancel(context.Background())
	w := &Watch{cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for ctx.Err() == nil {
			var list corev1.PodList
			if err := c.List(ctx, &list, append([]client.ListOption{client.InNamespace(ns)}, opts...)...); err == nil {
				w.sample(list.Items)
			}
			time.Sleep(5 * time.Millisecond) // real time: sampling the pods as they change
		}
	}()
	return w
}

func (w *Watch) sample(pods []corev1.Pod) {
	w.mu.Lock()
	defer w.mu.Unlock()
	open := 0
	for i := range pods {
		p := &pods[i]
		if podadmit.Gated(p) {
			continue
		}
		if !slices.Contains(w.admitted, p.Name) {
			w.admitted = append(w.admitted, p.Name)
		}
		if p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed {
			open++
		}
	}
	w.most = max(w.most, open)
}

// Stop ends the sampling and returns the most pods seen admitted and unfinished at once and
// the pods in the order they were first seen admitted.
func (w *Watch) Stop() (most int, admitted []string) {
	w.cancel()
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.most, slices.Clone(w.admitted)
}
