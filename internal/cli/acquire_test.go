package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

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
		"no lease named":    {[]string{"acquire", "--dry-run", "-n", "acme", "--project", "thesis"}, []string{"accepts 1 arg"}},
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
