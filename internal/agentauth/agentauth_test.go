package agentauth_test

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
)

const (
	secret = "internal-secret"
	path   = "/internal/lease/sweep"
	body   = `{"project":"web","lease":"tex"}`
)

var acmePod = lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u1"}

func key(namespace string) string { return agentlink.AgentKey(secret, namespace) }

func TestAuthenticate(t *testing.T) {
	acme := func(*http.Request) (lease.PodRef, error) { return acmePod, nil }
	cases := map[string]struct {
		identify       agentauth.PodIdentity
		signature      string
		body           string
		wantStatus     int
		wantCode       string
		wantRetryAfter string
	}{
		"an agent": {identify: acme, signature: agentauth.Sign(key("acme"), path, []byte(body)), wantStatus: http.StatusOK},
		"unsigned": {identify: acme, wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"signed with another namespace's key": {identify: acme, signature: agentauth.Sign(key("globex"), path, []byte(body)),
			wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"signed for another path": {identify: acme, signature: agentauth.Sign(key("acme"), "/internal/lease/reclaim", []byte(body)),
			wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"signed for another body": {identify: acme, signature: agentauth.Sign(key("acme"), path, []byte(`{}`)),
			wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"signed as a forwarded revocation": {identify: acme, signature: bodyHMAC(key("acme"), body),
			wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"no pod": {identify: func(*http.Request) (lease.PodRef, error) { return lease.PodRef{}, nil },
			signature: agentauth.Sign(key("acme"), path, []byte(body)), wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"not identified now": {identify: func(*http.Request) (lease.PodRef, error) {
			return lease.PodRef{}, lease.Unavailable("identifying", errors.New("API server down"))
		}, signature: agentauth.Sign(key("acme"), path, []byte(body)), wantStatus: http.StatusServiceUnavailable, wantCode: httpjson.CodeUnavailable},
		"over the unknown-caller limit": {identify: func(*http.Request) (lease.PodRef, error) {
			return lease.PodRef{}, lease.Unavailable("identifying", liveness.ErrLookupLimited)
		}, signature: agentauth.Sign(key("acme"), path, []byte(body)), wantStatus: http.StatusServiceUnavailable,
			wantCode: httpjson.CodeUnavailable, wantRetryAfter: "1"},
		"a body over the bound": {identify: acme, body: strings.Repeat("x", agentauth.MaxBodyBytes+1),
			wantStatus: http.StatusBadRequest, wantCode: httpjson.CodeInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			v := agentauth.NewVerifier(tc.identify, key)
			b := body
			if tc.body != "" {
				b = tc.body
			}
			req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(b))
			if tc.signature != "" {
				req.Header.Set(agentauth.SignatureHeader, tc.signature)
			}
			w := httptest.NewRecorder()
			got, gotBody, ok := v.Authenticate(w, req)
			if tc.wantStatus == http.StatusOK {
				if !ok || got != acmePod || string(gotBody) != body {
					t.Fatalf("Authenticate = %v, %q, %v; want acme's pod and the body (answer %d %s)", got, gotBody, ok, w.Code, w.Body)
				}
				return
			}
			var eb httpjson.ErrorBody
			if ok || w.Code != tc.wantStatus || json.Unmarshal(w.Body.Bytes(), &eb) != nil || eb.Error != tc.wantCode {
				t.Errorf("Authenticate = %v; answer %d %s, want %d %s", ok, w.Code, w.Body, tc.wantStatus, tc.wantCode)
			}
			if got := w.Header().Get("Retry-After"); got != tc.wantRetryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.wantRetryAfter)
			}
		})
	}
}

// A namespace without a key (a manager without an internal secret) is refused, signed or not.
func TestAuthenticateWithoutAKey(t *testing.T) {
	v := agentauth.NewVerifier(func(*http.Request) (lease.PodRef, error) { return acmePod, nil }, func(string) string { return "" })
	req := httptest.NewRequest(http.MethodPost, path, strings.NewReader(body))
	req.Header.Set(agentauth.SignatureHeader, agentauth.Sign("", path, []byte(body)))
	w := httptest.NewRecorder()
	if _, _, ok := v.Authenticate(w, req); ok || w.Code != http.StatusUnauthorized {
		t.Errorf("Authenticate = %v, %d; want refused with 401", ok, w.Code)
	}
}

// The signature is the one deflink signed with before agentauth took its check over: agents
// injected before an upgrade keep verifying against a new manager (a changed prefix would cut
// every agent off its definitions until its pod is restarted).
func TestSignIsDeflinksSignature(t *testing.T) {
	got := agentauth.Sign("k", "/internal/lease/definitions/resolve", []byte(`{"tenant":"acme","project":"web","name":"tex"}`))
	if want := "97daaa8311e63ee4f870ef0ae4fdcca41266ff1bf9d19a5a335341966075c836"; got != want {
		t.Errorf("Sign = %s, want %s", got, want)
	}
}

// From lets only pods of one namespace through (the manager's replicas, for forwarded
// revocations on its admission port).
func TestFrom(t *testing.T) {
	replica := lease.PodRef{Namespace: "lease-system", Name: "manager-1", UID: "m1"}
	for name, c := range map[string]struct {
		pod       lease.PodRef
		namespace string
		want      int
	}{
		"a replica":                {replica, "lease-system", http.StatusOK},
		"a tenant's pod":           {acmePod, "lease-system", http.StatusForbidden},
		"no pod":                   {lease.PodRef{}, "lease-system", http.StatusForbidden},
		"a manager that is no pod": {replica, "", http.StatusForbidden},
	} {
		t.Run(name, func(t *testing.T) {
			v := agentauth.NewVerifier(func(*http.Request) (lease.PodRef, error) { return c.pod, nil }, key)
			w := httptest.NewRecorder()
			ok := v.From(c.namespace)(w, httptest.NewRequest(http.MethodPost, agentlink.ReceiverPath, nil))
			got := w.Code
			if ok {
				got = http.StatusOK
			}
			if diff := cmp.Diff(c.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

// bodyHMAC is agentlink's signature of a forwarded revocation under the same key.
func bodyHMAC(key, body string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}
