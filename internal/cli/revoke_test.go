package cli_test

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/sweeper"
)

var sortStrings = cmpopts.SortSlices(func(a, b string) bool { return a < b })

// The no-handler statement of a forced revocation (docs/operations.md, "Revocation").
var noHandler = []string{
	"No handler ran",
	"the slot is free; the holder fails at its next check (LEASE_LOST); a resource in a foreign system (such as the remote MCP session of a dead pod) is left to its own expiry.",
}

func TestRevokeForceFreesTheSlotWithoutHandler(t *testing.T) {
	s := newStore(t)
	req := request("tex2pdf", "acme", "ann", podA, caps(1, 1, 1, 1))
	h := mustAcquire(t, s.Store, req)
	if _, err := s.Acquire(ctxT(t), req); !errors.Is(err, lease.ErrBusy) {
		t.Fatalf("second acquire before the revoke = %v, want busy", err)
	}
	// No manager anywhere: --force needs none.
	r := mustRun(t, nil, args(s, "revoke", h.ID, "--force")...)
	for _, want := range append([]string{
		"Revoked lease " + h.ID + " directly in MongoDB (database " + s.db + ").",
		"type tex, resource tex2pdf, tenant acme, project p, user ann, pod ns/pod-a (pod-bound)",
		"returned levels: tex2pdf|user|acme/ann, tex2pdf|project|acme/p, tex2pdf|tenant|acme, tex2pdf|global|*",
	}, noHandler...) {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("revoke --force output lacks %q:\n%s", want, r.stdout)
		}
	}

	// The state of the world: holder gone, every counter back, the slot free.
	if _, err := s.GetHolder(ctxT(t), h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("holder after revoke --force: %v, want LEASE_LOST", err)
	}
	if _, err := s.Acquire(ctxT(t), req); err != nil {
		t.Errorf("acquire after revoke --force: %v; the slot should be free", err)
	}
	mustFail(t, nil, args(s, "revoke", h.ID, "--force"), "no holder "+h.ID)
}

func TestRevokeForceJSONAndTenantBinding(t *testing.T) {
	s := newStore(t)
	h := mustAcquire(t, s.Store, request("tex2pdf", "acme", "ann", podA, caps(1, 1, 1, 1)))

	mustFail(t, nil, args(s, "revoke", h.ID, "--force", "--tenant", "globex"),
		"no holder "+h.ID+" in tenant globex")
	if diff := cmp.Diff([]string{h.Token}, holderTokens(t, s.Store)); diff != "" {
		t.Fatalf("a revoke bound to another tenant changed the holders (-want +got):\n%s", diff)
	}

	r := mustRun(t, nil, args(s, "revoke", h.Token, "--force", "--tenant", "acme", "-o", "json")...)
	type answer struct {
		Revoked  bool
		Via      string
		Handlers string
		Holder   holderJSON
	}
	// A token given is turned into its ID; the answer shows no token.
	if strings.Contains(r.stdout, h.Token) {
		t.Errorf("revoke -o json shows the token:\n%s", r.stdout)
	}
	got := decodeStrict[answer](t, r.stdout)
	if !got.Revoked || got.Via != "store" || got.Holder.ID != h.ID || !strings.Contains(got.Handlers, "No handler ran") {
		t.Errorf("revoke --force -o json = %+v", got)
	}
}

func TestRevokeThroughManager(t *testing.T) {
	s := newStore(t)
	req := request("tex2pdf", "acme", "ann", podA, caps(1, 1, 1, 1))
	h := mustAcquire(t, s.Store, req)
	m := newManager(t, s.Store)

	r := mustRun(t, m.env(), args(s, "revoke", h.ID, "--tenant", "acme")...)
	for _, want := range []string{
		"Revoked lease " + h.ID + " through the live API (namespace acme).",
		"type tex, resource tex2pdf, tenant acme, project p, user ann, pod ns/pod-a (pod-bound)",
		"The manager runs each holder's type handler through its dispatcher (reason revoke",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("revoke output lacks %q:\n%s", want, r.stdout)
		}
	}
	if strings.Contains(r.stdout, "No handler ran") {
		t.Errorf("revoke through the manager claims no handler ran:\n%s", r.stdout)
	}
	if diff := cmp.Diff([]call{{Reason: "revoke", Tokens: []string{h.Token}}}, m.listener.got()); diff != "" {
		t.Errorf("listener (-want +got):\n%s", diff)
	}
	if _, err := s.Acquire(ctxT(t), req); err != nil {
		t.Errorf("acquire after revoke: %v; the slot should be free", err)
	}

	// Revoked is gone: a clear error, and nothing is dispatched.
	mustFail(t, m.env(), args(s, "revoke", h.ID), "no holder "+h.ID)
	if n := len(m.listener.got()); n != 1 {
		t.Errorf("listener called %d times, want 1", n)
	}
}

// TestLiveAPIErrors: without a kubeconfig, or beyond what RBAC grants, the plugin says what
// to do, and nothing is revoked.
func TestLiveAPIErrors(t *testing.T) {
	s := newStore(t)
	m := newManager(t, s.Store)
	h := mustAcquire(t, s.Store, request("tex2pdf", "globex", "ann", podA, caps(1, 1, 1, 1)))
	alice := map[string]string{"KUBECONFIG": aliceFile, "LEASE_SYSTEM_NAMESPACE": systemNS}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want []string
	}{
		{name: "no kubeconfig", env: map[string]string{"KUBECONFIG": "/nonexistent/kubeconfig"},
			args: []string{"list"}, want: []string{"loading the kubeconfig", "--force"}},
		{name: "a tenant lists every namespace", env: alice,
			args: []string{"list"}, want: []string{"forbidden", "try -n NAMESPACE"}},
		{name: "a tenant revokes another tenant's holder", env: alice,
			args: []string{"revoke", h.ID, "-n", "acme"}, want: []string{"no holder " + h.ID + " in namespace acme"}},
		{name: "a tenant sweeps", env: alice,
			args: []string{"sweep"}, want: []string{"forbidden", "sweeps"}},
		{name: "a tenant revokes a pod", env: alice,
			args: []string{"revoke-pod", "ns/pod-a"}, want: []string{"forbidden", "podrevocations"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mustFail(t, tc.env, tc.args, tc.want...)
		})
	}
	if n := len(m.listener.got()); n != 0 {
		t.Errorf("listener called %d times, want 0", n)
	}
	if diff := cmp.Diff([]string{h.Token}, holderTokens(t, s.Store)); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
	// Within her namespace alice lists, with the kubeconfig alone: named with -n, or as
	// her kubeconfig's context names it.
	mine := mustAcquire(t, s.Store, request("other", "acme", "ann", podB, caps(1, 1, 1, 1)))
	r := mustRun(t, alice, "list", "-n", "acme")
	if got := columns(t, r.stdout, "ID", "TENANT"); !cmp.Equal(got, [][]string{{mine.ID, "acme"}}) {
		t.Errorf("alice's list = %v", got)
	}
	cfg, err := clientcmd.LoadFromFile(aliceFile)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Contexts[cfg.CurrentContext].Namespace = "acme"
	inAcme := filepath.Join(t.TempDir(), "alice-acme.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, inAcme); err != nil {
		t.Fatal(err)
	}
	r = mustRun(t, map[string]string{"KUBECONFIG": inAcme}, "list")
	if got := columns(t, r.stdout, "ID", "TENANT"); !cmp.Equal(got, [][]string{{mine.ID, "acme"}}) {
		t.Errorf("alice's list in her context's namespace = %v", got)
	}
}

func TestRevokePod(t *testing.T) {
	for _, force := range []bool{false, true} {
		name := "manager"
		if force {
			name = "force"
		}
		t.Run(name, func(t *testing.T) {
			s := newStore(t)
			m := newManager(t, s.Store)
			a1 := mustAcquire(t, s.Store, request("tex2pdf", "acme", "ann", podA, caps(3, 3, 3, 3)))
			a2 := mustAcquire(t, s.Store, request("tex2pdf", "acme", "bob", podA2, caps(3, 3, 3, 3)))
			b := mustAcquire(t, s.Store, request("tex2pdf", "acme", "cid", podB, caps(3, 3, 3, 3)))

			cmd := []string{"revoke-pod", "ns/pod-a"}
			if force {
				cmd = append(cmd, "--force")
			}
			r := mustRun(t, m.env(), args(s, cmd...)...)
			head, table, _ := strings.Cut(r.stdout, "\n")
			if !strings.HasPrefix(head, "Revoked 2 leases of pod ns/pod-a ") {
				t.Errorf("first line %q", head)
			}
			got := columns(t, table[:strings.LastIndex(strings.TrimSpace(table), "\n")], "ID", "USER", "POD-UID")
			want := [][]string{{a1.ID, "ann", "uid-a"}, {a2.ID, "bob", "uid-a2"}}
			if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(x, y []string) bool { return x[0] < y[0] })); diff != "" {
				t.Errorf("revoked holders (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff([]string{b.Token}, holderTokens(t, s.Store)); diff != "" {
				t.Errorf("holders left (-want +got):\n%s", diff)
			}
			var wantCalls []call
			if force {
				for _, w := range noHandler {
					if !strings.Contains(r.stdout, w) {
						t.Errorf("revoke-pod --force output lacks %q:\n%s", w, r.stdout)
					}
				}
			} else {
				wantCalls = []call{{Reason: "revoke", Tokens: []string{a1.Token, a2.Token}}}
			}
			if diff := cmp.Diff(wantCalls, m.listener.got(), sortStrings); diff != "" {
				t.Errorf("listener (-want +got):\n%s", diff)
			}

			r = mustRun(t, m.env(), args(s, cmd...)...)
			if !strings.HasPrefix(r.stdout, "Pod ns/pod-a holds no leases: nothing revoked") {
				t.Errorf("second revoke-pod: %q", r.stdout)
			}
		})
	}
}

func TestSweepAndReconcileThroughManager(t *testing.T) {
	s := newStore(t)
	m := newManager(t, s.Store)
	m.sweeper.res = sweeper.Result{Idle: 2, Pod: 1, Reconcile: leasestore.ReconcileResult{Corrected: 3, Deleted: 1}}

	r := mustRun(t, m.env(), args(s, "sweep")...)
	for _, want := range []string{
		"Sweep on the manager (through https://127.0.0.1:",
		"reaped 2 holders idle and 1 holder of dead pods; their handlers are dispatched.",
		"3 corrected (0 entries of gone holders removed), 1 deleted",
	} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("sweep output lacks %q:\n%s", want, r.stdout)
		}
	}
	r = mustRun(t, m.env(), args(s, "sweep", "-o", "json")...)
	type sweepJSON struct {
		Idle, Pod int
		Reconcile struct{ Corrected, Deleted, Repaired, Skipped int }
	}
	got := decodeStrict[sweepJSON](t, r.stdout)
	if got.Idle != 2 || got.Pod != 1 || got.Reconcile.Corrected != 3 || got.Reconcile.Deleted != 1 {
		t.Errorf("sweep -o json = %+v", got)
	}
	if n := m.sweeper.count(); n != 2 {
		t.Errorf("manager swept %d times, want 2", n)
	}

	// With a manager configured, reconcile runs there.
	r = mustRun(t, m.env(), args(s, "reconcile")...)
	if !strings.Contains(r.stdout, "Reconciled the counters on the manager (through https://127.0.0.1:") {
		t.Errorf("reconcile output: %q", r.stdout)
	}
	r = mustRun(t, m.env(), args(s, "reconcile", "-o", "json")...)
	type reconcileJSON struct {
		Corrected, Deleted, Created, Skipped int
		Via                                  string
	}
	if diff := cmp.Diff(reconcileJSON{Via: "manager"}, decodeStrict[reconcileJSON](t, r.stdout)); diff != "" {
		t.Errorf("reconcile -o json (-want +got):\n%s", diff)
	}
}

func TestStoreUnreachable(t *testing.T) {
	uri := "mongodb://ops:hunter2@127.0.0.1:1/?directConnection=true"
	for _, cmd := range [][]string{
		{"list", "--force"},
		{"counters", "--force"},
		{"show", "0123456789abcdef0123456789abcdef", "--force"},
		{"revoke", "0123456789abcdef0123456789abcdef", "--force"},
		{"revoke-pod", "ns/pod-a", "--force"},
		{"reconcile", "--force"},
	} {
		t.Run(cmd[0], func(t *testing.T) {
			r := mustFail(t, nil, append(cmd, "--mongodb-uri", uri, "--timeout", "500ms"),
				"cannot use the lease store (MongoDB mongodb://ops:xxxxx@127.0.0.1:1/?directConnection=true, database lease)",
				"LEASE_UNAVAILABLE", "--mongodb-uri")
			if strings.Contains(r.stderr, "hunter2") {
				t.Errorf("the error shows the store password: %q", r.stderr)
			}
		})
	}
}

// The actions go to the manager's system namespace. Without --system-namespace or
// $LEASE_SYSTEM_NAMESPACE the plugin finds it as the namespace of the live API's Service;
// when it is wrong, or RBAC refuses, the error says which and how to set it, never "try -n".
func TestActionsFindTheSystemNamespace(t *testing.T) {
	s := newStore(t)
	m := newManager(t, s.Store)
	admin := map[string]string{"KUBECONFIG": live.AdminKubeconfig}
	operator := map[string]string{"KUBECONFIG": operatorFile}

	for name, env := range map[string]map[string]string{"cluster admin": admin, "live-operator": operator} {
		t.Run(name, func(t *testing.T) {
			r := mustRun(t, env, args(s, "reconcile")...)
			if !strings.Contains(r.stdout, "Reconciled the counters on the manager") {
				t.Errorf("reconcile output: %q", r.stdout)
			}
			mustRun(t, env, args(s, "sweep")...)
		})
	}
	if n := m.sweeper.count(); n != 2 {
		t.Errorf("%d sweeps ran on the manager, want 2", n)
	}

	t.Run("a namespace that is not the system namespace", func(t *testing.T) {
		env := map[string]string{"KUBECONFIG": live.AdminKubeconfig, "LEASE_SYSTEM_NAMESPACE": "acme"}
		r := mustFail(t, env, args(s, "reconcile"),
			`reconciles are created in the system namespace "`+systemNS+`" only`,
			"acme is not the manager's system namespace (it came from $LEASE_SYSTEM_NAMESPACE)",
			"pass --system-namespace NAMESPACE or set LEASE_SYSTEM_NAMESPACE=NAMESPACE")
		if strings.Contains(r.stderr, "try -n") {
			t.Errorf("stderr suggests -n: %q", r.stderr)
		}
	})
	t.Run("a tenant, whom RBAC refuses", func(t *testing.T) {
		r := mustFail(t, map[string]string{"KUBECONFIG": aliceFile}, args(s, "sweep"),
			"RBAC does not let you create sweeps in namespace lease-operator-system",
			"the live-operator ClusterRole grants it",
			"the APIService v1alpha1.live.lease.vancetope.io could not be read",
			"pass --system-namespace or set LEASE_SYSTEM_NAMESPACE")
		if strings.Contains(r.stderr, "try -n") {
			t.Errorf("stderr suggests -n: %q", r.stderr)
		}
	})
}
