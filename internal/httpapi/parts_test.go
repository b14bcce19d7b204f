package httpapi_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Acquisitions of several leases at once, all or none ("leases" in the body; docs/api.md,
// "Several leases at once").

// partsDefs: gpu holds one slot worldwide; licence two per project; gpu-big books gpu's
// resource too; free and free2 cap nothing.
var partsDefs = []leaseDef{
	{name: "gpu", resource: "gpu", global: 1, ttlSeconds: 120, waitMs: 10000},
	{name: "licence", resource: "licence", project: 2, global: 5, ttlSeconds: 60, waitMs: 10000},
	{name: "gpu-big", resource: "gpu", global: 4, ttlSeconds: 60},
	{name: "free", ttlSeconds: 60},
	{name: "free2", ttlSeconds: 60},
}

// partsBody acquires licence and gpu for alice; leasesOf names other leases for user.
const partsBody = `{"type":"tex","leases":["licence","gpu"],"tenant":"acme","project":"p1","user":"alice"}`

func leasesOf(user string, names ...string) string {
	return fmt.Sprintf(`{"type":"tex","leases":["%s"],"tenant":"acme","project":"p1","user":%q,"waitMs":0}`,
		strings.Join(names, `","`), user)
}

func singleOf(name, user string) string {
	return fmt.Sprintf(`{"type":"tex","lease":%q,"tenant":"acme","project":"p1","user":%q,"waitMs":0}`, name, user)
}

var (
	gpuLevels     = []any{map[string]any{"level": "global", "scope": "*", "cap": float64(1)}}
	licenceLevels = []any{
		map[string]any{"level": "project", "scope": "acme/p1", "cap": float64(2)},
		map[string]any{"level": "global", "scope": "*", "cap": float64(5)},
	}
)

func TestSeveralLeasesAcquireAndCheck(t *testing.T) {
	e := newEnv(t, partsDefs, envOpts{})
	// A grant of gpu alone first, so that gpu's next fence (2) differs from licence's (1).
	if status, out := e.do(t, http.MethodDelete, "/v1/leases/"+e.acquire(t, singleOf("gpu", "bob")), ""); status != http.StatusOK {
		t.Fatalf("release = %d %v", status, out)
	}

	status, out := e.do(t, http.MethodPost, "/v1/leases", partsBody)
	if status != http.StatusOK {
		t.Fatalf("acquire = %d %v", status, out)
	}
	token, _ := out["token"].(string)
	// The parts in the order of their resources, whatever the order of the names; the
	// shortest TTL; no lease, resource, levels or fence of its own.
	want := map[string]any{"token": token, "noop": false, "ttlSeconds": float64(60), "leases": []any{
		map[string]any{"lease": "gpu", "resource": "gpu", "levels": gpuLevels, "fence": float64(2)},
		map[string]any{"lease": "licence", "resource": "licence", "levels": licenceLevels, "fence": float64(1)},
	}}
	if diff := cmp.Diff(want, out); diff != "" || len(token) != 32 {
		t.Errorf("acquire answer (-want +got):\n%s", diff)
	}
	h, err := e.store.GetHolder(context.Background(), token)
	if err != nil {
		t.Fatal(err)
	}
	wantParts := []lease.Part{{LeaseName: "gpu", Resource: "gpu", Fence: 2}, {LeaseName: "licence", Resource: "licence", Fence: 1}}
	if diff := cmp.Diff(wantParts, h.Parts); diff != "" || h.User != "alice" {
		t.Errorf("stored holder %s, parts (-want +got):\n%s", h.User, diff)
	}

	// The check answers the first part's fence, and every part's.
	status, out = e.do(t, http.MethodPost, "/v1/leases/"+token+"/check", "")
	wantCheck := map[string]any{"outcome": "ok", "fence": float64(2), "leases": []any{
		map[string]any{"lease": "gpu", "resource": "gpu", "fence": float64(2)},
		map[string]any{"lease": "licence", "resource": "licence", "fence": float64(1)},
	}}
	if diff := cmp.Diff(wantCheck, out); status != http.StatusOK || diff != "" {
		t.Errorf("check = %d (-want +got):\n%s", status, diff)
	}
	// The check of a holder of one lease is as it was: no leases.
	single := e.acquire(t, singleOf("licence", "bob"))
	status, out = e.do(t, http.MethodPost, "/v1/leases/"+single+"/check", "")
	if diff := cmp.Diff(map[string]any{"outcome": "ok", "fence": float64(2)}, out); status != http.StatusOK || diff != "" {
		t.Errorf("check of a single lease = %d (-want +got):\n%s", status, diff)
	}

	if status, out := e.do(t, http.MethodDelete, "/v1/leases/"+token, ""); status != http.StatusOK || out["outcome"] != "ok" {
		t.Errorf("release = %d %v", status, out)
	}
	if status, out := e.do(t, http.MethodPost, "/v1/leases/"+token+"/check", ""); status != http.StatusGone || out["error"] != httpjson.CodeLost {
		t.Errorf("check after release = %d %v, want 410 LEASE_LOST", status, out)
	}
}

// A lease that caps nothing books nothing among several: the answer holds the others, and
// the usual NOOP answer when none caps anything.
func TestSeveralLeasesNoop(t *testing.T) {
	e := newEnv(t, partsDefs, envOpts{})
	for path, want := range map[string]map[string]any{
		"/v1/leases": {"noop": true},
		dryRunPath:   {"noop": true, "dryRun": true},
	} {
		status, out := e.do(t, http.MethodPost, path, leasesOf("alice", "free", "free2"))
		if diff := cmp.Diff(want, out); status != http.StatusOK || diff != "" {
			t.Errorf("%s of leases that cap nothing = %d (-want +got):\n%s", path, status, diff)
		}
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("NOOP acquisitions sent %d store commands", n)
	}

	status, out := e.do(t, http.MethodPost, "/v1/leases", leasesOf("alice", "free", "gpu"))
	token, _ := out["token"].(string)
	// A part that books nothing neither answers nor shortens the TTL.
	want := map[string]any{"token": token, "noop": false, "ttlSeconds": float64(120), "leases": []any{
		map[string]any{"lease": "gpu", "resource": "gpu", "levels": gpuLevels, "fence": float64(1)},
	}}
	if diff := cmp.Diff(want, out); status != http.StatusOK || diff != "" {
		t.Errorf("acquire of free and gpu = %d (-want +got):\n%s", status, diff)
	}
}

func TestSeveralLeasesBusy(t *testing.T) {
	e := newEnv(t, partsDefs, envOpts{})
	bob := e.acquire(t, singleOf("gpu", "bob"))

	for _, path := range []string{"/v1/leases", dryRunPath} {
		status, out := e.do(t, http.MethodPost, path, leasesOf("alice", "licence", "gpu"))
		if status != http.StatusConflict {
			t.Fatalf("%s with gpu held = %d %v, want 409", path, status, out)
		}
		msg, _ := out["message"].(string)
		delete(out, "message")
		delete(out, "waitedMs")
		// The full part is named beside its level.
		want := map[string]any{"error": "LEASE_BUSY", "lease": "gpu", "resource": "gpu", "level": "global", "scope": "*",
			"count": float64(1), "cap": float64(1), "position": float64(0)}
		if diff := cmp.Diff(want, out); diff != "" || !strings.Contains(msg, "(part gpu)") {
			t.Errorf("%s busy answer %q (-want +got):\n%s", path, msg, diff)
		}
	}
	// All or none: licence, which had room, is not held.
	hs, err := e.store.ListHolders(context.Background(), leasestore.HolderFilter{})
	if err != nil || len(hs) != 1 || hs[0].Token != bob {
		t.Errorf("holders after the busy answers = %+v, %v; want bob's alone", hs, err)
	}

	// The busy answer of a single lease is as it was, byte for byte: no lease.
	raw := e.raw(t, dryRunPath, singleOf("gpu", "carol"))
	want := `{"error":"LEASE_BUSY","message":"LEASE_BUSY: resource gpu is full at level global (scope *): 1 of 1 in use, 0 waiting ahead",` +
		`"resource":"gpu","level":"global","scope":"*","count":1,"cap":1,"waitedMs":0,"position":0}` + "\n"
	if raw != want {
		t.Errorf("single busy answer:\n got %s\nwant %s", raw, want)
	}
}

func TestSeveralLeasesDryRun(t *testing.T) {
	e := newEnv(t, partsDefs, envOpts{})
	status, out := e.do(t, http.MethodPost, dryRunPath, partsBody)
	want := map[string]any{"dryRun": true, "noop": false, "ttlSeconds": float64(60), "leases": []any{
		map[string]any{"lease": "gpu", "resource": "gpu", "levels": gpuLevels},
		map[string]any{"lease": "licence", "resource": "licence", "levels": licenceLevels},
	}}
	if diff := cmp.Diff(want, out); status != http.StatusOK || diff != "" {
		t.Errorf("dry run = %d (-want +got):\n%s", status, diff)
	}
	noWrites(t, e, "a dry run of several leases")
	e.empty(t)
}

// Bodies naming leases wrongly are refused naming the field leases, by an acquisition and a
// dry run alike, and nothing reaches the store.
func TestSeveralLeasesRefused(t *testing.T) {
	e := newEnv(t, partsDefs, envOpts{})
	const fields = `"type":"tex","tenant":"acme","project":"p1","user":"alice"`
	nine := make([]string, 9)
	for i := range nine {
		nine[i] = fmt.Sprintf("l%d", i)
	}
	cases := map[string]struct{ body, message string }{
		"lease and leases":          {`{` + fields + `,"lease":"gpu","leases":["licence"]}`, "exclusive with lease and inline"},
		"inline and leases":         {`{` + fields + `,"inline":{"name":"b","levels":{"user":1}},"leases":["gpu"]}`, "exclusive with lease and inline"},
		"a duplicate":               {leasesOf("alice", "gpu", "licence", "gpu"), "names gpu twice"},
		"none":                      {leasesOf("alice", "gpu", "none"), `"none" names no lease`},
		"nine names":                {leasesOf("alice", nine...), "names 9 leases, want 1 to 8"},
		"an empty list":             {`{` + fields + `,"leases":[]}`, "names 0 leases, want 1 to 8"},
		"a bad name":                {leasesOf("alice", "gp u"), `"gp u" is not a valid lease name`},
		"not a list":                {`{` + fields + `,"leases":"gpu"}`, "must be a JSON array"},
		"two leases, one resource":  {leasesOf("alice", "gpu", "gpu-big"), "gpu and gpu-big book the same resource gpu"},
		"one resource, other order": {leasesOf("alice", "gpu-big", "licence", "gpu"), "gpu-big and gpu book the same resource gpu"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			for _, path := range []string{"/v1/leases", dryRunPath} {
				status, out := e.do(t, http.MethodPost, path, tc.body)
				msg, _ := out["message"].(string)
				if status != http.StatusBadRequest || out["error"] != httpjson.CodeInvalid || out["field"] != "leases" || !strings.Contains(msg, tc.message) {
					t.Errorf("%s = %d %v, want 400 INVALID_REQUEST naming leases with %q", path, status, out, tc.message)
				}
			}
		})
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("refused acquisitions sent %d store commands, want none", n)
	}
	e.empty(t)
}

// raw posts body to path and returns the answer's body as sent.
func (e *env) raw(t *testing.T, path, body string) string {
	t.Helper()
	resp, err := e.srv.Client().Post(e.srv.URL+path, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
