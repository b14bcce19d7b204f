package cli_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
)

// TestAcquireDryRun: `kubectl lease acquire --dry-run` asks the manager, through the live
// API with the kubeconfig alone, what an acquisition would answer now, and books nothing.
func TestAcquireDryRun(t *testing.T) {
	s := newStore(t)
	m := newManager(t, s.Store)
	alice := map[string]string{"KUBECONFIG": aliceFile, "LEASE_SYSTEM_NAMESPACE": systemNS}
	ann := []string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis", "--user", "ann", "render"}

	r := mustRun(t, alice, ann...)
	if !strings.Contains(r.stdout, "Dry run of lease render for tenant acme, project thesis, user ann (namespace acme); nothing was booked.") ||
		!strings.Contains(r.stdout, "GRANTED now: every capped level of resource render has room.") {
		t.Errorf("granted dry run printed:\n%s", r.stdout)
	}
	_, table, _ := strings.Cut(r.stdout, "room.\n")
	if got := columns(t, table, "LEVEL", "SCOPE", "CAP"); !cmp.Equal(got, [][]string{{"user", "acme/ann", "1"}, {"global", "*", "2"}}) {
		t.Errorf("levels = %v", got)
	}

	// Ann holds her one slot: the dry run names her full user level.
	l, err := m.svc.Acquire(ctxT(t), leasing.Request{Type: "tex", Lease: "render", Tenant: "acme", Project: "thesis", User: "ann"})
	if err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, alice, ann...)
	if want := "BUSY now: resource render is full at level user (scope acme/ann): 1 of 1 in use."; !strings.Contains(r.stdout, want) {
		t.Errorf("busy dry run printed:\n%s\nwant %q", r.stdout, want)
	}
	r = mustRun(t, alice, append(ann, "-o", "json")...)
	var got struct {
		DryRun    bool   `json:"dryRun"`
		Namespace string `json:"namespace"`
		Tenant    string `json:"tenant"`
		Outcome   string `json:"outcome"`
		Busy      struct {
			Level string `json:"level"`
			Count int    `json:"count"`
			Cap   int    `json:"cap"`
		} `json:"busy"`
	}
	if err := json.Unmarshal([]byte(r.stdout), &got); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	if !got.DryRun || got.Namespace != "acme" || got.Tenant != "acme" || got.Outcome != "busy" || got.Busy.Level != "user" || got.Busy.Count != 1 || got.Busy.Cap != 1 {
		t.Errorf("-o json = %+v", got)
	}
	if diff := cmp.Diff([]string{l.Token}, holderTokens(t, s.Store)); diff != "" {
		t.Errorf("holders after dry runs (-want +got):\n%s", diff)
	}

	// The operator asks for any tenant from the system namespace.
	r = mustRun(t, operatorEnv(), "acquire", "--dry-run", "--tenant", "globex", "--project", "web", "--user", "eve", "render")
	if !strings.Contains(r.stdout, "for tenant globex, project web, user eve (namespace "+systemNS+")") || !strings.Contains(r.stdout, "GRANTED now") {
		t.Errorf("operator's dry run printed:\n%s", r.stdout)
	}
	r = mustRun(t, alice, "acquire", "--dry-run", "-n", "acme", "--project", "thesis", "none")
	if !strings.Contains(r.stdout, "NOOP: no lease applies") {
		t.Errorf("NOOP dry run printed:\n%s", r.stdout)
	}
}

func TestAcquireRefusals(t *testing.T) {
	s := newStore(t)
	newManager(t, s.Store)
	alice := map[string]string{"KUBECONFIG": aliceFile, "LEASE_SYSTEM_NAMESPACE": systemNS}
	for name, tc := range map[string]struct {
		args []string
		want []string
	}{
		"without --dry-run": {[]string{"acquire", "-n", "acme", "--project", "thesis", "--user", "ann", "render"}, []string{"supports only --dry-run"}},
		"without --project": {[]string{"acquire", "--dry-run", "-n", "acme", "render"}, []string{"--project is required"}},
		"without a tenant":  {[]string{"acquire", "--dry-run", "--project", "thesis", "render"}, []string{"-n NAMESPACE", "--tenant TENANT"}},
		"another namespace": {[]string{"acquire", "--dry-run", "-n", "globex", "--project", "web", "--user", "eve", "render"}, []string{"forbidden", "leaseacquisitionreviews"}},
		"another tenant":    {[]string{"acquire", "--dry-run", "-n", "acme", "--tenant", "globex", "--project", "web", "render"}, []string{"forbidden", `speaks for tenant "acme"`}},
		"the capped user":   {[]string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis", "render"}, []string{"spec.user", "caps the user level"}},
		"an unhandled type": {[]string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis", "--user", "ann", "--type", "pdf", "render"}, []string{"spec.type"}},
		"no lease named":    {[]string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis"}, []string{"requires at least 1 arg"}},
		"an unknown output": {[]string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis", "-o", "yaml", "render"}, []string{"--output"}},
	} {
		t.Run(name, func(t *testing.T) {
			mustFail(t, alice, tc.args, tc.want...)
		})
	}
	if hs := holderTokens(t, s.Store); len(hs) != 0 {
		t.Errorf("holders after refused dry runs: %v", hs)
	}
}

// severalDefinitions are the definitions of the dry runs of several leases (issue 45): gpu
// has four slots in all, licence two, and gpu-big books gpu's resource too.
var severalDefinitions = fstest.MapFS{
	"gpu.yaml":     {Data: []byte("name: gpu\nlevels: {global: 4}\nwaitMs: 0\n")},
	"licence.yaml": {Data: []byte("name: licence\nlevels: {global: 2, project: 2}\nwaitMs: 0\n")},
	"gpu-big.yaml": {Data: []byte("name: gpu-big\nresource: gpu\nlevels: {global: 4}\nwaitMs: 0\n")},
}

// reviewUnder makes the suite's dry runs, and m.svc, resolve defs over s for this test.
func (m *manager) reviewUnder(t testing.TB, s *leasestore.Store, defs fstest.MapFS) {
	t.Helper()
	builtins, err := definition.LoadBuiltins(defs)
	if err != nil {
		t.Fatal(err)
	}
	m.svc = leasing.NewService(s, definition.NewResolver(builtins, nil), leasing.NewStaticTypes("tex"))
	liveReviewer.mu.Lock()
	liveReviewer.r = m.svc
	liveReviewer.mu.Unlock()
}

// TestAcquireDryRunOfSeveralLeases: `kubectl lease acquire --dry-run` with several LEASE
// names asks about one acquisition of all of them: granted lists every lease's levels in
// the order of their resources, busy names the full lease, -o json carries both; a bad list
// is refused naming spec.leases; nothing is booked.
func TestAcquireDryRunOfSeveralLeases(t *testing.T) {
	s := newStore(t)
	m := newManager(t, s.Store)
	m.reviewUnder(t, s.Store, severalDefinitions)
	alice := map[string]string{"KUBECONFIG": aliceFile, "LEASE_SYSTEM_NAMESPACE": systemNS}
	ann := []string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis", "--user", "ann", "licence", "gpu"}

	r := mustRun(t, alice, ann...)
	if !strings.Contains(r.stdout, "Dry run of leases licence, gpu together for tenant acme, project thesis, user ann (namespace acme); nothing was booked.") ||
		!strings.Contains(r.stdout, "GRANTED now: every capped level of resources gpu, licence has room; an acquisition would get all of the leases together.") {
		t.Errorf("granted dry run of two leases printed:\n%s", r.stdout)
	}
	_, table, _ := strings.Cut(r.stdout, "together.\n")
	if got := columns(t, table, "LEASE", "RESOURCE", "LEVEL", "SCOPE", "CAP"); !cmp.Equal(got, [][]string{
		{"gpu", "gpu", "global", "*", "4"}, {"licence", "licence", "project", "acme/thesis", "2"}, {"licence", "licence", "global", "*", "2"}}) {
		t.Errorf("levels = %v", got)
	}
	var granted struct {
		Outcome, Resource string
		Lease             *string
		Leases            []string
		Parts             []struct {
			Lease, Resource string
			Levels          []struct{ Level, Scope string }
		}
	}
	r = mustRun(t, alice, append(ann, "-o", "json")...)
	if err := json.Unmarshal([]byte(r.stdout), &granted); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	if granted.Outcome != "granted" || granted.Lease != nil || !cmp.Equal(granted.Leases, []string{"licence", "gpu"}) || granted.Resource != "gpu+licence" ||
		len(granted.Parts) != 2 || granted.Parts[0].Lease != "gpu" || granted.Parts[1].Lease != "licence" || len(granted.Parts[1].Levels) != 2 {
		t.Errorf("-o json of a granted dry run of two leases = %+v", granted)
	}

	// The licence's two slots are taken: the dry run names the licence, though gpu has room.
	var held []string
	for _, user := range []string{"bea", "cy"} {
		l, err := m.svc.Acquire(ctxT(t), leasing.Request{Type: "tex", Lease: "licence", Tenant: "acme", Project: "web", User: user})
		if err != nil {
			t.Fatal(err)
		}
		held = append(held, l.Token)
		t.Cleanup(func() { _, _ = m.svc.Release(context.Background(), l.Token) })
	}
	r = mustRun(t, alice, ann...)
	if want := "BUSY now: lease licence (resource licence) is full at level global (scope *): 2 of 2 in use."; !strings.Contains(r.stdout, want) ||
		!strings.Contains(r.stdout, "booking none of the leases meanwhile") {
		t.Errorf("busy dry run of two leases printed:\n%s\nwant %q", r.stdout, want)
	}
	var busy struct {
		Outcome, Resource string
		Busy              struct {
			Lease, Level string
			Count, Cap   int
		}
	}
	r = mustRun(t, alice, append(ann, "-o", "json")...)
	if err := json.Unmarshal([]byte(r.stdout), &busy); err != nil {
		t.Fatalf("-o json: %v\n%s", err, r.stdout)
	}
	if busy.Outcome != "busy" || busy.Resource != "licence" || busy.Busy.Lease != "licence" || busy.Busy.Level != "global" || busy.Busy.Count != 2 || busy.Busy.Cap != 2 {
		t.Errorf("-o json of a busy dry run of two leases = %+v", busy)
	}
	if diff := cmp.Diff(held, holderTokens(t, s.Store), cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("holders after dry runs (-want +got):\n%s", diff)
	}

	for name, want := range map[string][]string{
		"gpu gpu":     {"spec.leases", "names gpu twice"},
		"gpu gpu-big": {"spec.leases", "gpu and gpu-big book the same resource gpu"},
	} {
		args := append([]string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis"}, strings.Fields(name)...)
		mustFail(t, alice, args, want...)
	}
}
