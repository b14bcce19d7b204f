package httpapi_test

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// TestTenantBinding drives the binding through the HTTP API as both servers wire it: the
// agent (its own pod) and the manager (a pod found by address, or none).
func TestTenantBinding(t *testing.T) {
	tenants := tenancy.Static{System: "lease-system", Tenants: map[string]string{"acme": "acme", "globex": "globex"}}
	acmePod := lease.PodRef{Namespace: "acme", Name: "app-0", UID: "uid-a"}
	teamPod := lease.PodRef{Namespace: "team-a", Name: "app-0", UID: "uid-t"}
	bound := func(pod lease.PodRef, nonPod tenancy.NonPodPolicy) []httpapi.Option {
		return []httpapi.Option{httpapi.WithPodIdentity(httpapi.StaticPodIdentity(pod)),
			httpapi.WithTenantBinder(tenancy.Binder{Map: tenants, NonPod: nonPod}.Bind)}
	}
	const (
		named   = `{"type":"tex","lease":"tex","tenant":"%s","project":"p1","user":"alice"}`
		omitted = `{"type":"tex","lease":"tex","project":"p1","user":"alice"}`
	)
	refused := []struct {
		name          string
		opts          []httpapi.Option
		body          string
		wantNamespace string
		wantTenant    string
	}{
		{"a pod naming another tenant", bound(acmePod, tenancy.NonPodRefused), fmt.Sprintf(named, "globex"), "acme", "acme"},
		{"a pod naming another tenant, development setting on", bound(acmePod, tenancy.NonPodAnyTenant), fmt.Sprintf(named, "globex"), "acme", "acme"},
		{"a pod in an unlabelled namespace", bound(teamPod, tenancy.NonPodRefused), fmt.Sprintf(named, "acme"), "team-a", ""},
		{"a pod in an unlabelled namespace, tenant omitted", bound(teamPod, tenancy.NonPodRefused), omitted, "team-a", ""},
		{"a caller that is no pod", bound(lease.PodRef{}, tenancy.NonPodRefused), fmt.Sprintf(named, "acme"), "", ""},
	}
	for _, tc := range refused {
		t.Run("refuses "+tc.name, func(t *testing.T) {
			e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: tc.opts})
			// A dry run is bound as an acquisition is (docs/api.md, "Dry run").
			for _, path := range []string{"/v1/leases", "/v1/leases?dryRun=true"} {
				status, out := e.do(t, http.MethodPost, path, tc.body)
				if status != http.StatusForbidden || out["error"] != "TENANT_FORBIDDEN" {
					t.Fatalf("%s = %d %v, want 403 TENANT_FORBIDDEN", path, status, out)
				}
				ns, _ := out["callerNamespace"].(string)
				tenant, _ := out["callerTenant"].(string)
				if ns != tc.wantNamespace || tenant != tc.wantTenant {
					t.Errorf("%s: callerNamespace, callerTenant = %q, %q; want %q, %q", path, ns, tenant, tc.wantNamespace, tc.wantTenant)
				}
			}
			if n := e.cmds.get(); n != 0 {
				t.Errorf("a refused acquisition sent %d store commands", n)
			}
			e.empty(t)
		})
	}

	allowed := []struct {
		name       string
		opts       []httpapi.Option
		body       string
		wantTenant string
		wantPod    lease.PodRef
	}{
		{"a pod naming its own tenant", bound(acmePod, tenancy.NonPodRefused), fmt.Sprintf(named, "acme"), "acme", acmePod},
		{"a pod omitting the tenant: its namespace's", bound(acmePod, tenancy.NonPodRefused), omitted, "acme", acmePod},
		{"a caller that is no pod, development setting on", bound(lease.PodRef{}, tenancy.NonPodAnyTenant), fmt.Sprintf(named, "globex"), "globex", lease.PodRef{}},
	}
	for _, tc := range allowed {
		t.Run("allows "+tc.name, func(t *testing.T) {
			e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: tc.opts})
			tok := e.acquire(t, tc.body)
			hs, err := e.store.ListHolders(context.Background(), leasestore.HolderFilter{})
			if err != nil {
				t.Fatal(err)
			}
			if len(hs) != 1 || hs[0].Token != tok || hs[0].Tenant != tc.wantTenant || hs[0].Pod != tc.wantPod {
				t.Errorf("holders = %+v; want one of tenant %q, pod %v", hs, tc.wantTenant, tc.wantPod)
			}
		})
	}

	// When the tenant map does not sync within the binder's wait (a manager's namespace
	// informer, an agent that cannot reach its manager), the answer is 503 and says it is the
	// tenant that is not known, not the store.
	t.Run("a pod whose tenant is not known yet", func(t *testing.T) {
		opts := []httpapi.Option{httpapi.WithPodIdentity(httpapi.StaticPodIdentity(acmePod)),
			httpapi.WithTenantBinder(tenancy.Binder{Map: unsynced{tenants}, NonPod: tenancy.NonPodRefused, SyncWait: 50 * time.Millisecond}.Bind)}
		e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: opts})
		status, out := e.do(t, http.MethodPost, "/v1/leases", fmt.Sprintf(named, "acme"))
		msg, _ := out["message"].(string)
		if status != http.StatusServiceUnavailable || out["error"] != "LEASE_UNAVAILABLE" || !strings.Contains(msg, "tenant of the calling pod") {
			t.Errorf("acquire = %d %v, want 503 LEASE_UNAVAILABLE saying the tenant is not known yet", status, out)
		}
		e.empty(t)
	})

	t.Run("a caller that is no pod must name the tenant, development setting on", func(t *testing.T) {
		e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: bound(lease.PodRef{}, tenancy.NonPodAnyTenant)})
		status, out := e.do(t, http.MethodPost, "/v1/leases", omitted)
		if status != http.StatusBadRequest || out["field"] != "tenant" {
			t.Errorf("acquire = %d %v, want 400 naming tenant", status, out)
		}
		e.empty(t)
	})
}

// unsynced is a tenant map that has not synced yet.
type unsynced struct{ tenancy.Static }

func (unsynced) HasSynced() bool { return false }
