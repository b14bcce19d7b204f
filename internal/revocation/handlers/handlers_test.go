package handlers_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

var cmpIgnoreAt = cmpopts.IgnoreFields(notify.Event{}, "At")

// The seams the admission library defines.
var (
	_ leasing.RevocationListener = (*revocation.Dispatcher)(nil)
	_ leasing.TypeRegistry       = (*revocation.Registry)(nil)
)

// fakeSecrets is an in-memory SecretReader.
type fakeSecrets map[string]*corev1.Secret

func (f fakeSecrets) ReadSecret(_ context.Context, namespace, name string) (handlers.Secret, error) {
	s, ok := f[namespace+"/"+name]
	if !ok {
		return handlers.Secret{}, apierrors.NewNotFound(schema.GroupResource{Resource: "secrets"}, name)
	}
	return handlers.Secret{Labels: s.Labels, Data: s.Data}, nil
}

// mcpConfig is the holder namespace's mcp configuration Secret: the endpoint it is for
// and, when token is not empty, the bearer token.
func mcpConfig(ns, name, endpoint, token string, labelled bool) *corev1.Secret {
	s := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name},
		Data:       map[string][]byte{},
	}
	if endpoint != "" {
		s.Data[handlers.MCPSecretEndpointKey] = []byte(endpoint + "\n")
	}
	if token != "" {
		s.Data["token"] = []byte(token + "\n")
	}
	if labelled {
		s.Labels = map[string]string{handlers.MCPAuthSecretLabel: "true"}
	}
	return s
}

// mcpServer records the DELETEs it receives and answers with status.
type mcpServer struct {
	*httptest.Server
	mu       sync.Mutex
	requests []string
}

func newMCPServer(t *testing.T, status int) *mcpServer {
	t.Helper()
	m := &mcpServer{}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		m.mu.Lock()
		m.requests = append(m.requests, r.Method+" "+r.URL.Path+" session="+r.Header.Get("Mcp-Session-Id")+" auth="+r.Header.Get("Authorization"))
		m.mu.Unlock()
		w.WriteHeader(status)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *mcpServer) got() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]string(nil), m.requests...)
}

// mcpToken is the token of the revoked mcp holder.
const mcpToken = "5f0c2a9e41b7d3686e2f90c1ab34d7e5"

func TestMCPHandler(t *testing.T) {
	pod := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	// srv is the configured MCP server, elsewhere a listener that only a payload names.
	secrets := func(srv, elsewhere string) fakeSecrets {
		return fakeSecrets{
			"team-a/mcp-auth":    mcpConfig("team-a", "mcp-auth", srv+"/mcp", "s3cret", true),
			"team-a/anonymous":   mcpConfig("team-a", "anonymous", srv+"/mcp", "", true),
			"team-a/no-endpoint": mcpConfig("team-a", "no-endpoint", "", "s3cret", true),
			"team-a/other":       mcpConfig("team-a", "other", elsewhere+"/mcp", "s3cret", true),
			"team-a/unlabeled":   mcpConfig("team-a", "unlabeled", srv+"/mcp", "s3cret", false),
			"team-a/closed":      mcpConfig("team-a", "closed", "http://127.0.0.1:1/mcp", "s3cret", true),
			"team-b/mcp-auth":    mcpConfig("team-b", "mcp-auth", srv+"/mcp", "other", true),
		}
	}
	cases := map[string]struct {
		status    int
		payload   func(endpoint, elsewhere string) map[string]string
		want      []string
		wantElse  []string
		wantErr   string
		notSentTo bool // the error is an *handlers.EndpointNotConfiguredError
		// operatorList replaces the operator's allowlist (default: both servers and a closed port)
		operatorList []string
		notInErr     []string // must not appear in the error (it reaches the pod's Event)
		// logged is a line the manager's log must have for the case.
		logged string
	}{
		"endpoint the tenant's Secret names but the operator does not list: not contacted": {
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "s", "authSecret": "mcp-auth"}
			},
			operatorList: []string{"http://mcp.example.invalid/mcp"},
			wantErr:      "not among the operator's MCP endpoints", notSentTo: true,
		},
		"a dial error is not echoed": {
			payload: func(string, string) map[string]string {
				return map[string]string{"endpoint": "http://127.0.0.1:1/mcp", "sessionId": "s", "authSecret": "closed"}
			},
			wantErr:  "details in the manager's log",
			notInErr: []string{"refused", "dial"},
			logged:   `"holder"="` + lease.HolderID(mcpToken) + `"`,
		},
		"DELETE with the session and the secret's bearer token": {
			status: http.StatusNoContent,
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "sess-1", "authSecret": "team-a/mcp-auth"}
			},
			want: []string{"DELETE /mcp session=sess-1 auth=Bearer s3cret"},
		},
		"secret name without namespace is the holder pod's namespace": {
			status: http.StatusOK,
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp/", "sessionId": "sess-1", "authSecret": "mcp-auth"}
			},
			want: []string{"DELETE /mcp session=sess-1 auth=Bearer s3cret"},
		},
		"anonymous when the configuration has no token": {
			status: http.StatusOK,
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "sess-1", "authSecret": "anonymous"}
			},
			want: []string{"DELETE /mcp session=sess-1 auth="},
		},
		"session already gone (404) is fine": {
			status: http.StatusNotFound,
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "sess-1", "authSecret": "anonymous"}
			},
			want: []string{"DELETE /mcp session=sess-1 auth="},
		},
		"server error is an error": {
			status: http.StatusInternalServerError,
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "sess-1", "authSecret": "anonymous"}
			},
			want:    []string{"DELETE /mcp session=sess-1 auth="},
			wantErr: "500",
		},
		"no session in the payload: nothing to delete": {
			payload: func(e, _ string) map[string]string { return map[string]string{"endpoint": e} },
		},
		"payload endpoint elsewhere: not contacted, not even with the configured auth": {
			payload: func(_, elsewhere string) map[string]string {
				return map[string]string{"endpoint": elsewhere + "/mcp", "sessionId": "s", "authSecret": "mcp-auth"}
			},
			wantErr: "not contacted", notSentTo: true,
		},
		"payload names no configuration: not contacted": {
			payload: func(_, elsewhere string) map[string]string {
				return map[string]string{"endpoint": elsewhere + "/mcp", "sessionId": "s"}
			},
			wantErr: "not contacted", notSentTo: true,
		},
		"configuration names no endpoint: not contacted": {
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "s", "authSecret": "no-endpoint"}
			},
			wantErr: "not contacted", notSentTo: true,
		},
		"configuration points elsewhere now: not contacted": {
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "s", "authSecret": "other"}
			},
			wantErr: "not contacted", notSentTo: true,
		},
		"secret of another namespace is refused": {
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "s", "authSecret": "team-b/mcp-auth"}
			},
			wantErr: "not in the holder pod's namespace",
		},
		"secret without the opt-in label is refused": {
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "s", "authSecret": "unlabeled"}
			},
			wantErr: "is not labelled",
		},
		"missing key": {
			payload: func(e, _ string) map[string]string {
				return map[string]string{"endpoint": e + "/mcp", "sessionId": "s", "authSecret": "mcp-auth", "authSecretKey": "nope"}
			},
			wantErr: `has no key "nope"`,
		},
		"non-http endpoint": {
			payload: func(string, string) map[string]string {
				return map[string]string{"endpoint": "file:///etc/passwd", "sessionId": "s", "authSecret": "mcp-auth"}
			},
			wantErr: "not an http(s) URL",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			srv := newMCPServer(t, tc.status)
			elsewhere := newMCPServer(t, http.StatusOK)
			allowed := []string{srv.URL + "/mcp", elsewhere.URL + "/mcp", "http://127.0.0.1:1/mcp"}
			if tc.operatorList != nil {
				allowed = tc.operatorList
			}
			h := &handlers.MCPHandler{Secrets: secrets(srv.URL, elsewhere.URL), Allowed: allowed}
			r := revocation.Revocation{Token: mcpToken, HolderID: lease.HolderID(mcpToken), Type: "mcp", Reason: "pod", Pod: pod,
				Payload: tc.payload(srv.URL, elsewhere.URL), Site: revocation.SiteReaper}
			log, logged := tokenscan.Logger()
			err := h.OnRevoked(logr.NewContext(context.Background(), log), r)
			// The token is a bearer secret: the log and the error (the pod's Event) name the
			// holder by its ID (docs/security.md, "Tokens").
			if hits := tokenscan.Text(logged()+fmt.Sprint(err), mcpToken); len(hits) > 0 {
				t.Errorf("the log or the error carries the holder's token: %v", hits)
			}
			if tc.logged != "" && !strings.Contains(logged(), tc.logged) {
				t.Errorf("log %q has no line with %s", logged(), tc.logged)
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("OnRevoked: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("OnRevoked error = %v, want one containing %q", err, tc.wantErr)
			}
			for _, s := range tc.notInErr {
				if err != nil && strings.Contains(err.Error(), s) {
					t.Errorf("OnRevoked error %q carries %q", err, s)
				}
			}
			var notSent *handlers.EndpointNotConfiguredError
			if got := errors.As(err, &notSent); got != tc.notSentTo {
				t.Errorf("error %v is an EndpointNotConfiguredError: %v, want %v", err, got, tc.notSentTo)
			}
			if diff := cmp.Diff(tc.want, srv.got()); diff != "" {
				t.Errorf("requests at the configured MCP server (-want +got):\n%s", diff)
			}
			if got := elsewhere.got(); len(got) != 0 {
				t.Errorf("a listener named only in the payload was contacted: %v", got)
			}
		})
	}
}

func TestHandlersInHolderPodPublish(t *testing.T) {
	for _, typ := range []string{handlers.TypeTex, handlers.TypeMCP, handlers.TypeNotify} {
		t.Run(typ, func(t *testing.T) {
			srv := newMCPServer(t, http.StatusOK)
			hub := notify.NewHub(time.Minute, clock.RealClock{})
			reg := handlers.NewDefaultRegistry(hub, fakeSecrets{}, nil)
			h, ok := reg.Handler(typ)
			if !ok {
				t.Fatalf("no handler for %s", typ)
			}
			r := revocation.Revocation{Token: "tok-" + typ, Type: typ, Resource: "res", Reason: "revoke",
				Payload: map[string]string{"endpoint": srv.URL, "sessionId": "s"}, Site: revocation.SiteHolderPod}
			if err := h.OnRevoked(context.Background(), r); err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			ev, ok := hub.Wait(ctx, r.Token)
			if !ok {
				t.Fatal("no event published")
			}
			if diff := cmp.Diff(notify.Event{Token: r.Token, Reason: "revoke", Type: typ, Resource: "res"}, ev, cmpIgnoreAt); diff != "" {
				t.Errorf("event (-want +got):\n%s", diff)
			}
			if got := srv.got(); len(got) != 0 {
				t.Errorf("in the holder pod nothing is deleted remotely, got %v", got)
			}
			// On a reaper, tex and notify have nothing to do (and publish nothing).
			if typ != handlers.TypeMCP {
				r.Token, r.Site = "reaper-"+typ, revocation.SiteReaper
				if err := h.OnRevoked(context.Background(), r); err != nil {
					t.Fatal(err)
				}
				short, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
				defer cancel()
				if _, ok := hub.Wait(short, r.Token); ok {
					t.Errorf("%s published on a reaper", typ)
				}
			}
		})
	}
}

func TestRegistry(t *testing.T) {
	reg := handlers.NewDefaultRegistry(nil, nil, nil)
	if diff := cmp.Diff([]string{"mcp", "notify", "tex"}, reg.Types()); diff != "" {
		t.Errorf("types (-want +got):\n%s", diff)
	}
	if reg.Has("browser") {
		t.Error("Has(browser) without a handler")
	}
	if err := reg.Register("tex", handlers.NotifyHandler{}); err == nil {
		t.Error("registering tex twice succeeded")
	}
	if err := reg.Register("browser", handlers.NotifyHandler{}); err != nil || !reg.Has("browser") {
		t.Errorf("Register(browser) = %v, Has = %v", err, reg.Has("browser"))
	}
}
