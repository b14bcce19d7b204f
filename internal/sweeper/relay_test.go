package sweeper_test

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/sweeper"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

// relaySecret is the manager's internal secret in the relay tests; each namespace's agents sign
// with relayKey(namespace).
const relaySecret = "relay-secret"

func relayKey(namespace string) string { return agentlink.AgentKey(relaySecret, namespace) }

// The relays' callers: acme's pod at 127.0.0.1, globex's at 127.0.0.2, a pod of a namespace
// of no tenant at 127.0.0.3; any other address is no pod.
var (
	acmeAgent    = lease.PodRef{Namespace: "acme", Name: "app-0", UID: "ua"}
	globexAgent  = lease.PodRef{Namespace: "globex", Name: "app-0", UID: "ug"}
	untenanted   = lease.PodRef{Namespace: "team-x", Name: "app-0", UID: "ux"}
	relayPods    = map[string]lease.PodRef{"127.0.0.1": acmeAgent, "127.0.0.2": globexAgent, "127.0.0.3": untenanted}
	relayTenants = tenancy.Static{System: "lease-system", Tenants: map[string]string{"acme": "acme", "globex": "globex"}}
)

// relayVerifier identifies callers by source address, as the manager's pod informer does.
func relayVerifier() *agentauth.Verifier {
	return agentauth.NewVerifier(func(r *http.Request) (lease.PodRef, error) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		return relayPods[host], nil
	}, relayKey)
}

// tenantDefinitions resolves name for tenant from "tenant/name" entries, as the manager's
// resolver does from each tenant's own layers; a name a tenant does not define is a NOOP.
type tenantDefinitions map[string]definition.Definition

func (d tenantDefinitions) Resolve(_ context.Context, tenant, _, name string) (definition.Definition, error) {
	return d[tenant+"/"+name], nil
}

// capped is a definition of resource with a tenant cap of 1.
func capped(name, resource string) definition.Definition {
	return definition.Definition{Name: name, Resource: resource, Caps: definition.Caps{Tenant: 1}, TTL: time.Minute}
}

// countingStore counts the relay's store calls.
type countingStore struct {
	sweeper.IdleStore
	calls atomic.Int64
}

func (c *countingStore) SweepIdle(ctx context.Context, resource string) (leasestore.IdleSweep, error) {
	c.calls.Add(1)
	return c.IdleStore.SweepIdle(ctx, resource)
}

// signedPost posts body to path on srv from the client's address, signed with key ("" : not
// signed), and returns the status and the body of the answer.
func signedPost(t *testing.T, client *http.Client, url, path, key, body string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if key != "" {
		req.Header.Set(agentauth.SignatureHeader, agentauth.Sign(key, path, []byte(body)))
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(out)
}

type recorded struct {
	mu    sync.Mutex
	calls []string // reason:token
}

func (r *recorded) Revoked(_ context.Context, reason string, holders []lease.Holder) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, h := range holders {
		r.calls = append(r.calls, reason+":"+h.Token)
	}
}

func (r *recorded) got() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.calls...)
}

func relayStore(t *testing.T) *leasestore.Store {
	t.Helper()
	return storetest.New(t)
}

func idleHolder(t *testing.T, s *leasestore.Store, resource string) lease.Holder {
	t.Helper()
	h, err := s.Acquire(context.Background(), leasestore.AcquireRequest{
		Resource: resource, Type: "tex", Tenant: "acme", TTL: 100 * time.Millisecond,
		Caps: []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}},
	})
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // real time: past the TTL on the store's clock
	return h
}

// The agent's lazy sweep goes to the manager, which reaps and dispatches through its own
// matrix; a relay answers at most once per interval per resource.
func TestRelayReapsOnTheManager(t *testing.T) {
	s := relayStore(t)
	listener := &recorded{}
	defs := tenantDefinitions{"acme/r": capped("r", "r")}
	srv := httptest.NewServer(sweeper.RelayHandler(s, listener, relayVerifier(), relayTenants, defs, sweeper.WithSweepInterval(time.Hour)))
	defer srv.Close()
	// A holder that stays: the relay tells the agent when it goes idle.
	if _, err := s.Acquire(context.Background(), leasestore.AcquireRequest{
		Resource: "r", Type: "tex", Tenant: "hooli", TTL: time.Minute,
		Caps: []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}},
	}); err != nil {
		t.Fatal(err)
	}
	h := idleHolder(t, s, "r")

	reap := sweeper.RelayReaper(srv.Client(), srv.URL, relayKey("acme"), s)
	target := leasing.SweepTarget{Resource: "r", Tenant: "acme", Project: "p", Lease: "r"}
	sw, freed, err := reap(context.Background(), target)
	if err != nil || len(sw.Reaped) != 0 || freed != 1 {
		t.Fatalf("relay = %v, %d, %v; want no holders back (the manager dispatched them) and 1 freed", sw.Reaped, freed, err)
	}
	if sw.NextExpiry <= 50*time.Second || sw.NextExpiry > time.Minute {
		t.Errorf("relay's next expiry = %v, want the staying holder's, just under a minute", sw.NextExpiry)
	}
	if diff := cmp.Diff([]string{"idle:" + h.Token}, listener.got()); diff != "" {
		t.Errorf("manager's listener (-want +got):\n%s", diff)
	}
	if err := s.Touch(context.Background(), h.Token); !errors.Is(err, lease.ErrLost) {
		t.Errorf("touch after the relayed sweep = %v, want lost", err)
	}
	// Within the interval the manager does not sweep that resource again.
	h2 := idleHolder(t, s, "r")
	if _, freed, err := reap(context.Background(), target); err != nil || freed != 0 {
		t.Fatal(err)
	}
	if err := s.Touch(context.Background(), h2.Token); err != nil {
		t.Errorf("a second relay within the interval swept again: %v", err)
	}

	for name, c := range map[string]struct{ body, field string }{
		"empty":             {`{}`, "project"},
		"no lease":          {`{"project":"p"}`, "lease"},
		"unknown field":     {`{"project":"p","lease":"r","x":1}`, "x"},
		"a resource named":  {`{"resource":"r"}`, "resource"},
		"malformed":         {`{`, "body"},
		"a bad lease name":  {`{"project":"p","lease":"a/b","inline":true}`, "lease"},
		"a bad project":     {`{"project":"../x","lease":"r"}`, "project"},
		"two objects":       {`{"project":"p","lease":"r"}{}`, "body"},
		"a number as lease": {`{"project":"p","lease":1}`, "lease"},
	} {
		status, body := signedPost(t, srv.Client(), srv.URL, sweeper.RelayPath, relayKey("acme"), c.body)
		var eb httpjson.ErrorBody
		if status != http.StatusBadRequest || json.Unmarshal([]byte(body), &eb) != nil || eb.Field != c.field {
			t.Errorf("%s: %d %s, want 400 naming %q", name, status, body, c.field)
		}
	}
}

// Without a manager, the agent sweeps itself and dispatches the holders locally.
func TestRelayFallsBackToALocalSweep(t *testing.T) {
	s := relayStore(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	h := idleHolder(t, s, "r")

	sw, _, err := sweeper.RelayReaper(nil, url, relayKey("acme"), s)(context.Background(), leasing.SweepTarget{Resource: "r", Project: "p", Lease: "r"})
	if err == nil {
		t.Error("no error for an unreachable manager")
	}
	if len(sw.Reaped) != 1 || sw.Reaped[0].Token != h.Token {
		t.Errorf("local fallback reaped %v, want the idle holder", sw.Reaped)
	}
}

// Review finding: the sweep relay answered "reaped" and "nextExpiryMs" for any resource name
// anybody sent, so a pod could probe other tenants' private resources (and each new name cost
// store reads). Now an agent names a lease, which is resolved for its own tenant: another
// tenant's lease (by its name or by its resource), or an inline lease of another tenant, is
// answered exactly as a lease that leads to no resource ({"reaped":0}), reaps nothing and
// reads nothing from the store; the same requests from that other tenant's agent do reap.
func TestRelayAnswersATenantOnlyAboutItsOwnResources(t *testing.T) {
	s := relayStore(t)
	store := &countingStore{IdleStore: s}
	listener := &recorded{}
	defs := tenantDefinitions{"globex/secret": capped("secret", "globex-private")}
	srv := httptest.NewServer(sweeper.RelayHandler(store, listener, relayVerifier(), relayTenants, defs, sweeper.WithSweepInterval(time.Hour)))
	t.Cleanup(srv.Close)
	private := idleHolder(t, s, "globex-private")
	inline := idleHolder(t, s, definition.InlineResource("globex", "p", "mine"))

	const nothing = `{"reaped":0}` + "\n"
	for name, body := range map[string]string{
		"globex's lease name":        `{"project":"p","lease":"secret"}`,
		"globex's resource as lease": `{"project":"p","lease":"globex-private"}`,
		"globex's inline lease":      `{"project":"p","lease":"mine","inline":true}`,
		"a lease nobody defines":     `{"project":"p","lease":"nosuch"}`,
	} {
		status, got := signedPost(t, srv.Client(), srv.URL, sweeper.RelayPath, relayKey("acme"), body)
		if status != http.StatusOK || got != nothing {
			t.Errorf("acme's agent asking for %s: %d %q, want 200 %q (a lease with nothing to sweep)", name, status, got, nothing)
		}
	}
	// What the relay used to take: a resource by name.
	for _, resource := range []string{"globex-private", inline.Resource} {
		body := `{"resource":"` + resource + `"}`
		if status, got := signedPost(t, srv.Client(), srv.URL, sweeper.RelayPath, relayKey("acme"), body); status != http.StatusBadRequest {
			t.Errorf("acme's agent naming globex's resource %s: %d %s, want 400", resource, status, got)
		}
	}
	for _, h := range []lease.Holder{private, inline} {
		if _, err := s.GetHolder(context.Background(), h.Token); err != nil { // a read: a touch would renew it
			t.Errorf("globex's idle holder of %s after acme's asks: %v, want still held", h.Resource, err)
		}
	}
	// Acme's inline lease of the same name is acme's own resource: swept (one store read).
	if n := store.calls.Load(); n != 1 {
		t.Errorf("store calls for acme's asks: %d, want 1 (acme's own inline resource only)", n)
	}

	// Globex's agent, from globex's pod, gets its own resources swept.
	globex := agentauth.HTTPClient("127.0.0.2")
	for _, body := range []string{`{"project":"p","lease":"secret"}`, `{"project":"p","lease":"mine","inline":true}`} {
		status, got := signedPost(t, globex, srv.URL, sweeper.RelayPath, relayKey("globex"), body)
		if status != http.StatusOK || got != `{"reaped":1}`+"\n" {
			t.Errorf("globex's agent asking for %s: %d %q, want its idle holder reaped", body, status, got)
		}
	}
	want := []string{"idle:" + private.Token, "idle:" + inline.Token}
	if diff := cmp.Diff(want, listener.got()); diff != "" {
		t.Errorf("reaped (-want +got):\n%s", diff)
	}

	// A pod of a namespace of no tenant has no lease to sweep.
	untenantedClient := agentauth.HTTPClient("127.0.0.3")
	if status, got := signedPost(t, untenantedClient, srv.URL, sweeper.RelayPath, relayKey("team-x"), `{"project":"p","lease":"secret"}`); status != http.StatusForbidden {
		t.Errorf("a pod of a namespace of no tenant: %d %s, want 403", status, got)
	}
}

// failingStore fails as a driver does, with its hosts and topology in the error.
type failingStore struct{}

const driverText = "server selection error: mongo-0.mongo.lease-system.svc:27017 (replica set rs0, primary mongo-1) unreachable"

func (failingStore) SweepIdle(context.Context, string) (leasestore.IdleSweep, error) {
	return leasestore.IdleSweep{}, errors.New(driverText)
}

// Review finding: the sweep relay answered a store error with the driver's text (hosts,
// topology). Now both relays answer a fixed text with a correlation id, and the log has the
// cause in full under that id.
func TestRelayStoreErrorIsAFixedText(t *testing.T) {
	waiter := lease.HolderID("w")
	for name, c := range map[string]struct {
		handler func(logr.Logger) http.Handler
		path    string
		body    string
	}{
		"sweep": {func(log logr.Logger) http.Handler {
			return sweeper.RelayHandler(failingStore{}, nil, relayVerifier(), relayTenants, tenantDefinitions{"acme/r": capped("r", "r")},
				sweeper.WithRelayLogger(log))
		}, sweeper.RelayPath, `{"project":"p","lease":"r"}`},
		"reclaim": {func(log logr.Logger) http.Handler {
			r := &reclaimer{answers: map[string]reclaimAnswer{waiter: {err: errors.New(driverText)}}}
			return sweeper.ReclaimRelayHandler(r, relayVerifier(), errNotOwed, sweeper.WithRelayLogger(log))
		}, sweeper.ReclaimRelayPath, `{"waiter":"` + waiter + `"}`},
	} {
		t.Run(name, func(t *testing.T) {
			var logged bytes.Buffer
			var mu sync.Mutex
			log := funcr.NewJSON(func(obj string) {
				mu.Lock()
				defer mu.Unlock()
				logged.WriteString(obj + "\n")
			}, funcr.Options{})
			srv := httptest.NewServer(c.handler(log))
			t.Cleanup(srv.Close)

			status, body := signedPost(t, srv.Client(), srv.URL, c.path, relayKey("acme"), c.body)
			var eb httpjson.ErrorBody
			if status != http.StatusServiceUnavailable || json.Unmarshal([]byte(body), &eb) != nil || eb.Error != httpjson.CodeUnavailable {
				t.Fatalf("answer %d %s, want 503 LEASE_UNAVAILABLE", status, body)
			}
			for _, leak := range []string{"mongo", "rs0", "27017", "server selection"} {
				if strings.Contains(body, leak) {
					t.Errorf("the answer carries the driver's %q: %s", leak, body)
				}
			}
			want := fmt.Sprintf("the lease store is unavailable (correlation id %s in the server's log)", eb.CorrelationID)
			if eb.CorrelationID == "" || eb.Message != want {
				t.Errorf("message %q, correlation id %q; want %q", eb.Message, eb.CorrelationID, want)
			}
			mu.Lock()
			defer mu.Unlock()
			if !strings.Contains(logged.String(), driverText) || !strings.Contains(logged.String(), `"correlationId":"`+eb.CorrelationID+`"`) {
				t.Errorf("log %s; want the driver's error under correlation id %s", logged.String(), eb.CorrelationID)
			}
		})
	}
}

// Review finding: the sweep relay checked no caller at all and the reclaim relay only the
// source address, which an app container of the pod shares. Both now answer an agent only: a
// pod, with a request signed with its namespace's agent key for this path, and nothing of
// the request reaches the store or the reclaimer otherwise.
func TestRelaysAnswerOnlyAgents(t *testing.T) {
	store := &countingStore{IdleStore: failingStore{}}
	r := &reclaimer{answers: map[string]reclaimAnswer{}}
	defs := tenantDefinitions{"acme/r": capped("r", "r")}
	mux := http.NewServeMux()
	mux.Handle(sweeper.RelayPath, sweeper.RelayHandler(store, nil, relayVerifier(), relayTenants, defs))
	mux.Handle(sweeper.ReclaimRelayPath, sweeper.ReclaimRelayHandler(r, relayVerifier(), errNotOwed, sweeper.WithRelayLogger(logr.Discard())))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	noPod := agentauth.HTTPClient("127.0.0.9")
	bodies := map[string]string{sweeper.RelayPath: `{"project":"p","lease":"r"}`, sweeper.ReclaimRelayPath: `{"waiter":"` + lease.HolderID("w") + `"}`}
	for path, body := range bodies {
		other := sweeper.ReclaimRelayPath
		if path == other {
			other = sweeper.RelayPath
		}
		for name, c := range map[string]struct {
			client *http.Client
			sign   func() string
			want   int
		}{
			"unsigned, from the pod (an app container)": {srv.Client(), func() string { return "" }, http.StatusUnauthorized},
			"signed with another namespace's key":       {srv.Client(), func() string { return agentauth.Sign(relayKey("globex"), path, []byte(body)) }, http.StatusUnauthorized},
			"signed for the other relay's path":         {srv.Client(), func() string { return agentauth.Sign(relayKey("acme"), other, []byte(body)) }, http.StatusUnauthorized},
			"signed as a forwarded revocation":          {srv.Client(), func() string { return revocationSignature(relayKey("acme"), body) }, http.StatusUnauthorized},
			"signed, from an address that is no pod":    {noPod, func() string { return agentauth.Sign(relayKey("acme"), path, []byte(body)) }, http.StatusForbidden},
		} {
			req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, srv.URL+path, strings.NewReader(body))
			if sig := c.sign(); sig != "" {
				req.Header.Set(agentauth.SignatureHeader, sig)
			}
			resp, err := c.client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != c.want {
				t.Errorf("%s %s: %s, want %d", path, name, resp.Status, c.want)
			}
		}
	}
	if n := store.calls.Load(); n != 0 {
		t.Errorf("refused sweeps reached the store %d times", n)
	}
	if len(r.asked) != 0 {
		t.Errorf("refused reclaims reached the reclaimer: %v", r.asked)
	}
}

// revocationSignature is agentlink's signature of a forwarded revocation: the body's HMAC
// under the namespace's key, the same key the agents sign with.
func revocationSignature(key, body string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}
