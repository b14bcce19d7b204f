package httpapi_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus/testutil"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/httpapi"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/liveness"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

const texBody = `{"type":"tex","lease":"tex","tenant":"acme","project":"p1","user":"alice","holderRef":"job-7","podBound":true,"payload":{"jobId":"j-1"}}`

func TestLeaseLifecycle(t *testing.T) {
	pod := lease.PodRef{Namespace: "apps", Name: "brain-0", UID: "uid-1"}
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", project: 1, global: 6, ttlSeconds: 120, waitMs: 10000}},
		envOpts{httpOpts: []httpapi.Option{httpapi.WithPodIdentity(httpapi.StaticPodIdentity(pod))}})

	status, out := e.do(t, http.MethodPost, "/v1/leases", texBody)
	if status != http.StatusOK {
		t.Fatalf("acquire = %d %v", status, out)
	}
	token, _ := out["token"].(string)
	want := map[string]any{
		"token": token, "noop": false, "lease": "tex", "resource": "tex2pdf", "ttlSeconds": float64(120),
		"fence": float64(1), // the resource's first grant
		"levels": []any{
			map[string]any{"level": "project", "scope": "acme/p1", "cap": float64(1)},
			map[string]any{"level": "global", "scope": "*", "cap": float64(6)},
		},
	}
	if diff := cmp.Diff(want, out); diff != "" || len(token) != 32 {
		t.Errorf("acquire answer (-want +got):\n%s", diff)
	}
	h, err := e.store.GetHolder(context.Background(), token)
	if err != nil {
		t.Fatal(err)
	}
	if h.Pod != pod || !h.PodBound || h.Type != "tex" || h.HolderRef != "job-7" || h.User != "alice" || h.Payload["jobId"] != "j-1" {
		t.Errorf("stored holder = %+v", h)
	}

	if status, out := e.do(t, http.MethodPost, "/v1/leases/"+token+"/check", ""); status != http.StatusOK || out["outcome"] != "ok" || out["fence"] != float64(1) {
		t.Errorf("check = %d %v", status, out)
	}
	if status, out := e.do(t, http.MethodPut, "/v1/leases/"+token+"/payload", `{"payload":{"jobId":"j-2","endpoint":"http://x"}}`); status != http.StatusOK {
		t.Errorf("payload = %d %v", status, out)
	}
	if h, err := e.store.GetHolder(context.Background(), token); err != nil || h.Payload["jobId"] != "j-2" || h.Payload["endpoint"] != "http://x" {
		t.Errorf("payload after update = %v, %v", h.Payload, err)
	}

	// A second acquisition of the cap-1 project waits; releasing the first lets it in.
	done := make(chan string, 1)
	go func() {
		_, out := e.do(t, http.MethodPost, "/v1/leases", strings.Replace(texBody, "alice", "bob", 1))
		tok, _ := out["token"].(string)
		done <- tok
	}()
	waitfor.Until(t, "the second acquisition waits", func() bool {
		return testutil.ToFloat64(e.metrics.Waiting.WithLabelValues("tex2pdf")) == 1
	})
	select {
	case tok := <-done:
		t.Fatalf("second acquisition returned %q while the slot was held", tok)
	default:
	}
	for i, wantOutcome := range []string{"ok", "already-released"} {
		status, out := e.do(t, http.MethodDelete, "/v1/leases/"+token, "")
		if status != http.StatusOK || out["outcome"] != wantOutcome {
			t.Errorf("release #%d = %d %v, want %s", i+1, status, out, wantOutcome)
		}
	}
	if tok := waitfor.Receive(t, done, "the waiting acquisition getting the freed slot"); tok == "" {
		t.Fatal("the waiting acquisition failed after the release")
	}
	status, out = e.do(t, http.MethodPost, "/v1/leases/"+token+"/check", "")
	if status != http.StatusGone || out["error"] != httpjson.CodeLost {
		t.Errorf("check after release = %d %v, want 410 LEASE_LOST", status, out)
	}
	if got := testutil.ToFloat64(e.metrics.Acquire.WithLabelValues("tex2pdf", metrics.AcquireSuccess)); got != 2 {
		t.Errorf("acquire{tex2pdf,success} = %v, want 2", got)
	}
}

func TestNoopAnswer(t *testing.T) {
	e := newEnv(t, nil, envOpts{})
	for _, lease := range []string{`"lease":"none",`, ``} {
		status, out := e.do(t, http.MethodPost, "/v1/leases", `{"type":"tex",`+lease+`"tenant":"acme","project":"p1"}`)
		if status != http.StatusOK || !cmp.Equal(out, map[string]any{"noop": true}) {
			t.Errorf("NOOP acquire = %d %v, want 200 {noop:true}", status, out)
		}
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("NOOP acquisitions sent %d store commands", n)
	}
}

func TestBusyAnswer(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", resource: "tex2pdf", project: 1, ttlSeconds: 60, waitMs: 10000}}, envOpts{})
	e.acquire(t, texBody)
	start := time.Now()
	status, out := e.do(t, http.MethodPost, "/v1/leases", strings.Replace(texBody, `"lease"`, `"waitMs":300,"lease"`, 1))
	elapsed := time.Since(start)
	if status != http.StatusConflict || out["error"] != httpjson.CodeBusy {
		t.Fatalf("busy acquire = %d %v, want 409 LEASE_BUSY", status, out)
	}
	waited, _ := out["waitedMs"].(float64)
	delete(out, "waitedMs")
	delete(out, "message")
	// Nobody else waits: position 0; no estimate before a hand-over recorded a hold time.
	want := map[string]any{"error": "LEASE_BUSY", "resource": "tex2pdf", "level": "project", "scope": "acme/p1",
		"count": float64(1), "cap": float64(1), "position": float64(0)}
	if diff := cmp.Diff(want, out); diff != "" {
		t.Errorf("busy answer (-want +got):\n%s", diff)
	}
	if waited < 300 || elapsed < 300*time.Millisecond || elapsed > 2*time.Second {
		t.Errorf("waited %vms, answered after %v; want the request's 300ms, not the definition's 10s", waited, elapsed)
	}
}

// A priority above what the definition allows is refused, naming the maximum, before
// anything is written; up to it the acquisition goes through.
func TestPriorityAboveTheMaximum(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", project: 1, ttlSeconds: 60, waitMs: 0, maxPriority: 3}}, envOpts{})
	body := func(p int) string {
		return strings.Replace(texBody, `"lease"`, fmt.Sprintf(`"priority":%d,"lease"`, p), 1)
	}
	status, out := e.do(t, http.MethodPost, "/v1/leases", body(4))
	if status != http.StatusBadRequest || out["error"] != httpjson.CodeInvalid || out["field"] != "priority" {
		t.Fatalf("priority 4 = %d %v, want 400 INVALID_REQUEST naming priority", status, out)
	}
	if msg, _ := out["message"].(string); !strings.Contains(msg, "maximum 3") {
		t.Errorf("message %q does not name the maximum 3", msg)
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("the refused acquisition sent %d store commands, want none", n)
	}
	e.acquire(t, body(3))
}

func TestMaxWaitCapsTheWait(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", project: 1, ttlSeconds: 60, waitMs: 10000}},
		envOpts{httpOpts: []httpapi.Option{httpapi.WithMaxWait(300 * time.Millisecond)}})
	e.acquire(t, texBody)
	for _, body := range []string{texBody, strings.Replace(texBody, `"lease"`, `"waitMs":5000,"lease"`, 1)} {
		start := time.Now()
		status, out := e.do(t, http.MethodPost, "/v1/leases", body)
		if elapsed := time.Since(start); status != http.StatusConflict || elapsed < 300*time.Millisecond || elapsed > 2*time.Second {
			t.Errorf("acquire = %d %v after %v, want 409 after the server's 300ms cap", status, out, elapsed)
		}
	}
}

func TestUnavailableAnswer(t *testing.T) {
	log, logged := tokenscan.Logger()
	e := newEnv(t, []leaseDef{{name: "tex", global: 1, ttlSeconds: 60, waitMs: 5000}},
		envOpts{uri: "mongodb://127.0.0.1:1/?connectTimeoutMS=300", storeOpts: []leasestore.Option{leasestore.WithOpTimeout(300 * time.Millisecond)}, log: log})
	tok := strings.Repeat("ab", 16)
	for _, c := range []struct{ method, path, body, route string }{
		{http.MethodPost, "/v1/leases", texBody, "POST " + httpapi.PathLeases},
		{http.MethodPost, "/v1/leases?dryRun=true", texBody, "POST " + httpapi.PathLeases},
		{http.MethodPost, "/v1/leases/" + tok + "/check", "", "POST " + httpapi.PathCheck},
		{http.MethodPut, "/v1/leases/" + tok + "/payload", `{"payload":{}}`, "PUT " + httpapi.PathPayload},
		{http.MethodDelete, "/v1/leases/" + tok, "", "DELETE " + httpapi.PathLease},
	} {
		status, out := e.do(t, c.method, c.path, c.body)
		// The cause is logged under the route and the holder's ID: the path carries the token,
		// a bearer secret (docs/security.md, "Tokens").
		line := logLineOf(logged(), fmt.Sprint(out["correlationId"]))
		if hits := tokenscan.Text(line, tok); len(hits) > 0 {
			t.Errorf("%s %s: the log line carries the token: %v", c.method, c.path, hits)
		}
		if want := fmt.Sprintf("%q=%q", "route", c.route); !strings.Contains(line, want) {
			t.Errorf("%s %s: log line %q does not name the route (%s)", c.method, c.path, line, want)
		}
		if holder := fmt.Sprintf("%q=%q", "holder", lease.HolderID(tok)); strings.Contains(c.route, "{token}") != strings.Contains(line, holder) {
			t.Errorf("%s %s: log line %q names the holder %t, want it to name %s exactly when the path carries a token",
				c.method, c.path, line, strings.Contains(line, holder), lease.HolderID(tok))
		}
		if status != http.StatusServiceUnavailable || out["error"] != httpjson.CodeUnavailable || out["message"] == "" {
			t.Errorf("%s %s with the store down = %d %v, want 503 LEASE_UNAVAILABLE", c.method, c.path, status, out)
		}
		// Issue 26 item 8: the driver's error (the store's address, its topology) stays in the
		// log; the answer carries a correlation id instead.
		if msg := fmt.Sprint(out["message"]); strings.Contains(msg, "127.0.0.1") || strings.Contains(msg, "topology") ||
			strings.Contains(msg, "server selection") || out["correlationId"] == nil {
			t.Errorf("%s %s: answer %v carries internal detail or no correlationId", c.method, c.path, out)
		}
	}
}

// logLineOf is the line of log that carries the correlation id id.
func logLineOf(log, id string) string {
	for line := range strings.Lines(log) {
		if strings.Contains(line, id) {
			return line
		}
	}
	return ""
}

func TestLostAfterRevoke(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", global: 2, ttlSeconds: 60}}, envOpts{})
	tok := e.acquire(t, texBody)
	if _, ok, err := e.store.Revoke(context.Background(), tok, "acme"); err != nil || !ok {
		t.Fatalf("revoke: %v %v", ok, err)
	}
	for _, c := range []struct{ method, path, body string }{
		{http.MethodPost, "/v1/leases/" + tok + "/check", ""},
		{http.MethodPut, "/v1/leases/" + tok + "/payload", `{"payload":{"jobId":"x"}}`},
	} {
		status, out := e.do(t, c.method, c.path, c.body)
		if status != http.StatusGone || out["error"] != httpjson.CodeLost {
			t.Errorf("%s %s after revoke = %d %v, want 410 LEASE_LOST", c.method, c.path, status, out)
		}
		// The message names the holder by its ID: the token is a bearer secret, and the
		// caller's application logs such messages (docs/security.md, "Tokens").
		if msg := fmt.Sprint(out["message"]); len(tokenscan.Text(msg, tok)) > 0 || !strings.Contains(msg, lease.HolderID(tok)) {
			t.Errorf("%s %s after revoke: message %q carries the token or does not name the holder %s", c.method, c.path, msg, lease.HolderID(tok))
		}
	}
	if status, out := e.do(t, http.MethodDelete, "/v1/leases/"+tok, ""); status != http.StatusOK || out["outcome"] != "already-released" {
		t.Errorf("release after revoke = %d %v", status, out)
	}
}

// texFields are the fields of a valid acquisition of "tex" (badAcquireBodies).
const texFields = `"type":"tex","lease":"tex","tenant":"acme","project":"p1","user":"alice"`

// payloadEntries is n payload entries of values of size bytes.
func payloadEntries(n, size int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":%q`, i, strings.Repeat("v", size))
	}
	return b.String()
}

// badAcquireBodies are bodies of POST /v1/leases that are refused 400 naming field, under a
// definition "tex" that caps the user level. A dry run refuses them alike.
func badAcquireBodies() map[string]struct{ body, field string } {
	return map[string]struct{ body, field string }{
		"empty body":           {``, "body"},
		"malformed JSON":       {`{"type":"tex",`, "body"},
		"syntax error":         {`{"type":tex}`, "body"},
		"not an object":        {`[1,2]`, "body"},
		"two objects":          {`{` + texFields + `}{}`, "body"},
		"unknown field":        {`{` + texFields + `,"tpye":"tex"}`, "tpye"},
		"unknown inline field": {`{"type":"tex","tenant":"acme","project":"p1","inline":{"name":"b","levls":{}}}`, "levls"},
		"wrong type":           {`{"type":"tex","lease":"tex","tenant":7,"project":"p1"}`, "tenant"},
		"payload not strings":  {`{` + texFields + `,"payload":{"jobId":5}}`, "payload"},
		"no type":              {`{"lease":"tex","tenant":"acme","project":"p1","user":"u"}`, "type"},
		"unknown type":         {`{"type":"pdf","lease":"tex","tenant":"acme","project":"p1","user":"u"}`, "type"},
		"bad lease name":       {`{"type":"tex","lease":"te x","tenant":"acme","project":"p1","user":"u"}`, "lease"},
		"long lease name":      {`{"type":"tex","lease":"` + strings.Repeat("l", 65) + `","tenant":"acme","project":"p1"}`, "lease"},
		"missing tenant":       {`{"type":"tex","lease":"tex","project":"p1","user":"u"}`, "tenant"},
		"bad tenant":           {`{"type":"tex","lease":"tex","tenant":"ac/me","project":"p1","user":"u"}`, "tenant"},
		"long tenant":          {`{"type":"tex","lease":"tex","tenant":"` + strings.Repeat("t", 65) + `","project":"p1"}`, "tenant"},
		"bad project":          {`{"type":"tex","lease":"tex","tenant":"acme","project":"p|1","user":"u"}`, "project"},
		"bad user":             {`{"type":"tex","lease":"tex","tenant":"acme","project":"p1","user":"a/b"}`, "user"},
		"user level, no user":  {`{"type":"tex","lease":"tex","tenant":"acme","project":"p1"}`, "user"},
		"long holderRef":       {`{` + texFields + `,"holderRef":"` + strings.Repeat("h", 300) + `"}`, "holderRef"},
		"lease and inline":     {`{` + texFields + `,"inline":{"name":"b"}}`, "inline"},
		"inline global cap":    {`{"type":"mcp","tenant":"acme","project":"p1","inline":{"name":"b","levels":{"global":9}}}`, "inline.levels.global"},
		"inline resource":      {`{"type":"mcp","tenant":"acme","project":"p1","inline":{"name":"b","resource":"tex2pdf","levels":{"user":1}}}`, "inline.resource"},
		"payload bad key":      {`{` + texFields + `,"payload":{"$where":"x"}}`, "payload"},
		"payload too many":     {`{` + texFields + `,"payload":{` + payloadEntries(33, 1) + `}}`, "payload"},
		"payload value large":  {`{` + texFields + `,"payload":{` + payloadEntries(1, 3000) + `}}`, "payload"},
		"body too large":       {`{` + texFields + `,"payload":{` + payloadEntries(40, 2100) + `}}`, "body"},
		"negative waitMs":      {`{` + texFields + `,"waitMs":-1}`, "waitMs"},
		"huge waitMs":          {`{` + texFields + `,"waitMs":9223372036854775807}`, "waitMs"},
		"negative priority":    {`{` + texFields + `,"priority":-1}`, "priority"},
		"priority above max":   {`{` + texFields + `,"priority":1}`, "priority"},
	}
}

func TestBadRequestsWriteNothing(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "tex", global: 5, user: 1, ttlSeconds: 60, waitMs: 0}}, envOpts{})
	cases := badAcquireBodies()
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			status, out := e.do(t, http.MethodPost, "/v1/leases", tc.body)
			if status != http.StatusBadRequest || out["error"] != httpjson.CodeInvalid {
				t.Fatalf("status %d %v, want 400 INVALID_REQUEST", status, out)
			}
			if out["field"] != tc.field {
				t.Errorf("field = %v, want %q (%v)", out["field"], tc.field, out["message"])
			}
		})
	}
	if n := e.cmds.get(); n != 0 {
		t.Errorf("bad requests sent %d store commands, want none", n)
	}
	e.empty(t)

	// Bad payload updates and tokens leave a held lease as it was.
	tok := e.acquire(t, `{`+texFields+`,"payload":{"jobId":"j"}}`)
	for name, c := range map[string]struct{ method, path, body, field string }{
		"payload unknown field": {http.MethodPut, "/v1/leases/" + tok + "/payload", `{"payload":{},"x":1}`, "x"},
		"payload too many":      {http.MethodPut, "/v1/leases/" + tok + "/payload", `{"payload":{` + payloadEntries(40, 1) + `}}`, "payload"},
		"payload malformed":     {http.MethodPut, "/v1/leases/" + tok + "/payload", `{"payload":`, "body"},
		"payload bad token":     {http.MethodPut, "/v1/leases/not!a!token/payload", `{"payload":{}}`, "token"},
		"check bad token":       {http.MethodPost, "/v1/leases/" + strings.Repeat("x", 200) + "/check", ``, "token"},
		"release bad token":     {http.MethodDelete, "/v1/leases/bad.token", ``, "token"},
	} {
		status, out := e.do(t, c.method, c.path, c.body)
		if status != http.StatusBadRequest || out["field"] != c.field {
			t.Errorf("%s: %d %v, want 400 naming %q", name, status, out, c.field)
		}
	}
	h, err := e.store.GetHolder(context.Background(), tok)
	if err != nil || !cmp.Equal(h.Payload, map[string]string{"jobId": "j"}) {
		t.Errorf("holder after bad updates: %v %v", h.Payload, err)
	}
}

func TestPodIdentity(t *testing.T) {
	unknown := errors.New("no pod has IP 10.0.0.9")
	cases := map[string]struct {
		identity    httpapi.PodIdentity
		wantStatus  int
		wantField   string
		wantMessage string
	}{
		"unknown caller": {func(*http.Request) (lease.PodRef, error) { return lease.PodRef{}, unknown }, http.StatusBadRequest, "pod", ""},
		"not synced": {func(*http.Request) (lease.PodRef, error) {
			return lease.PodRef{}, fmt.Errorf("pod informer: %w", lease.ErrUnavailable)
		}, http.StatusServiceUnavailable, "", "the calling pod cannot be identified now (correlation id "},
		// Over the unknown-caller limit: said as it is, with no correlation id (no log line
		// per refusal: the pod watcher logs them once a second).
		"over the lookup limit": {func(*http.Request) (lease.PodRef, error) {
			return lease.PodRef{}, lease.Unavailable("identifying the pod of 10.0.0.9", liveness.ErrLookupLimited)
		}, http.StatusServiceUnavailable, "", "the calling pod cannot be identified now: too many callers whose address the pod cache does not know; retry in a moment"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: []httpapi.Option{httpapi.WithPodIdentity(tc.identity)}})
			status, out := e.do(t, http.MethodPost, "/v1/leases", texBody)
			if status != tc.wantStatus || (tc.wantField != "" && out["field"] != tc.wantField) {
				t.Errorf("acquire = %d %v, want %d naming %q", status, out, tc.wantStatus, tc.wantField)
			}
			if msg, _ := out["message"].(string); !strings.HasPrefix(msg, tc.wantMessage) {
				t.Errorf("message = %q, want it to start %q", msg, tc.wantMessage)
			}
			if _, ok := out["correlationId"]; tc.wantStatus == http.StatusServiceUnavailable && ok == strings.Contains(name, "limit") {
				t.Errorf("correlationId in %v: want one for an unavailable answer that is logged, none over the limit", out)
			}
			if n := e.cmds.get(); n != 0 {
				t.Errorf("sent %d store commands", n)
			}
		})
	}
	t.Run("over the lookup limit the answer says when to retry", func(t *testing.T) {
		e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: []httpapi.Option{httpapi.WithPodIdentity(
			func(*http.Request) (lease.PodRef, error) {
				return lease.PodRef{}, lease.Unavailable("identifying the pod of 10.0.0.9", liveness.ErrLookupLimited)
			})}})
		resp, err := e.srv.Client().Post(e.srv.URL+"/v1/leases", "application/json", strings.NewReader(texBody))
		if err != nil {
			t.Fatal(err)
		}
		_ = resp.Body.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") != "1" {
			t.Errorf("answer %d with Retry-After %q, want 503 with 1", resp.StatusCode, resp.Header.Get("Retry-After"))
		}
	})
	t.Run("without identity the holder has no pod", func(t *testing.T) {
		e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{})
		tok := e.acquire(t, texBody)
		h, err := e.store.GetHolder(context.Background(), tok)
		if err != nil || h.Pod != (lease.PodRef{}) {
			t.Errorf("holder pod = %+v, %v; want none", h.Pod, err)
		}
	})
}

func TestEventsLongPoll(t *testing.T) {
	hub := notify.NewHub(time.Minute, testingclock.NewFakeClock(time.Now()))
	e := newEnv(t, []leaseDef{{name: "tex", global: 5, ttlSeconds: 60}}, envOpts{httpOpts: []httpapi.Option{httpapi.WithEvents(hub)}})
	tok := e.acquire(t, texBody)

	start := time.Now()
	status, out := e.do(t, http.MethodGet, "/v1/leases/"+tok+"/events?timeout=300ms", "")
	if elapsed := time.Since(start); status != http.StatusNoContent || out != nil || elapsed < 300*time.Millisecond || elapsed > 3*time.Second {
		t.Errorf("long-poll without event = %d %v after %v, want 204 after ~300ms", status, out, elapsed)
	}

	go func() {
		// Published once the poll waits, so that it is the wake-up that answers it.
		for hub.Waiting(tok) == 0 && t.Context().Err() == nil {
			time.Sleep(time.Millisecond) // real time: polling the hub while the HTTP request is served
		}
		hub.Publish(notify.Event{Token: tok, Reason: metrics.ReapRevoke, Type: "tex", Resource: "tex"})
	}()
	start = time.Now()
	status, out = e.do(t, http.MethodGet, "/v1/leases/"+tok+"/events?timeout=20", "")
	if status != http.StatusOK || out["token"] != tok || out["reason"] != "revoke" || out["type"] != "tex" {
		t.Errorf("long-poll with event = %d %v, want 200 with the event", status, out)
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Errorf("event delivered after %v", elapsed)
	}
	// A poll that arrives after the event still hears of it.
	if status, out := e.do(t, http.MethodGet, "/v1/leases/"+tok+"/events", ""); status != http.StatusOK || out["reason"] != "revoke" {
		t.Errorf("late long-poll = %d %v", status, out)
	}
	for _, bad := range []string{"61s", "0", "-1s", "soon", "1000"} {
		if status, out := e.do(t, http.MethodGet, "/v1/leases/"+tok+"/events?timeout="+bad, ""); status != http.StatusBadRequest || out["field"] != "timeout" {
			t.Errorf("timeout=%s: %d %v, want 400 naming timeout", bad, status, out)
		}
	}
}

func TestEventsRouteNeedsAHub(t *testing.T) {
	e := newEnv(t, nil, envOpts{})
	resp, err := e.srv.Client().Get(e.srv.URL + "/v1/leases/" + strings.Repeat("a", 32) + "/events?timeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("events without a hub = %d, want 404", resp.StatusCode)
	}
}

func TestMethodNotAllowed(t *testing.T) {
	e := newEnv(t, nil, envOpts{})
	resp, err := e.srv.Client().Get(e.srv.URL + "/v1/leases")
	if err != nil {
		t.Fatal(err)
	}
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET /v1/leases = %d, want 405", resp.StatusCode)
	}
}

func TestAgentIdentityFromEnv(t *testing.T) {
	t.Setenv(settings.EnvPodNamespace, "apps")
	t.Setenv(settings.EnvPodName, "worker-1")
	t.Setenv(settings.EnvPodUID, "0b1c")
	pod, err := httpapi.AgentIdentityFromEnv()
	if err != nil || pod != (lease.PodRef{Namespace: "apps", Name: "worker-1", UID: "0b1c"}) {
		t.Errorf("identity = %+v, %v", pod, err)
	}
	t.Setenv(settings.EnvPodUID, "")
	if _, err := httpapi.AgentIdentityFromEnv(); err == nil || !strings.Contains(err.Error(), settings.EnvPodUID) {
		t.Errorf("identity without %s = %v, want an error naming it", settings.EnvPodUID, err)
	}
}
