package tenantview

import (
	"io"
	"net"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clocktesting "k8s.io/utils/clock/testing"
)

var testNow = time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)

func newFake() *fakeSource {
	return &fakeSource{
		namespace: "acme", canList: true, canDelete: true,
		holders: []Holder{{Name: "0a1b2c", Lease: "tex", Resource: "tex", Type: "tex", Tenant: "acme", Project: "thesis",
			User: "ann", TTL: time.Minute, AcquiredAt: testNow.Add(-time.Minute), LastSeenAt: testNow.Add(-50 * time.Second)}},
		counters: []Counter{{Resource: "tex", Level: "tenant", Scope: "acme", Count: 1, Booked: 1, Cap: 3, UpdatedAt: testNow}},
	}
}

// serve starts the view over src on a loopback listener, as kubectl lease ui does.
func serve(t *testing.T, src Source) string {
	t.Helper()
	s, err := New(src, "acme", WithClock(clocktesting.NewFakePassiveClock(testNow)))
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &httptest.Server{Listener: ln, Config: &http.Server{Handler: s.Handler(HostsOf(ln.Addr())...)}}
	srv.Start()
	t.Cleanup(srv.Close)
	return srv.URL
}

func browserlessClient(t *testing.T) *http.Client {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	return &http.Client{Jar: jar, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
}

func get(t *testing.T, c *http.Client, u string) (int, string) {
	t.Helper()
	resp, err := c.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

func TestRevokeRefusesAPostWithoutTheSessionsToken(t *testing.T) {
	src := newFake()
	base := serve(t, src)
	c := browserlessClient(t)
	status, body := get(t, c, base+"/revoke?holder=0a1b2c")
	m := csrfRE.FindStringSubmatch(body)
	if status != http.StatusOK || m == nil {
		t.Fatalf("confirm page: status %d, token %v", status, m)
	}
	cases := map[string]struct {
		client *http.Client
		form   url.Values
	}{
		"no token":                      {client: c, form: url.Values{"holder": {"0a1b2c"}}},
		"a wrong token":                 {client: c, form: url.Values{"holder": {"0a1b2c"}, "csrf": {"x" + m[1]}}},
		"the token without its session": {client: browserlessClient(t), form: url.Values{"holder": {"0a1b2c"}, "csrf": {m[1]}}},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			resp, err := tc.client.PostForm(base+PathRevoke, tc.form)
			if err != nil {
				t.Fatal(err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != http.StatusForbidden {
				t.Errorf("status %d, want 403", resp.StatusCode)
			}
			if got := src.revokedNames(); len(got) != 0 {
				t.Errorf("revoked %v, want nothing", got)
			}
		})
	}
	t.Run("the token of the session", func(t *testing.T) {
		resp, err := c.PostForm(base+PathRevoke, url.Values{"holder": {"0a1b2c"}, "csrf": {m[1]}})
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusSeeOther || len(src.revokedNames()) != 1 {
			t.Errorf("status %d, revoked %v; want 303 and the holder revoked", resp.StatusCode, src.revokedNames())
		}
	})
}

func TestRevokeRefusesAnotherOrigin(t *testing.T) {
	src := newFake()
	base := serve(t, src)
	c := browserlessClient(t)
	_, body := get(t, c, base+"/revoke?holder=0a1b2c")
	token := csrfRE.FindStringSubmatch(body)[1]
	req, _ := http.NewRequest(http.MethodPost, base+PathRevoke, strings.NewReader(url.Values{"holder": {"0a1b2c"}, "csrf": {token}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Origin", "http://evil.example")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusForbidden || len(src.revokedNames()) != 0 {
		t.Errorf("status %d, revoked %v; want 403 and nothing revoked", resp.StatusCode, src.revokedNames())
	}
}

func TestHandlerRefusesAnotherHost(t *testing.T) {
	base := serve(t, newFake())
	req, _ := http.NewRequest(http.MethodGet, base+"/", nil)
	req.Host = "rebound.example:80"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("status %d, want 421", resp.StatusCode)
	}
}

func TestForbiddenListIsShownAsNotAllowedForThisTenant(t *testing.T) {
	src := newFake()
	src.canList = false
	status, body := get(t, browserlessClient(t), serve(t, src)+"/")
	if status != http.StatusForbidden || !strings.Contains(body, "Not allowed for this tenant") {
		t.Errorf("status %d, body %q; want 403 and the words", status, body)
	}
}

func TestMissingLiveAPIIsNamed(t *testing.T) {
	src := newFake()
	src.listErr = apierrors.NewNotFound(schema.GroupResource{Group: "live.lease.vancetope.io", Resource: "leaseholders"}, "")
	status, body := get(t, browserlessClient(t), serve(t, src)+"/")
	if status != http.StatusBadGateway || !strings.Contains(body, "The live lease API is not installed") {
		t.Errorf("status %d, body %q; want 502 naming the missing API", status, body)
	}
}

func TestPagesAreSelfContained(t *testing.T) {
	status, body := get(t, browserlessClient(t), serve(t, newFake())+"/")
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	for _, ref := range regexp.MustCompile(`(?:src|href)="([^"]+)"`).FindAllStringSubmatch(body, -1) {
		if !strings.HasPrefix(ref[1], "/") && !strings.HasPrefix(ref[1], "#") {
			t.Errorf("page refers to %q outside the view", ref[1])
		}
	}
	for _, asset := range []string{"/static/view.css", "/static/view.js"} {
		if status, _ := get(t, browserlessClient(t), serve(t, newFake())+asset); status != http.StatusOK {
			t.Errorf("%s: status %d", asset, status)
		}
	}
}
