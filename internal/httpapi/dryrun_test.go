package httpapi_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// A dry run (POST /v1/leases?dryRun=true, docs/api.md "Dry run") answers what an acquisition
// would answer now. These tests count the store's commands by name: a dry run sends no write,
// and reads the funnel's counters, and at a full level its line and the resource's hold times
// (its position and estimated wait), whatever it answers.

const dryRunPath = "/v1/leases?dryRun=true"

// dryRunDefs: tex caps the project level at 1 and waits long, so that an acquisition that
// waited would show in the time the answer takes.
var dryRunDefs = []leaseDef{
	{name: "tex", resource: "tex2pdf", project: 1, global: 6, ttlSeconds: 120, waitMs: 10000},
	// broken has two system documents: its definition is in conflict, so unavailable.
	{name: "broken", global: 1, ttlSeconds: 60},
	{name: "broken", global: 2, ttlSeconds: 60},
}

// noWrites fails unless the commands since the last split are at most three finds.
func noWrites(t *testing.T, e *env, what string) {
	t.Helper()
	reads, writes := e.cmds.split()
	if len(writes) > 0 {
		t.Errorf("%s sent writes %v, want none", what, writes)
	}
	if n := reads["find"]; n > 3 || len(reads) > 1 {
		t.Errorf("%s sent reads %v, want at most three finds (the counters, a full level's line, its hold times)", what, reads)
	}
}

func TestDryRunGranted(t *testing.T) {
	e := newEnv(t, dryRunDefs, envOpts{})
	for _, path := range []string{dryRunPath, "/v1/leases?dryRun=1"} {
		status, out := e.do(t, http.MethodPost, path, texBody)
		want := map[string]any{"dryRun": true, "noop": false, "lease": "tex", "resource": "tex2pdf", "ttlSeconds": float64(120),
			"levels": []any{
				map[string]any{"level": "project", "scope": "acme/p1", "cap": float64(1)},
				map[string]any{"level": "global", "scope": "*", "cap": float64(6)},
			}}
		if status != http.StatusOK {
			t.Fatalf("%s = %d %v, want 200", path, status, out)
		}
		if diff := cmp.Diff(want, out); diff != "" {
			t.Errorf("%s answer (-want +got):\n%s", path, diff)
		}
		noWrites(t, e, path)
	}
	e.empty(t)
	// A dry run is no acquisition: vance_lease_acquire_total counts none.
	if n := testutil.CollectAndCount(e.metrics.Acquire); n != 0 {
		t.Errorf("vance_lease_acquire_total has %d series after dry runs, want none", n)
	}
	// It leaves the slot free: a real acquisition gets it.
	e.acquire(t, texBody)
}

func TestDryRunBusy(t *testing.T) {
	e := newEnv(t, dryRunDefs, envOpts{})
	tok := e.acquire(t, texBody)
	bob := strings.Replace(texBody, "alice", "bob", 1)

	// What a real single attempt answers, for comparison (it books and drops a holder).
	status, real := e.do(t, http.MethodPost, "/v1/leases", strings.Replace(bob, `"lease"`, `"waitMs":0,"lease"`, 1))
	if status != http.StatusConflict {
		t.Fatalf("real busy acquire = %d %v", status, real)
	}
	// Its heal of the full level runs in the background: let it end before counting.
	if err := e.svc.Drain(t.Context()); err != nil {
		t.Fatal(err)
	}
	e.cmds.split()

	// The dry run ignores waitMs (and the definition's 10 s): it answers at once.
	start := time.Now()
	status, dry := e.do(t, http.MethodPost, dryRunPath, strings.Replace(bob, `"lease"`, `"waitMs":5000,"lease"`, 1))
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("dry run answered after %v; it must not wait", elapsed)
	}
	if status != http.StatusConflict || dry["error"] != httpjson.CodeBusy {
		t.Fatalf("dry run on a full level = %d %v, want 409 LEASE_BUSY", status, dry)
	}
	noWrites(t, e, "a busy dry run")
	want := map[string]any{"error": "LEASE_BUSY", "resource": "tex2pdf", "level": "project", "scope": "acme/p1",
		"count": float64(1), "cap": float64(1), "waitedMs": float64(0), "position": float64(0),
		"message": "LEASE_BUSY: resource tex2pdf is full at level project (scope acme/p1): 1 of 1 in use, 0 waiting ahead"}
	if diff := cmp.Diff(want, dry); diff != "" {
		t.Errorf("busy dry run (-want +got):\n%s", diff)
	}
	// The same fields as the real answer, through the same error writer.
	for _, m := range []map[string]any{real, dry} {
		delete(m, "message")
		delete(m, "waitedMs")
	}
	if diff := cmp.Diff(real, dry); diff != "" {
		t.Errorf("busy answers, real (-) and dry run (+):\n%s", diff)
	}
	hs, err := e.store.ListHolders(context.Background(), leasestore.HolderFilter{})
	if err != nil || len(hs) != 1 || hs[0].Token != tok {
		t.Errorf("holders after the dry run = %+v, %v; want the first holder alone", hs, err)
	}
}

func TestDryRunNoop(t *testing.T) {
	e := newEnv(t, dryRunDefs, envOpts{})
	for _, ref := range []string{`"lease":"none",`, ``} {
		status, out := e.do(t, http.MethodPost, dryRunPath, `{"type":"tex",`+ref+`"tenant":"acme","project":"p1"}`)
		if status != http.StatusOK || !cmp.Equal(out, map[string]any{"noop": true, "dryRun": true}) {
			t.Errorf("NOOP dry run = %d %v, want 200 {noop:true,dryRun:true}", status, out)
		}
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("NOOP dry runs sent %d store commands", n)
	}
}

// TestDryRunRefusesAsAcquire: every body a real acquisition refuses, and a broken
// definition, get the same answer from a dry run, and nothing reaches the store.
func TestDryRunRefusesAsAcquire(t *testing.T) {
	defs := append([]leaseDef{{name: "tex", global: 5, user: 1, ttlSeconds: 60}}, dryRunDefs[1:]...)
	e := newEnv(t, defs, envOpts{})
	for name, tc := range badAcquireBodies() {
		t.Run(name, func(t *testing.T) {
			status, out := e.do(t, http.MethodPost, dryRunPath, tc.body)
			if status != http.StatusBadRequest || out["error"] != httpjson.CodeInvalid || out["field"] != tc.field {
				t.Errorf("dry run = %d %v, want 400 INVALID_REQUEST naming %q as an acquisition does", status, out, tc.field)
			}
		})
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("refused dry runs sent %d store commands, want none", n)
	}

	broken := `{"type":"tex","lease":"broken","tenant":"acme","project":"p1"}`
	for _, path := range []string{"/v1/leases", dryRunPath} {
		status, out := e.do(t, http.MethodPost, path, broken)
		msg, _ := out["message"].(string)
		if status != http.StatusServiceUnavailable || out["error"] != httpjson.CodeUnavailable ||
			!strings.Contains(msg, `the definition of lease "broken" is unavailable`) {
			t.Errorf("%s with a broken definition = %d %v, want 503 naming the definition", path, status, out)
		}
	}
	e.empty(t)
}

func TestDryRunParameter(t *testing.T) {
	e := newEnv(t, dryRunDefs, envOpts{})
	for _, query := range []string{"dryRun=false", "dryRun=0", "dryRun=yes", "dryRun=TRUE", "dryRun=", "dryRun", "dryRun=true&dryRun=1"} {
		status, out := e.do(t, http.MethodPost, "/v1/leases?"+query, texBody)
		if status != http.StatusBadRequest || out["error"] != httpjson.CodeInvalid || out["field"] != "dryRun" {
			t.Errorf("?%s = %d %v, want 400 naming dryRun", query, status, out)
		}
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("refused dry runs sent %d store commands, want none", n)
	}
}
