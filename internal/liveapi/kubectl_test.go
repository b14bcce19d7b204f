package liveapi_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// kubectl runs the real kubectl binary with kubeconfig and returns its output.
func kubectl(t *testing.T, kubeconfig string, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	bin, err := exec.LookPath("kubectl")
	if err != nil {
		t.Fatalf("kubectl is needed for these tests (the development and CI machines have /usr/bin/kubectl): %v", err)
	}
	var out, errOut bytes.Buffer
	cmd := exec.CommandContext(ctxT(t), bin, append([]string{"--kubeconfig", kubeconfig}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.String(), errOut.String(), err
}

func mustKubectl(t *testing.T, kubeconfig string, args ...string) string {
	t.Helper()
	out, errOut, err := kubectl(t, kubeconfig, args...)
	if err != nil {
		t.Fatalf("kubectl %s: %v\n%s", strings.Join(args, " "), err, errOut)
	}
	return out
}

// fields splits a table line on runs of spaces.
func fields(line string) []string {
	return regexp.MustCompile(`\s{2,}`).Split(strings.TrimSpace(line), -1)
}

// TestKubectl drives the real kubectl as a tenant user: get with the server's columns,
// -o wide, -o yaml and delete (a revocation); watch_test.go watches.
func TestKubectl(t *testing.T) {
	res := "kc"
	h := acquire(t, "acme", res, "u1")
	sel := "-l=live.lease.vancetope.io/resource=" + res

	out := mustKubectl(t, aliceFile, "-n", nsAcme, "get", "leaseholders", sel)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 {
		t.Fatalf("kubectl get leaseholders printed %d lines, want header and one row:\n%s", len(lines), out)
	}
	wantHeader := []string{"NAME", "RESOURCE", "PROJECT", "USER", "TYPE", "POD", "ALIVE", "STATE", "FENCE", "AGE", "IDLE", "TTL"}
	if got := fields(lines[0]); strings.Join(got, " ") != strings.Join(wantHeader, " ") {
		t.Errorf("header = %q, want %q", got, wantHeader)
	}
	row := fields(lines[1])
	wantRow := []string{h.ID, res, "p1", "u1", "tex", self.String(), "True", string(lease.StateHeld), strconv.FormatInt(h.Fence, 10)}
	if len(row) != len(wantHeader) || strings.Join(row[:len(wantRow)], " ") != strings.Join(wantRow, " ") || row[11] != "60m" {
		t.Errorf("row = %q, want %q then age, idle, TTL 60m", row, wantRow)
	}

	// The short name and -o wide.
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lh", sel, "-o", "wide")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	header := fields(lines[0])
	if got := strings.Join(header[len(wantHeader):], " "); got != "TENANT LEASE POD-BOUND HOLDER-REF LEVELS BORROWED" {
		t.Errorf("wide columns = %q", got)
	}
	if row := fields(lines[1]); len(row) < 14 || row[12] != "acme" || row[13] != res {
		t.Errorf("wide row = %q, want tenant acme and lease %s", row, res)
	}

	out = mustKubectl(t, aliceFile, "-n", nsAcme, "get", "leaseholder", h.ID, "-o", "yaml")
	for _, want := range []string{
		"apiVersion: live.lease.vancetope.io/v1alpha1", "kind: LeaseHolder", "name: " + h.ID,
		"namespace: acme", "tenant: acme", "resource: " + res, "state: HELD", "podAlive: \"True\"",
		"live.lease.vancetope.io/user: u1",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("-o yaml lacks %q:\n%s", want, out)
		}
	}

	// Counters: the tenant's levels, no global; BORROWED counts the holder granted above the
	// tenant cap of 1 (docs/borrowing.md).
	b, err := store.Acquire(ctxT(t), leasestore.AcquireRequest{
		LeaseName: res, Resource: res, Tenant: "acme", Project: "p1", User: "u2", Type: "tex",
		Caps: []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}, {Level: lease.LevelGlobal, Cap: 1 << 20}},
		Pod:  self, PodBound: true, TTL: time.Hour, Borrow: &leasestore.Borrow{},
	})
	if err != nil || !b.Borrowed {
		t.Fatalf("borrowing acquisition: %v, borrowed %v", err, b.Borrowed)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), b.Token) })
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lc", sel)
	if !strings.Contains(out, res+".tenant.acme") || strings.Contains(out, res+".global") {
		t.Errorf("kubectl get lc in acme:\n%s", out)
	}
	borrowed := map[string]string{}
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if got := strings.Join(fields(lines[0]), " "); got != "NAME RESOURCE LEVEL SCOPE COUNT CAP BOOKED DRIFT BORROWED WAITING UPDATED" {
		t.Fatalf("counter header = %q", got)
	}
	for _, l := range lines[1:] {
		// DRIFT is empty without drift, so BORROWED is the 8th field of a row.
		f := fields(l)
		borrowed[f[0]] = f[7]
	}
	if d := cmp.Diff(map[string]string{res + ".tenant.acme": "1", res + ".project.acme:p1": "0", res + ".user.acme:u1": "0"}, borrowed); d != "" {
		t.Errorf("BORROWED column (-want +got):\n%s", d)
	}

	// Bob may not delete in acme; alice may.
	_, errOut, err := kubectl(t, bobFile, "-n", nsAcme, "delete", "leaseholder", h.ID)
	if err == nil || !strings.Contains(errOut, "forbidden") {
		t.Errorf("bob deletes in acme: err %v, stderr %q; want forbidden", err, errOut)
	}
	// A server-side dry run answers and changes nothing.
	mustKubectl(t, aliceFile, "-n", nsAcme, "delete", "leaseholder", h.ID, "--dry-run=server")
	if err := store.Touch(ctxT(t), h.Token); err != nil {
		t.Fatalf("holder after a dry-run delete: %v, want held", err)
	}
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "delete", "leaseholder", h.ID)
	if want := `leaseholder.live.lease.vancetope.io "` + h.ID + `" deleted`; strings.TrimSpace(out) != want {
		t.Errorf("kubectl delete printed %q, want %q", out, want)
	}
	if err := store.Touch(ctxT(t), h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("check after kubectl delete: %v, want ErrLost", err)
	}
}

// TestExplain: the generated OpenAPI reaches kubectl explain through the aggregator.
func TestExplain(t *testing.T) {
	var out, errOut string
	var err error
	// The aggregator fetches the OpenAPI of a new APIService in the background.
	deadline := time.Now().Add(90 * time.Second)
	for {
		out, errOut, err = kubectl(t, env.AdminKubeconfig, "explain", "leaseholders.spec.podBound")
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(time.Second) // real time: polling the aggregator's OpenAPI, as Eventually does (bounded by deadline)
	}
	if err != nil || !strings.Contains(out, "dies with its pod") {
		t.Errorf("kubectl explain: err %v\n%s%s", err, out, errOut)
	}
}

// TestNamesCollideWithNothing: bare "leases" stays coordination.k8s.io's, and the short
// names lh, lc and lw name one resource each.
func TestNamesCollideWithNothing(t *testing.T) {
	out := mustKubectl(t, env.AdminKubeconfig, "api-resources", "--no-headers")
	short := map[string][]string{}
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		f := strings.Fields(line)
		if len(f) == 5 { // NAME SHORTNAMES APIVERSION NAMESPACED KIND
			for _, s := range strings.Split(f[1], ",") {
				short[s] = append(short[s], f[0]+"."+f[2])
			}
		}
		if len(f) > 0 && f[0] == "leases" && !strings.HasPrefix(f[len(f)-3], "coordination.k8s.io/") {
			t.Errorf("a resource named leases outside coordination.k8s.io: %q", line)
		}
	}
	for _, s := range []string{"lh", "lc", "lw"} {
		if len(short[s]) != 1 {
			t.Errorf("short name %s names %v, want exactly one resource", s, short[s])
		}
	}
	out = mustKubectl(t, env.AdminKubeconfig, "get", "leases", "-A", "-o", "jsonpath={.items[*].apiVersion}")
	if strings.Contains(out, "live.lease") {
		t.Errorf("kubectl get leases lists live objects: %q", out)
	}
}

// TestKubectlWaiters: while acquisitions wait in a full level's line, `kubectl get
// leasewaiters -A` (the real kubectl, as the cluster operator) shows each with its level,
// scope and position, and a tenant user sees its own tenant's waiter in its namespace, with
// globex's waiter ahead counted in its position but not shown. When the slot is handed over
// the waiter is gone from the list.
func TestKubectlWaiters(t *testing.T) {
	res := "kw"
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}
	req := func(tenant, user string) leasestore.AcquireRequest {
		return leasestore.AcquireRequest{LeaseName: res, Resource: res, Tenant: tenant, Project: "p1", User: user, Type: "tex",
			Caps: caps, Pod: self, TTL: time.Hour, WaitTTL: time.Hour}
	}
	first, err := store.Acquire(ctxT(t), req("acme", "u0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), first.Token) })
	var waiting []string
	for _, w := range []struct{ tenant, user string }{{"globex", "g1"}, {"acme", "u1"}} {
		_, err := store.Acquire(ctxT(t), req(w.tenant, w.user))
		var lined *leasestore.WaitingError
		if !errors.As(err, &lined) {
			t.Fatalf("acquire for %s/%s: %v, want it to wait in line", w.tenant, w.user, err)
		}
		waiting = append(waiting, lined.Token)
		t.Cleanup(func() { _ = store.Withdraw(context.Background(), lined.Token) })
	}
	sel := "-l=live.lease.vancetope.io/resource=" + res

	out := mustKubectl(t, operatorFile, "get", "leasewaiters", "-A", sel)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	wantHeader := []string{"NAMESPACE", "NAME", "RESOURCE", "PROJECT", "USER", "POD", "LEVEL", "SCOPE", "POSITION", "EST-WAIT", "WAITING"}
	if len(lines) != 3 || strings.Join(fields(lines[0]), " ") != strings.Join(wantHeader, " ") {
		t.Fatalf("kubectl get leasewaiters -A:\n%s\nwant header %q and two rows", out, wantHeader)
	}
	for i, want := range []struct{ ns, id, user, position string }{
		{nsGlobex, lease.HolderID(waiting[0]), "g1", "0"},
		{nsAcme, lease.HolderID(waiting[1]), "u1", "1"},
	} {
		row := fields(lines[i+1])
		if len(row) != len(wantHeader) || row[0] != want.ns || row[1] != want.id || row[4] != want.user ||
			row[6] != "global" || row[7] != "*" || row[8] != want.position {
			t.Errorf("row %d = %q, want %s's waiter %s of %s at global * position %s", i, row, want.ns, want.id, want.user, want.position)
		}
	}

	// The short name, as a tenant user: acme's waiter only, one ahead of it.
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "get", "lw", sel, "-o", "wide")
	lines = strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 2 || !strings.Contains(lines[1], lease.HolderID(waiting[1])) || strings.Contains(out, "g1") {
		t.Fatalf("alice's kubectl get lw in acme:\n%s\nwant acme's waiter only", out)
	}
	if row := fields(lines[1]); row[7] != "1" || row[10] != "acme" || row[12] != "1" || row[14] != "0" {
		t.Errorf("alice's row %q: want position 1, tenant acme, cap 1, priority 0", row)
	}
	out = mustKubectl(t, aliceFile, "-n", nsAcme, "get", "leasewaiter", lease.HolderID(waiting[1]), "-o", "yaml")
	for _, want := range []string{"kind: LeaseWaiter", "level: global", "position: 1", "tenant: acme", "user: u1"} {
		if !strings.Contains(out, want) {
			t.Errorf("-o yaml lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, waiting[1]) {
		t.Errorf("-o yaml shows the waiter's token:\n%s", out)
	}

	// The release hands the slot to globex's waiter: it is a holder now, not a waiter.
	if _, err := store.Release(ctxT(t), first.Token); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), waiting[0]) })
	out = mustKubectl(t, operatorFile, "get", "lw", "-A", sel, "--no-headers")
	if rows := strings.Split(strings.TrimSpace(out), "\n"); len(rows) != 1 || !strings.Contains(rows[0], lease.HolderID(waiting[1])) ||
		fields(rows[0])[8] != "0" {
		t.Errorf("after the hand-over:\n%s\nwant acme's waiter alone, first in line", out)
	}
}

// TestKubectlCreatesAReview: a tenant user asks with kubectl alone what an acquisition would
// answer, as `kubectl create -f` of a LeaseAcquisitionReview, and reads the answer; `kubectl
// auth can-i` says the viewer role grants it.
func TestKubectlCreatesAReview(t *testing.T) {
	file := filepath.Join(t.TempDir(), "review.yaml")
	if err := os.WriteFile(file, []byte(`apiVersion: live.lease.vancetope.io/v1alpha1
kind: LeaseAcquisitionReview
metadata: {generateName: ask-}
spec: {lease: capped, project: p1, user: kim}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	// kubectl looks for server-side field validation on a resource's PATCH operation; a
	// create-only resource has none, so kubectl would validate on the client and first ask
	// whether the kind is a CRD, which a tenant user may not list (docs/live-api.md).
	out := mustKubectl(t, aliceFile, "-n", nsAcme, "create", "--validate=false", "-f", file, "-o", "jsonpath={.status.outcome} {.status.tenant} {.status.levels[0].scope}")
	if out != "granted acme acme/kim" {
		t.Errorf("kubectl create of a review answered %q, want granted for acme/kim", out)
	}
	if out, _, _ := kubectl(t, aliceFile, "auth", "can-i", "create", "leaseacquisitionreviews", "-n", nsAcme); strings.TrimSpace(out) != "yes" {
		t.Errorf("can alice create leaseacquisitionreviews in acme: %q, want yes", out)
	}
	if out, _, _ := kubectl(t, aliceFile, "auth", "can-i", "create", "leaseacquisitionreviews", "-n", nsGlobex); strings.TrimSpace(out) != "no" {
		t.Errorf("can alice create leaseacquisitionreviews in globex: %q, want no", out)
	}
	// Nothing is kept: even a cluster administrator has nothing to get.
	if _, errOut, err := kubectl(t, env.AdminKubeconfig, "-n", nsAcme, "get", "leaseacquisitionreviews"); err == nil || !strings.Contains(errOut, "MethodNotAllowed") {
		t.Errorf("kubectl get leaseacquisitionreviews: err %v, %s; want MethodNotAllowed", err, errOut)
	}
}
