package liveapi_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// partsRequest is tenant acme's acquisition of several resources at once for the manager's
// pod, one part per lease name and resource, each capped at the global level.
func partsRequest(user string, globalCap int, parts ...[2]string) leasestore.AcquireRequest {
	req := leasestore.AcquireRequest{Tenant: "acme", Project: "p1", User: user, Type: "tex", Pod: self, PodBound: true, TTL: time.Hour}
	for _, p := range parts {
		req.Parts = append(req.Parts, leasestore.Part{LeaseName: p[0], Resource: p[1],
			Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: globalCap}}})
	}
	return req
}

// TestKubectlShowsTheParts: a holder of several resources (issue 45) is one leaseholder whose
// LEASE and RESOURCE join its parts' names and resources, FENCE one fence per part; its
// object carries the parts with their fences; a selector on any part's resource finds it,
// an inequality on one leaves it out; another tenant does not see it.
func TestKubectlShowsTheParts(t *testing.T) {
	h, err := store.Acquire(ctxT(t), partsRequest("u1", 1<<20, [2]string{"licence", "kp-licence"}, [2]string{"gpu", "kp-gpu"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), h.Token) })
	if len(h.Parts) != 2 {
		t.Fatalf("parts = %+v, want two", h.Parts)
	}
	fences := fmt.Sprintf("%d+%d", h.Parts[0].Fence, h.Parts[1].Fence)

	for _, sel := range []string{"-l=live.lease.vancetope.io/resource=kp-licence", "--field-selector=spec.resource=kp-gpu"} {
		out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lh", sel, "-o", "wide")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl get lh %s:\n%s\nwant the holder of both resources", sel, out)
		}
		row := fields(lines[1])
		if len(row) < 14 || row[0] != h.ID || row[1] != "kp-gpu+kp-licence" || row[8] != fences || row[13] != "gpu+licence" {
			t.Errorf("kubectl get lh %s: row %q, want %s with RESOURCE kp-gpu+kp-licence, FENCE %s, LEASE gpu+licence", sel, row, h.ID, fences)
		}
	}
	for _, sel := range []string{"-l=live.lease.vancetope.io/resource!=kp-gpu", "--field-selector=spec.resource!=kp-licence"} {
		if out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lh", sel, "-o", "name"); strings.Contains(out, h.ID) {
			t.Errorf("kubectl get lh %s lists the holder of kp-gpu+kp-licence:\n%s", sel, out)
		}
	}

	out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "leaseholder", h.ID, "-o",
		"jsonpath={.spec.lease} {.spec.resource} {.spec.parts[*].lease} {.spec.parts[*].resource} {.status.parts[*].resource} {.status.parts[*].fence} {.status.fence}")
	want := fmt.Sprintf("gpu+licence kp-gpu+kp-licence gpu licence kp-gpu kp-licence kp-gpu kp-licence %d %d %d",
		h.Parts[0].Fence, h.Parts[1].Fence, h.Parts[0].Fence)
	if out != want {
		t.Errorf("the object:\n got %q\nwant %q", out, want)
	}

	// Tenancy is the holder's: not in globex, whatever it books.
	if _, errOut, err := kubectl(t, bobFile, "-n", nsGlobex, "get", "leaseholder", h.ID); err == nil || !strings.Contains(errOut, "NotFound") {
		t.Errorf("bob gets acme's holder in globex: err %v, %s; want NotFound", err, errOut)
	}
	if out := mustKubectl(t, bobFile, "-n", nsGlobex, "get", "lh", "-l=live.lease.vancetope.io/resource=kp-gpu", "-o", "name"); strings.TrimSpace(out) != "" {
		t.Errorf("bob lists in globex:\n%s\nwant nothing", out)
	}
}

// TestKubectlShowsWhichPartAWaiterWaitsOn: an acquisition of two resources holds the first
// (kw-gpu) and waits in the line of the second (kw-lic, held by globex); its leasewaiter
// says which part it waits on and which set it belongs to, and its position is in that
// part's line.
func TestKubectlShowsWhichPartAWaiterWaitsOn(t *testing.T) {
	single, err := store.Acquire(ctxT(t), leasestore.AcquireRequest{LeaseName: "lic", Resource: "kw-lic", Tenant: "globex", Project: "p1",
		User: "g1", Type: "tex", Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}, Pod: self, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), single.Token) })
	req := partsRequest("u1", 1, [2]string{"gpu", "kw-gpu"}, [2]string{"lic", "kw-lic"})
	req.WaitTTL = time.Hour
	_, err = store.Acquire(ctxT(t), req)
	var lined *leasestore.WaitingError
	if !errors.As(err, &lined) {
		t.Fatalf("acquisition of kw-gpu+kw-lic: %v, want it to wait", err)
	}
	t.Cleanup(func() { _ = store.Withdraw(context.Background(), lined.Token) })
	id := lease.HolderID(lined.Token)

	// Found by either resource, the one it holds and the one it waits on.
	for _, res := range []string{"kw-gpu", "kw-lic"} {
		out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lw", "-l=live.lease.vancetope.io/resource="+res, "-o", "wide")
		lines := strings.Split(strings.TrimSpace(out), "\n")
		if len(lines) != 2 {
			t.Fatalf("kubectl get lw for %s:\n%s\nwant the waiter of kw-gpu+kw-lic", res, out)
		}
		// NAME RESOURCE PROJECT USER POD LEVEL SCOPE POSITION EST-WAIT WAITING TENANT LEASE
		row := fields(lines[1])
		if len(row) < 12 || row[0] != id || row[1] != "kw-lic (of kw-gpu+kw-lic)" || row[5] != "global" || row[7] != "0" ||
			row[11] != "lic (of gpu+lic)" {
			t.Errorf("kubectl get lw for %s: row %q, want %s waiting on kw-lic (of kw-gpu+kw-lic) at global, position 0, lease lic (of gpu+lic)", res, row, id)
		}
	}
	out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "leasewaiter", id, "-o",
		"jsonpath={.spec.resource} {.spec.parts[*].resource} {.status.resource} {.status.lease} {.status.key}")
	if want := "kw-gpu+kw-lic kw-gpu kw-lic kw-lic lic kw-lic|global|*"; out != want {
		t.Errorf("the waiter object:\n got %q\nwant %q", out, want)
	}
	if out := mustKubectl(t, bobFile, "-n", nsGlobex, "get", "lw", "-o", "name"); strings.Contains(out, id) {
		t.Errorf("bob sees acme's waiter in globex:\n%s", out)
	}
}
