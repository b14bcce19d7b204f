package leasing_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/lease"
)

// putTenantDoc adds a tenant-layer document of tenant for name, booking resource with the
// given tenant cap (0: unset).
func (m *memSource) putTenantDoc(name, tenant, resource string, tenantCap int32) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := definition.Layer{Kind: definition.KindTenant, Source: "tenant " + tenant + "/" + name, Name: name,
		Tenant: tenant, Project: definition.TenantProject, Resource: &resource}
	if tenantCap > 0 {
		l.Levels.Tenant = &tenantCap
	}
	zero := int32(0)
	l.WaitMs = &zero
	k := definition.LayerKey{Name: name, Tenant: tenant, Project: definition.TenantProject}
	m.docs[k] = append(m.docs[k], l)
}

// TestTenantDocumentsCannotRaiseAResourcesGlobalCap is issue 26's first reproduction on a
// real store: tenant acme's own documents point leases at tex (global 6). Ten acquisitions
// through them never book tex's global counter past 6.
func TestTenantDocumentsCannotRaiseAResourcesGlobalCap(t *testing.T) {
	e := newEnv(t, []leaseDef{
		{name: "tex", global: 6, ttlSeconds: 60},
		{name: "browser", resource: "browser-sessions", global: 20, tenant: 5, ttlSeconds: 60},
	}, envOpts{})
	// The reproduction of the issue: browser (global 20) pointed at tex.
	e.source.putTenantDoc("browser", "acme", "tex", 20)
	// A lease of acme's own (no system document) on tex.
	e.source.putTenantDoc("mytex", "acme", "tex", 20)

	for _, name := range []string{"browser", "mytex"} {
		granted := 0
		for i := range 10 {
			_, err := acquire(ctxT(t), e.svc, req(name, "acme", "web", fmt.Sprintf("user-%d", i)))
			var busy *lease.BusyError
			switch {
			case err == nil:
				granted++
			case name == "browser" && errors.Is(err, definition.ErrCapNotPermitted):
			case name == "mytex" && errors.As(err, &busy) && busy.Level == lease.LevelGlobal && busy.Cap == 6:
			default:
				t.Fatalf("%s: Acquire() error = %v", name, err)
			}
		}
		t.Logf("%s: %d of 10 granted", name, granted)
	}
	_, counters := holdersAndCounters(t, e.store)
	for _, c := range counters {
		if c.Resource == "tex" && c.Level == lease.LevelGlobal && c.Count > 6 {
			t.Errorf("tex global counter = %d, above its cap 6", c.Count)
		}
	}
	// Another tenant is not starved beyond the resource's own cap: nothing is left, and the
	// diagnosis says 6 of 6.
	_, err := acquire(ctxT(t), e.svc, req("tex", "globex", "web", "bob"))
	var busy *lease.BusyError
	if !errors.As(err, &busy) || busy.Count != 6 || busy.Cap != 6 {
		t.Errorf("globex's tex: error = %v, want busy at 6 of 6", err)
	}
	assertNoDrift(t, e.store)
}
