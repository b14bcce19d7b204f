package tenancy_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

func TestBindTenant(t *testing.T) {
	m := tenancy.Static{System: "lease-system", Tenants: map[string]string{"acme": "acme", "acme-batch": "acme", "globex": "globex"}}
	acmePod := lease.PodRef{Namespace: "acme", Name: "app", UID: "u1"}
	batchPod := lease.PodRef{Namespace: "acme-batch", Name: "job", UID: "u2"}
	teamPod := lease.PodRef{Namespace: "team-a", Name: "app", UID: "u3"}
	host := tenancy.Caller{Addr: "10.0.0.9"}
	cases := map[string]struct {
		caller    tenancy.Caller
		requested string
		nonPod    tenancy.NonPodPolicy
		want      string
		// wantErr is the refusal, nil for none.
		wantErr *lease.TenantForbiddenError
		wantMsg string
	}{
		"pod names its own tenant":            {caller: tenancy.Caller{Pod: acmePod}, requested: "acme", want: "acme"},
		"pod omits the tenant: derived":       {caller: tenancy.Caller{Pod: acmePod}, want: "acme"},
		"second namespace of the same tenant": {caller: tenancy.Caller{Pod: batchPod}, requested: "acme", want: "acme"},
		"second namespace, tenant omitted":    {caller: tenancy.Caller{Pod: batchPod}, want: "acme"},
		"dev setting does not free pods": {caller: tenancy.Caller{Pod: acmePod}, requested: "globex", nonPod: tenancy.NonPodAnyTenant,
			wantErr: &lease.TenantForbiddenError{Pod: acmePod, NamespaceTenant: "acme", Label: tenancy.TenantLabel, Requested: "globex"}},
		"pod names another tenant": {caller: tenancy.Caller{Pod: acmePod, Addr: "10.0.0.5"}, requested: "globex",
			wantErr: &lease.TenantForbiddenError{Pod: acmePod, NamespaceTenant: "acme", Label: tenancy.TenantLabel, Requested: "globex"},
			wantMsg: `TENANT_FORBIDDEN: the calling pod acme/app is in namespace "acme", which speaks for tenant "acme" (label lease.vancetope.io/tenant); it may not act for tenant "globex"`},
		"pod in an unlabelled namespace": {caller: tenancy.Caller{Pod: teamPod}, requested: "acme",
			wantErr: &lease.TenantForbiddenError{Pod: teamPod, Label: tenancy.TenantLabel, Requested: "acme"},
			wantMsg: `TENANT_FORBIDDEN: the calling pod team-a/app is in namespace "team-a", which has no lease.vancetope.io/tenant label and so speaks for no tenant; it may not act for tenant "acme"`},
		"pod in an unlabelled namespace, tenant omitted": {caller: tenancy.Caller{Pod: teamPod},
			wantErr: &lease.TenantForbiddenError{Pod: teamPod, Label: tenancy.TenantLabel}},
		"pod in the system namespace (unlabelled)": {caller: tenancy.Caller{Pod: lease.PodRef{Namespace: "lease-system", Name: "tool"}}, requested: "acme",
			wantErr: &lease.TenantForbiddenError{Pod: lease.PodRef{Namespace: "lease-system", Name: "tool"}, Label: tenancy.TenantLabel, Requested: "acme"}},
		"no pod, refused by default": {caller: host, requested: "acme",
			wantErr: &lease.TenantForbiddenError{Addr: "10.0.0.9", Label: tenancy.TenantLabel, Requested: "acme"},
			wantMsg: `TENANT_FORBIDDEN: the caller 10.0.0.9 is no running pod this server can see; callers that are not pods are refused here (a pod acts for the tenant of its namespace)`},
		"no pod, development: any tenant":          {caller: host, requested: "globex", nonPod: tenancy.NonPodAnyTenant, want: "globex"},
		"no pod, development: omitted stays empty": {caller: host, nonPod: tenancy.NonPodAnyTenant, want: ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got, err := tenancy.BindTenant(tc.caller, tc.requested, m, tc.nonPod)
			var gotErr *lease.TenantForbiddenError
			if err != nil && !errors.As(err, &gotErr) {
				t.Fatalf("error %v is no *TenantForbiddenError", err)
			}
			if diff := cmp.Diff(tc.wantErr, gotErr); diff != "" {
				t.Errorf("refusal (-want +got):\n%s", diff)
			}
			if err != nil && !errors.Is(err, lease.ErrTenantForbidden) {
				t.Errorf("errors.Is(%v, ErrTenantForbidden) = false", err)
			}
			if tc.wantMsg != "" && (err == nil || err.Error() != tc.wantMsg) {
				t.Errorf("message = %v\nwant      %s", err, tc.wantMsg)
			}
			if got != tc.want {
				t.Errorf("tenant = %q, want %q", got, tc.want)
			}
		})
	}
}

// unsynced is a Map whose informer has not listed the namespaces yet.
type unsynced struct{ tenancy.Static }

func (unsynced) HasSynced() bool { return false }

func TestBinderFailsClosedUntilSynced(t *testing.T) {
	b := tenancy.Binder{Map: unsynced{tenancy.Static{Tenants: map[string]string{"acme": "acme"}}}, SyncWait: 50 * time.Millisecond}
	start := time.Now()
	_, err := b.Bind(context.Background(), tenancy.Caller{Pod: lease.PodRef{Namespace: "acme", Name: "app"}}, "acme")
	if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, tenancy.ErrNotSynced) {
		t.Errorf("Bind before sync = %v, want LEASE_UNAVAILABLE (not synced)", err)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Errorf("Bind gave up after %v, before its SyncWait of 50ms", waited)
	}
	// A caller that is no pod does not depend on the namespaces.
	_, err = b.Bind(context.Background(), tenancy.Caller{Addr: "10.0.0.9"}, "acme")
	if !errors.Is(err, lease.ErrTenantForbidden) {
		t.Errorf("Bind of no pod before sync = %v, want TENANT_FORBIDDEN", err)
	}
	// The request's context ends the wait too.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	b.SyncWait = time.Hour
	if _, err := b.Bind(ctx, tenancy.Caller{Pod: lease.PodRef{Namespace: "acme", Name: "app"}}, "acme"); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("Bind with its request gone = %v, want LEASE_UNAVAILABLE", err)
	}
}

// syncsLater is a Map that syncs once its flag is set.
type syncsLater struct {
	tenancy.Static
	synced *atomic.Bool
}

func (m syncsLater) HasSynced() bool { return m.synced.Load() }

// TestBinderWaitsForTheSync: a request that arrives while the map syncs (an agent just
// restarted next to its pod) is answered once the map knows, not refused with 503.
func TestBinderWaitsForTheSync(t *testing.T) {
	synced := &atomic.Bool{}
	b := tenancy.Binder{Map: syncsLater{tenancy.Static{Tenants: map[string]string{"acme": "acme"}}, synced}}
	time.AfterFunc(30*time.Millisecond, func() { synced.Store(true) })
	got, err := b.Bind(context.Background(), tenancy.Caller{Pod: lease.PodRef{Namespace: "acme", Name: "app"}}, "")
	if err != nil || got != "acme" {
		t.Errorf("Bind while the map syncs = %q, %v, want acme", got, err)
	}
}
