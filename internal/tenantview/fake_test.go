package tenantview

import (
	"context"
	"slices"
	"sync"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
)

// fakeSource is an in-memory stand-in for the live API, for the handler tests that need no
// control plane (CSRF, Host, error pages). It answers like the API: one namespace's
// objects, 403 for a user without the verb, 404 for a missing holder. The tests of what a
// tenant sees and may revoke run against the real API (see ./browsertest).
type fakeSource struct {
	mu        sync.Mutex
	namespace string
	holders   []Holder
	counters  []Counter
	waiters   []Waiter
	canList   bool
	// listErr, when set, is what every list answers (e.g. the API not installed).
	listErr   error
	canDelete bool
	revoked   []string
}

var _ Source = (*fakeSource)(nil)

var holdersGR = HoldersResource.GroupResource()

func (f *fakeSource) ListHolders(_ context.Context, ns string) ([]Holder, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.listErr != nil {
		return nil, f.listErr
	}
	if !f.canList {
		return nil, apierrors.NewForbidden(holdersGR, "", errForbidden("list"))
	}
	if ns != f.namespace {
		return nil, nil
	}
	return slices.Clone(f.holders), nil
}

func (f *fakeSource) ListCounters(_ context.Context, ns string) ([]Counter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ns != f.namespace {
		return nil, nil
	}
	return slices.Clone(f.counters), nil
}

func (f *fakeSource) ListWaiters(_ context.Context, ns string) ([]Waiter, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if ns != f.namespace {
		return nil, nil
	}
	return slices.Clone(f.waiters), nil
}

func (f *fakeSource) RevokeHolder(_ context.Context, ns, name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.canDelete {
		return apierrors.NewForbidden(holdersGR, name, errForbidden("delete"))
	}
	i := slices.IndexFunc(f.holders, func(h Holder) bool { return h.Name == name })
	if ns != f.namespace || i < 0 {
		return apierrors.NewNotFound(holdersGR, name)
	}
	f.holders = slices.Delete(f.holders, i, i+1)
	f.revoked = append(f.revoked, name)
	return nil
}

func (f *fakeSource) CanRevoke(context.Context, string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.canDelete, nil
}

func (f *fakeSource) revokedNames() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.revoked)
}

type errForbidden string

func (e errForbidden) Error() string { return "user \"viewer\" cannot " + string(e) + " leaseholders" }
