package liveapi

import (
	"context"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apiserver/pkg/registry/rest"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// Without a change feed (--live-watch-interval=0) every watchable resource answers 405 with
// what to do instead, before reading anything.
func TestWatchWithoutAFeedSaysSo(t *testing.T) {
	st := storages(Deps{Tenants: tenancy.Static{System: "lease-system"}})
	for _, res := range []string{livev1alpha1.ResourceHolders, livev1alpha1.ResourceWaiters, livev1alpha1.ResourceCounters} {
		_, err := st[res].(rest.Watcher).Watch(context.Background(), nil)
		if !apierrors.IsMethodNotSupported(err) || !strings.Contains(err.Error(), "--live-watch-interval=0") {
			t.Errorf("%s: watch without a feed: %v, want 405 naming the flag", res, err)
		}
	}
}
