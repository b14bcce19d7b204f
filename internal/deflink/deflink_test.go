package deflink

import (
	"bytes"
	stdcmp "cmp"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

const secret = "internal-secret"

var (
	acmePod   = lease.PodRef{Namespace: "acme", Name: "app-0", UID: "u1"}
	globexPod = lease.PodRef{Namespace: "globex", Name: "app-0", UID: "u2"}
	loosePod  = lease.PodRef{Namespace: "no-tenant", Name: "app-0", UID: "u3"}
	tenants   = tenancy.Static{System: "lease-system", Tenants: map[string]string{"acme": "acme", "globex": "globex"}}
)

func agentKey(ns string) string { return agentlink.AgentKey(secret, ns) }

// fakeResolver answers from a map it can change, counting the calls.
type fakeResolver struct {
	mu    sync.Mutex
	defs  map[string]definition.Definition // by lease name
	err   error
	calls atomic.Int64
}

func (f *fakeResolver) Resolve(_ context.Context, _, _, name string) (definition.Definition, error) {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return definition.Definition{}, f.err
	}
	d, ok := f.defs[name]
	if !ok {
		return definition.Definition{}, &definition.UnavailableError{Name: name, Source: "nowhere", Err: errors.New("no such lease")}
	}
	return d, nil
}

func (f *fakeResolver) set(name string, d definition.Definition) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.defs[name] = d
}

var texDef = definition.Definition{Name: "tex", Resource: "tex", Caps: definition.Caps{Global: 6, Tenant: 3, User: 1},
	TTL: 90 * time.Second, Wait: 2500 * time.Millisecond, Fairness: definition.FairProcess}

// byIP identifies callers by source address, as the manager's pod informer does.
func byIP(pods map[string]lease.PodRef) agentauth.PodIdentity {
	return func(r *http.Request) (lease.PodRef, error) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		return pods[host], nil
	}
}

// serve starts the manager's side on 127.0.0.1, with acme's pod at 127.0.0.1, globex's at
// 127.0.0.2 and a pod of an unlabelled namespace at 127.0.0.3.
func serve(t *testing.T, res Resolver, v *Versions, opts ...HandlerOption) *httptest.Server {
	t.Helper()
	pods := map[string]lease.PodRef{"127.0.0.1": acmePod, "127.0.0.2": globexPod, "127.0.0.3": loosePod}
	srv := httptest.NewServer(NewHandler(res, tenants, agentauth.NewVerifier(byIP(pods), agentKey), v, opts...))
	t.Cleanup(srv.Close)
	return srv
}

// post sends a request from 127.0.0.1 signed with key.
func post(t *testing.T, url, path, key string, body any) (int, []byte) {
	t.Helper()
	data, _ := json.Marshal(body)
	req, _ := http.NewRequestWithContext(t.Context(), http.MethodPost, url+path, bytes.NewReader(data))
	req.Header.Set(agentauth.SignatureHeader, agentauth.Sign(key, path, data))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	return resp.StatusCode, buf.Bytes()
}

func TestHandlerRefusesWhatIsNotTheCallersOwn(t *testing.T) {
	res := &fakeResolver{defs: map[string]definition.Definition{"tex": texDef}}
	// Every call comes from 127.0.0.1: acme's pod, unless identify says otherwise.
	cases := map[string]struct {
		identify   agentauth.PodIdentity
		key        string
		path       string
		signPath   string // the path signed, when not path
		body       any
		wantStatus int
		wantCode   string
		// wantRetryAfter: the Retry-After header, for a refusal to try again.
		wantRetryAfter string
	}{
		"unknown caller": {identify: byIP(nil), key: agentKey("acme"), path: ResolvePath,
			body: ResolveRequest{Tenant: "acme", Name: "tex"}, wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"unknown caller watching": {identify: byIP(nil), key: agentKey("acme"), path: WatchPath,
			body: WatchRequest{}, wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"pod not identified now": {identify: func(*http.Request) (lease.PodRef, error) {
			return lease.PodRef{}, lease.Unavailable("identifying", errors.New("API server down"))
		}, key: agentKey("acme"), path: ResolvePath, body: ResolveRequest{Tenant: "acme", Name: "tex"},
			wantStatus: http.StatusServiceUnavailable, wantCode: httpjson.CodeUnavailable},
		"over the unknown-caller limit": {identify: func(*http.Request) (lease.PodRef, error) {
			return lease.PodRef{}, lease.Unavailable("identifying", liveness.ErrLookupLimited)
		}, key: agentKey("acme"), path: ResolvePath, body: ResolveRequest{Tenant: "acme", Name: "tex"},
			wantStatus: http.StatusServiceUnavailable, wantCode: httpjson.CodeUnavailable, wantRetryAfter: "1"},
		"unsigned": {path: ResolvePath, body: ResolveRequest{Tenant: "acme", Name: "tex"},
			wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"signed with another namespace's key": {key: agentKey("globex"), path: ResolvePath,
			body: ResolveRequest{Tenant: "acme", Name: "tex"}, wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"watch signature on the resolve path": {key: agentKey("acme"), path: ResolvePath, signPath: WatchPath,
			body: ResolveRequest{Tenant: "acme", Name: "tex"}, wantStatus: http.StatusUnauthorized, wantCode: httpjson.CodeUnauthorized},
		"another tenant": {key: agentKey("acme"), path: ResolvePath,
			body: ResolveRequest{Tenant: "globex", Name: "tex"}, wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"the system tenant": {key: agentKey("acme"), path: ResolvePath,
			body: ResolveRequest{Tenant: "_system", Project: "_tenant", Name: "tex"}, wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"no tenant named": {key: agentKey("acme"), path: ResolvePath,
			body: ResolveRequest{Name: "tex"}, wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"a namespace without a tenant": {identify: func(*http.Request) (lease.PodRef, error) { return loosePod, nil },
			key: agentKey("no-tenant"), path: ResolvePath, body: ResolveRequest{Tenant: "", Name: "tex"},
			wantStatus: http.StatusForbidden, wantCode: httpjson.CodeTenantForbidden},
		"the caller's own tenant": {key: agentKey("acme"), path: ResolvePath,
			body: ResolveRequest{Tenant: "acme", Project: "web", Name: "tex"}, wantStatus: http.StatusOK},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			identify := tc.identify
			if identify == nil {
				identify = byIP(map[string]lease.PodRef{"127.0.0.1": acmePod})
			}
			h := NewHandler(res, tenants, agentauth.NewVerifier(identify, agentKey), NewVersions())
			data, _ := json.Marshal(tc.body)
			req := httptest.NewRequest(http.MethodPost, tc.path, bytes.NewReader(data))
			req.RemoteAddr = "127.0.0.1:40000"
			if tc.key != "" {
				req.Header.Set(agentauth.SignatureHeader, agentauth.Sign(tc.key, stdcmp.Or(tc.signPath, tc.path), data))
			}
			before := res.calls.Load()
			w := httptest.NewRecorder()
			h.ServeHTTP(w, req)
			if w.Code != tc.wantStatus {
				t.Fatalf("status %d, want %d: %s", w.Code, tc.wantStatus, w.Body)
			}
			if got := w.Header().Get("Retry-After"); got != tc.wantRetryAfter {
				t.Errorf("Retry-After %q, want %q", got, tc.wantRetryAfter)
			}
			if tc.wantStatus == http.StatusOK {
				return
			}
			var eb httpjson.ErrorBody
			if err := json.Unmarshal(w.Body.Bytes(), &eb); err != nil || eb.Error != tc.wantCode {
				t.Errorf("answer %s, want code %s", w.Body, tc.wantCode)
			}
			if res.calls.Load() != before {
				t.Errorf("a refused request was resolved")
			}
		})
	}
}

func TestHandlerAnswersResolutions(t *testing.T) {
	res := &fakeResolver{defs: map[string]definition.Definition{"tex": texDef}}
	srv := serve(t, res, NewVersions())
	cases := map[string]struct {
		err  error
		name string
		want ResolveAnswer
	}{
		"definition": {name: "tex", want: ResolveAnswer{Definition: WireDefinition(texDef)}},
		"invalid": {name: "tex", err: &lease.InvalidError{Field: "lease", Detail: "bad"},
			want: ResolveAnswer{Invalid: &InvalidAnswer{Field: "lease", Detail: "bad"}}},
		"unavailable": {name: "tex", err: &definition.UnavailableError{Name: "tex", Source: "LeaseDefinition acme/tex", Err: definition.ErrConflict},
			want: ResolveAnswer{Unavailable: &Unavailability{Source: "LeaseDefinition acme/tex", Message: definition.ErrConflict.Error(), Conflict: true}}},
		"unexpected": {name: "tex", err: errors.New("boom"),
			want: ResolveAnswer{Unavailable: &Unavailability{Source: "manager", Message: "resolving failed; see the manager's log"}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			res.mu.Lock()
			res.err = tc.err
			res.mu.Unlock()
			status, body := post(t, srv.URL, ResolvePath, agentKey("acme"), ResolveRequest{Tenant: "acme", Project: "web", Name: tc.name})
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, body)
			}
			var got ResolveAnswer
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatal(err)
			}
			if got.Version == "" {
				t.Errorf("no version in %s", body)
			}
			got.Version = ""
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answer (-want +got):\n%s", diff)
			}
		})
	}
}

func TestHandlerWatchAnswersAtAChange(t *testing.T) {
	v := NewVersions()
	srv := serve(t, &fakeResolver{}, v, WithHold(time.Hour))
	status, body := post(t, srv.URL, WatchPath, agentKey("acme"), WatchRequest{})
	var first WatchAnswer
	if status != http.StatusOK || json.Unmarshal(body, &first) != nil {
		t.Fatalf("status %d: %s", status, body)
	}
	if diff := cmp.Diff(WatchAnswer{Version: first.Version, Tenant: "acme", Labelled: true, SystemNamespace: "lease-system"}, first); diff != "" || first.Version == "" {
		t.Errorf("first answer (-want +got):\n%s", diff)
	}
	// A watch of the current version waits (an hour) until the next change.
	done := make(chan WatchAnswer, 1)
	go func() {
		var a WatchAnswer
		_, body := post(t, srv.URL, WatchPath, agentKey("acme"), WatchRequest{Version: first.Version})
		_ = json.Unmarshal(body, &a)
		done <- a
	}()
	select {
	case a := <-done:
		t.Fatalf("answered %+v without a change", a)
	case <-time.After(50 * time.Millisecond): // no proof, only a chance to catch an early answer
	}
	v.Bump()
	if a := waitfor.Receive(t, done, "the watch answering the change"); a.Version == first.Version || a.Tenant != "acme" {
		t.Errorf("after a change: %+v, first %+v", a, first)
	}
}

// client starts an agent's Client for acme's pod against srv.
func client(t *testing.T, url string, opts ...ClientOption) *Client {
	t.Helper()
	c := NewClient(url, "acme", agentKey("acme"), append([]ClientOption{WithRetry(10 * time.Millisecond)}, opts...)...)
	return c
}

func run(t *testing.T, c *Client) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { _ = c.Start(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func TestClientResolvesAsTheManager(t *testing.T) {
	builtins, err := definition.LoadBuiltins(fstest.MapFS{
		"broken.yaml": {Data: []byte("name: broken\nlevels: {global: -1}\n")},
		"short.yaml":  {Data: []byte("name: short\nresource: pool\nlevels: {global: 4, tenant: 2, project: 2, user: 1}\nttlSeconds: 5\nwaitMs: 1\nfairness: global\n")},
	})
	if err != nil {
		t.Fatal(err)
	}
	manager := definition.NewResolver(builtins, nil)
	srv := serve(t, manager, NewVersions())
	c := client(t, srv.URL)
	for _, name := range []string{"tex", "short", "broken", "missing", "no such name!", "none", ""} {
		want, wantErr := manager.Resolve(t.Context(), "acme", "web", name)
		got, err := c.Resolve(t.Context(), "acme", "web", name)
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("%q (-manager +agent):\n%s", name, diff)
		}
		for _, kind := range []error{lease.ErrInvalid, lease.ErrUnavailable} {
			if errors.Is(wantErr, kind) != errors.Is(err, kind) {
				t.Errorf("%q: agent error %v, manager error %v", name, err, wantErr)
			}
		}
		var wantInvalid, invalid *lease.InvalidError
		if errors.As(wantErr, &wantInvalid) && (!errors.As(err, &invalid) || *invalid != *wantInvalid) {
			t.Errorf("%q: agent error %v, manager error %v", name, err, wantErr)
		}
	}
	one := int32(1)
	spec := definition.InlineSpec{Name: "mcp", Levels: definition.Levels{Project: &one}}
	want, wantErr := manager.ResolveInline("acme", "web", spec)
	got, err := c.ResolveInline("acme", "web", spec)
	if diff := cmp.Diff(want, got); diff != "" || (err == nil) != (wantErr == nil) {
		t.Errorf("inline (-manager +agent):\n%s\nerrors %v, %v", diff, wantErr, err)
	}
}

func TestClientCachesWhileWatchingAndFollowsChanges(t *testing.T) {
	res := &fakeResolver{defs: map[string]definition.Definition{"tex": texDef}}
	v := NewVersions()
	srv := serve(t, res, v, WithHold(time.Hour))
	c := client(t, srv.URL, WithWatchHold(time.Hour))
	changes := make(chan struct{}, 10)
	c.OnChange(func() { changes <- struct{}{} })

	// Before the watch ever answered: asked every time, not cached, tenant not known.
	for range 2 {
		if _, err := c.Resolve(t.Context(), "acme", "web", "tex"); err != nil {
			t.Fatal(err)
		}
	}
	if got := res.calls.Load(); got != 2 {
		t.Errorf("%d resolutions on the manager before the watch, want 2", got)
	}
	if c.Ready() || c.Tenancy().(interface{ HasSynced() bool }).HasSynced() {
		t.Error("ready before the manager was reached")
	}

	run(t, c)
	waitfor.Until(t, "ready", c.Ready)
	waitfor.Receive(t, changes, "the first version")
	if got, ok := c.Tenancy().TenantOf("acme"); got != "acme" || !ok {
		t.Errorf("TenantOf(acme) = %q, %v", got, ok)
	}
	if _, ok := c.Tenancy().TenantOf("globex"); ok {
		t.Error("the agent knows another namespace's tenant")
	}

	// Watching: the second resolution is the cache's.
	before := res.calls.Load()
	for range 3 {
		d, err := c.Resolve(t.Context(), "acme", "web", "tex")
		if err != nil || d != texDef {
			t.Fatalf("Resolve = %+v, %v", d, err)
		}
	}
	if got := res.calls.Load() - before; got != 1 {
		t.Errorf("%d resolutions on the manager for 3 asked while watching, want 1", got)
	}

	// A change on the manager: the hooks run and the next resolution is the new one.
	raised := texDef
	raised.Caps.Global = 9
	res.set("tex", raised)
	v.Bump()
	waitfor.Receive(t, changes, "the change reaching the agent")
	if d, err := c.Resolve(t.Context(), "acme", "web", "tex"); err != nil || d != raised {
		t.Errorf("after the change: %+v, %v; want %+v", d, err, raised)
	}
}

func TestClientFailsClosed(t *testing.T) {
	res := &fakeResolver{defs: map[string]definition.Definition{"tex": texDef}}
	srv := serve(t, res, NewVersions(), WithHold(time.Hour))
	c := client(t, srv.URL, WithWatchHold(time.Hour), WithStale(time.Second))
	run(t, c)
	waitfor.Until(t, "ready", c.Ready)
	if _, err := c.Resolve(t.Context(), "acme", "web", "tex"); err != nil {
		t.Fatal(err)
	}

	// The manager goes away (a restart, say): the cached definition is still served within
	// the stale window, so that the agent's callers do not notice; after it, no more.
	_ = srv.Config.Close() // the listener and every connection at once, the watch's too
	if _, err := c.Resolve(t.Context(), "acme", "web", "tex"); err != nil {
		t.Errorf("within the stale window: %v, want the cached definition", err)
	}
	waitfor.Until(t, "the cache dropped", func() bool {
		_, err := c.Resolve(t.Context(), "acme", "web", "tex")
		return err != nil
	})
	_, err := c.Resolve(t.Context(), "acme", "web", "tex")
	var ue *definition.UnavailableError
	if !errors.Is(err, lease.ErrUnavailable) || !errors.As(err, &ue) || ue.Name != "tex" {
		t.Errorf("Resolve with the manager gone = %v, want a *definition.UnavailableError of tex", err)
	}

	// A manager that never answers: the caller's deadline holds.
	stop := make(chan struct{})
	hang := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-stop:
		}
	}))
	t.Cleanup(hang.Close)
	t.Cleanup(func() { close(stop) })
	slow := client(t, hang.URL)
	ctx, cancel := context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	_, err = slow.Resolve(ctx, "acme", "web", "tex")
	if !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("Resolve from a hanging manager = %v, want LEASE_UNAVAILABLE", err)
	}
	if ctx.Err() == nil {
		t.Error("Resolve returned before the deadline without an answer")
	}
}

func TestClientSourceIPIsTheCaller(t *testing.T) {
	res := &fakeResolver{defs: map[string]definition.Definition{"tex": texDef}}
	srv := serve(t, res, NewVersions())
	// globex's agent on 127.0.0.2: its requests are globex's, whatever it names.
	c := NewClient(srv.URL, "globex", agentKey("globex"), WithHTTPClient(agentauth.HTTPClient("127.0.0.2")))
	if _, err := c.Resolve(t.Context(), "globex", "web", "tex"); err != nil {
		t.Errorf("globex's own tenant: %v", err)
	}
	if _, err := c.Resolve(t.Context(), "acme", "web", "tex"); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("acme's tenant from globex's pod = %v, want refused (LEASE_UNAVAILABLE)", err)
	}
}

// lockedTenancy is a tenancy.Map whose namespaces can be relabelled during a test.
type lockedTenancy struct {
	mu sync.Mutex
	tenancy.Static
}

func (l *lockedTenancy) TenantOf(ns string) (string, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.Static.TenantOf(ns)
}

func (l *lockedTenancy) relabel(ns, tenant string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.Tenants[ns] = tenant
}

// A namespace relabelled on the manager: the agent's watch learns the new tenant, its
// waiters are woken, and the manager answers only for the new tenant.
func TestClientFollowsARelabel(t *testing.T) {
	res := &fakeResolver{defs: map[string]definition.Definition{"tex": texDef}}
	v := NewVersions()
	m := &lockedTenancy{Static: tenancy.Static{System: "lease-system", Tenants: map[string]string{"acme": "acme"}}}
	srv := httptest.NewServer(NewHandler(res, m, agentauth.NewVerifier(byIP(map[string]lease.PodRef{"127.0.0.1": acmePod}), agentKey), v, WithHold(time.Hour)))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { _ = srv.Config.Close() })
	c := client(t, srv.URL, WithWatchHold(time.Hour))
	changes := make(chan struct{}, 10)
	c.OnChange(func() { changes <- struct{}{} })
	run(t, c)
	waitfor.Receive(t, changes, "the first version")
	if _, err := c.Resolve(t.Context(), "acme", "web", "tex"); err != nil {
		t.Fatal(err)
	}

	m.relabel("acme", "acme-corp")
	v.Bump() // as the manager's k8stenancy.Informed.OnChange does (cmd/manager/agentdefs.go)
	waitfor.Receive(t, changes, "the relabel reaching the agent")
	if got, ok := c.Tenancy().TenantOf("acme"); got != "acme-corp" || !ok {
		t.Errorf("TenantOf(acme) after the relabel = %q, %v", got, ok)
	}
	if _, err := c.Resolve(t.Context(), "acme", "web", "tex"); !errors.Is(err, lease.ErrUnavailable) {
		t.Errorf("the old tenant after the relabel = %v, want refused (LEASE_UNAVAILABLE)", err)
	}
	if _, err := c.Resolve(t.Context(), "acme-corp", "web", "tex"); err != nil {
		t.Errorf("the new tenant: %v", err)
	}
}
