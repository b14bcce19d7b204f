package cli_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// partsRequest is an acquisition of several resources at once (issue 45), each part named
// after its resource and capped at 1 globally.
func partsRequest(tenant, user string, pod lease.PodRef, resources ...string) leasestore.AcquireRequest {
	req := request("", tenant, user, pod, nil)
	req.LeaseName, req.Resource = "", ""
	for _, res := range resources {
		req.Parts = append(req.Parts, leasestore.Part{LeaseName: res, Resource: res,
			Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}})
	}
	return req
}

// cells splits a table row on the runs of spaces between its columns (a cell of a waiter of
// several resources has single spaces).
func cells(line string) []string {
	return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
}

// partJSON and partsHolderJSON mirror the plugin's JSON of a holder of several resources.
type partJSON struct {
	Lease, Resource string
	Fence           int64
}

type partsHolderJSON struct {
	ID, Lease, Resource string
	Fence               int64
	Parts               []partJSON
}

// TestListAndShowTheParts: `kubectl lease list` and `show` print a holder of several
// resources with its resources and lease names joined by "+" and a fence per part, through
// the live API and from the store alike; --resource finds it by either resource; -o json
// carries the parts.
func TestListAndShowTheParts(t *testing.T) {
	s := newStore(t)
	h := mustAcquire(t, s.Store, partsRequest("acme", "ann", podA, "licence", "gpu"))
	if len(h.Parts) != 2 || h.Parts[0].Resource != "gpu" {
		t.Fatalf("parts = %+v, want gpu then licence", h.Parts)
	}
	fences := fmt.Sprintf("%d+%d", h.Parts[0].Fence, h.Parts[1].Fence)
	for _, force := range []bool{false, true} {
		for _, res := range []string{"gpu", "licence"} {
			a := args(s, "list", "--resource", res)
			if force {
				a = append(a, "--force")
			}
			r := mustRun(t, operatorEnv(), a...)
			got := columns(t, r.stdout, "ID", "RESOURCE", "TENANT", "USER", "STATE", "FENCE")
			if diff := cmp.Diff([][]string{{h.ID, "gpu+licence", "acme", "ann", "HELD", fences}}, got); diff != "" {
				t.Errorf("force %v: list --resource %s (-want +got):\n%s", force, res, diff)
			}
		}

		a := args(s, "show", h.ID)
		if force {
			a = append(a, "--force")
		}
		r := mustRun(t, operatorEnv(), a...)
		for _, want := range []string{
			"Fence:       " + fences + "\n",
			"Lease:       gpu+licence\n",
			"Resource:    gpu+licence\n",
			fmt.Sprintf("Parts:       gpu (lease gpu, fence %d), licence (lease licence, fence %d)\n", h.Parts[0].Fence, h.Parts[1].Fence),
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("force %v: show lacks %q:\n%s", force, want, r.stdout)
			}
		}
		// Both resources' counters, none missing.
		levels := r.stdout[strings.Index(r.stdout, "Levels:\n")+len("Levels:\n") : strings.Index(r.stdout, "Payload:")]
		got := columns(t, levels, "COUNTER", "COUNT", "BOOKED")
		if diff := cmp.Diff([][]string{{"gpu|global|*", "1", "1"}, {"licence|global|*", "1", "1"}}, got); diff != "" {
			t.Errorf("force %v: levels of show (-want +got):\n%s", force, diff)
		}

		a = args(s, "list", "--resource", "licence", "-o", "json")
		if force {
			a = append(a, "--force")
		}
		r = mustRun(t, operatorEnv(), a...)
		var views []partsHolderJSON
		if err := json.Unmarshal([]byte(r.stdout), &views); err != nil {
			t.Fatal(err)
		}
		want := []partsHolderJSON{{ID: h.ID, Lease: "gpu+licence", Resource: "gpu+licence", Fence: h.Parts[0].Fence,
			Parts: []partJSON{{"gpu", "gpu", h.Parts[0].Fence}, {"licence", "licence", h.Parts[1].Fence}}}}
		if diff := cmp.Diff(want, views); diff != "" {
			t.Errorf("force %v: list -o json (-want +got):\n%s", force, diff)
		}
	}
}

// TestWaitersShowWhichPart: an acquisition of disk and licence books disk and waits in the
// line of licence, which a holder of gpu+licence holds; `kubectl lease waiters` says which
// part it waits on and the set it belongs to, -o json carries both.
func TestWaitersShowWhichPart(t *testing.T) {
	s := newStore(t)
	held := mustAcquire(t, s.Store, partsRequest("globex", "bob", podB, "gpu", "licence"))
	t.Cleanup(func() { _, _ = s.Release(context.Background(), held.Token) })
	req := partsRequest("acme", "ann", podA, "licence", "disk")
	req.WaitTTL = time.Hour
	_, err := s.Acquire(ctxT(t), req)
	var lined *leasestore.WaitingError
	if !errors.As(err, &lined) {
		t.Fatalf("acquire of disk+licence: %v, want it to wait", err)
	}
	t.Cleanup(func() { _ = s.Withdraw(context.Background(), lined.Token) })
	id := lease.HolderID(lined.Token)

	for _, force := range []bool{false, true} {
		a := args(s, "waiters", "--resource", "disk")
		if force {
			a = append(a, "--force")
		}
		r := mustRun(t, operatorEnv(), a...)
		lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
		if len(lines) != 2 {
			t.Fatalf("force %v: waiters:\n%s\nwant the waiter of disk+licence", force, r.stdout)
		}
		// ID RESOURCE TENANT PROJECT USER POD LEVEL SCOPE PRIORITY POSITION EST-WAIT WAITING
		row := cells(lines[1])
		if len(row) < 10 || row[0] != id || row[1] != "licence (of disk+licence)" || row[6] != "global" || row[9] != "0" {
			t.Errorf("force %v: waiter row %q, want %s waiting on licence (of disk+licence) at global, position 0", force, row, id)
		}

		a = args(s, "waiters", "--resource", "licence", "-o", "json")
		if force {
			a = append(a, "--force")
		}
		r = mustRun(t, operatorEnv(), a...)
		var views []struct {
			ID, Resource, Lease, Level string
			Parts                      []partJSON
			WaitsOn                    *partJSON
		}
		if err := json.Unmarshal([]byte(r.stdout), &views); err != nil {
			t.Fatal(err)
		}
		if len(views) != 1 || views[0].ID != id || views[0].Resource != "disk+licence" || views[0].Lease != "disk+licence" ||
			len(views[0].Parts) != 2 || views[0].WaitsOn == nil || *views[0].WaitsOn != (partJSON{Lease: "licence", Resource: "licence"}) {
			t.Errorf("force %v: waiters -o json = %+v, want %s of disk+licence waiting on licence", force, views, id)
		}
	}
}
