package main

import (
	"cmp"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/serving"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// The callers of TestInternalRoutesAnswerOnlyAgents, by source address: a tenant's pod, a
// replica of the manager (in the system namespace), and an address that is no pod.
const (
	acmeAddr    = "10.0.0.1"
	replicaAddr = "10.0.0.2"
	noPodAddr   = "10.0.0.9"
)

// Review finding (security issue, internal endpoints): the sweep relay checked no caller and
// the reclaim relay only the source address, which an app container shares with its agent.
// Every /internal route of the manager's admission port, as the manager builds it, now answers
// only the senders it is for: a pod's agent, signed with its namespace's key, for the agents'
// routes; a replica of the manager, signed with the manager's namespace's key, for forwarded
// revocations. Anybody else gets 401 or 403, with --allow-non-pod-callers off and on; the flag
// opens the admission API to callers that are no pod, and nothing else.
func TestInternalRoutesAnswerOnlyAgents(t *testing.T) {
	const secret = "internal-secret"
	key := func(namespace string) string { return agentlink.AgentKey(secret, namespace) }
	self := lease.PodRef{Namespace: "lease-system", Name: "manager-0", UID: "u-m0"}
	pods := map[string]lease.PodRef{
		acmeAddr:    {Namespace: "acme", Name: "app-0", UID: "u-a"},
		replicaAddr: {Namespace: "lease-system", Name: "manager-1", UID: "u-m1"},
	}
	identify := func(r *http.Request) (lease.PodRef, error) {
		host, _, _ := strings.Cut(r.RemoteAddr, ":")
		return pods[host], nil
	}
	store := storetest.New(t)
	builtins, err := definition.LoadBuiltins(nil) // tex
	if err != nil {
		t.Fatal(err)
	}
	resolver := definition.NewResolver(builtins, nil)
	tenants := tenancy.Static{System: self.Namespace, Tenants: map[string]string{"acme": "acme"}}
	hub := notify.NewHub(time.Minute, clock.RealClock{})
	registry := handlers.NewDefaultRegistry(hub, nil, nil)
	parts := admissionParts{svc: leasing.NewService(store, resolver, registry), store: store, resolver: resolver, tenants: tenants,
		identify: identify, versions: deflink.NewVersions(), hub: hub, self: self, registry: registry}

	// What each internal route's own senders send, and who they are.
	revocation := fmt.Sprintf(`{"token":"%s","type":"tex","resource":"tex","reason":"idle","pod":{"namespace":"acme","name":"app-0"}}`,
		strings.Repeat("ab", 16))
	type sender struct {
		addr, body string
		sign       func(path, body string) string
	}
	agentSigned := func(ns string) func(path, body string) string {
		return func(path, body string) string { return agentauth.Sign(key(ns), path, []byte(body)) }
	}
	revocationSigned := func(ns string) func(path, body string) string {
		return func(_, body string) string { return bodyHMAC(key(ns), body) }
	}
	own := map[string]sender{
		deflink.ResolvePath:      {acmeAddr, `{"tenant":"acme","project":"web","name":"tex"}`, agentSigned("acme")},
		deflink.WatchPath:        {acmeAddr, `{"version":""}`, agentSigned("acme")},
		sweeper.RelayPath:        {acmeAddr, `{"project":"web","lease":"tex"}`, agentSigned("acme")},
		sweeper.ReclaimRelayPath: {acmeAddr, `{"waiter":"` + lease.HolderID("w") + `"}`, agentSigned("acme")},
		agentlink.ReceiverPath:   {replicaAddr, revocation, revocationSigned(self.Namespace)},
	}
	header := map[string]string{agentlink.ReceiverPath: agentlink.SignatureHeader}
	post := func(h http.Handler, path, addr, body, sig string) int {
		req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
		req.RemoteAddr = addr + ":40000"
		if sig != "" {
			req.Header.Set(cmp.Or(header[path], agentauth.SignatureHeader), sig)
		}
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		return w.Code
	}

	for _, allowNonPod := range []bool{false, true} {
		t.Run(fmt.Sprintf("allow-non-pod-callers=%v", allowNonPod), func(t *testing.T) {
			f := managerFlags{allowNonPod: allowNonPod}
			f.store.Secret = secret
			h := admissionHandlers(f, parts)
			mux := serving.Routes(h)
			var internal []string
			for _, r := range serving.RouteTable(h) {
				if strings.HasPrefix(r.Path, "/internal/") {
					internal = append(internal, r.Path)
				}
			}
			slices.Sort(internal)
			if want := slices.Sorted(maps.Keys(own)); !slices.Equal(internal, want) {
				t.Fatalf("internal routes %v; this test covers %v: add the new route's senders", internal, want)
			}
			for _, path := range internal {
				s := own[path]
				other := sweeper.RelayPath
				if path == other {
					other = sweeper.ReclaimRelayPath
				}
				got := map[string]int{
					"its own sender":                         post(mux, path, s.addr, s.body, s.sign(path, s.body)),
					"unsigned, from its sender's address":    post(mux, path, s.addr, s.body, ""),
					"signed with a tenant's other namespace": post(mux, path, s.addr, s.body, agentSigned("globex")(path, s.body)),
					"signed, from an address that is no pod": post(mux, path, noPodAddr, s.body, s.sign(path, s.body)),
				}
				// The other protocol's signature under the right key: an agent's request signed
				// as a forwarded revocation, a forwarded revocation signed as an agent's request.
				// A forwarded revocation's signature covers the body alone (its path is the
				// same on every receiver); an agent's covers the path too.
				if path == agentlink.ReceiverPath {
					got["signed as an agent's request"] = post(mux, path, s.addr, s.body, agentSigned(self.Namespace)(path, s.body))
					got["signed, from a tenant's pod"] = post(mux, path, acmeAddr, s.body, s.sign(path, s.body))
				} else {
					got["signed as a forwarded revocation"] = post(mux, path, s.addr, s.body, revocationSigned("acme")(path, s.body))
					got["signed for another path"] = post(mux, path, s.addr, s.body, s.sign(other, s.body))
				}
				if code := got["its own sender"]; code == http.StatusUnauthorized || code == http.StatusForbidden {
					t.Errorf("%s refused its own sender: %d", path, code)
				}
				delete(got, "its own sender")
				for name, code := range got {
					if code != http.StatusUnauthorized && code != http.StatusForbidden {
						t.Errorf("%s %s: %d, want 401 or 403", path, name, code)
					}
				}
			}

			// The flag does reach the admission API: a caller that is no pod may acquire only
			// with it.
			body := `{"type":"tex","lease":"tex","tenant":"acme","project":"web","user":"u"}`
			want := http.StatusForbidden
			if allowNonPod {
				want = http.StatusOK
			}
			if code := post(mux, httpapi.PathLeases, noPodAddr, body, ""); code != want {
				t.Errorf("acquire from an address that is no pod: %d, want %d", code, want)
			}
		})
	}
}

// bodyHMAC is agentlink's signature of a forwarded revocation: the body's HMAC under the key.
func bodyHMAC(key, body string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}
