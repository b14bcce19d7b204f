package agentlink_test

import (
	stdcmp "cmp"
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
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
	"github.com/vancetope/lease-operator/internal/revocation/handlers"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

var cmpIgnoreAt = cmpopts.IgnoreFields(notify.Event{}, "At")

func TestReceiver(t *testing.T) {
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	valid := func() agentlink.Message {
		return agentlink.Message{Token: "tok", Type: "tex", Resource: "tex2pdf", Reason: "idle", PodBound: true,
			Pod: agentlink.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
	}
	cases := map[string]struct {
		method  string
		secret  string
		body    func() string
		status  int
		errCode string
		publish bool
		reason  string // of the published event, when not idle
	}{
		"delivered":                       {status: 200, publish: true},
		"delivered with the right key":    {secret: "right", status: 200, publish: true},
		"signed with another key":         {secret: "wrong", status: 401, errCode: httpjson.CodeUnauthorized},
		"the key itself as the signature": {secret: "=key", status: 401, errCode: httpjson.CodeUnauthorized},
		"no signature":                    {secret: "-", status: 401, errCode: httpjson.CodeUnauthorized},
		"token not of a token's form":     {body: msgBody(valid, func(m *agentlink.Message) { m.Token = "../tok?x=1" }), status: 400, errCode: httpjson.CodeInvalid},
		"oversized token":                 {body: msgBody(valid, func(m *agentlink.Message) { m.Token = strings.Repeat("t", 4096) }), status: 400, errCode: httpjson.CodeInvalid},
		"GET":                             {method: http.MethodGet, status: 405, errCode: httpjson.CodeMethodNotAllowed},
		"malformed JSON":                  {body: func() string { return `{"token":` }, status: 400, errCode: httpjson.CodeInvalid},
		"missing token":                   {body: msgBody(valid, func(m *agentlink.Message) { m.Token = "" }), status: 400, errCode: httpjson.CodeInvalid},
		"a borrowing reclaim":             {body: msgBody(valid, func(m *agentlink.Message) { m.Reason = "reclaim" }), status: 200, publish: true, reason: "reclaim"},
		"bad reason":                      {body: msgBody(valid, func(m *agentlink.Message) { m.Reason = "release" }), status: 400, errCode: httpjson.CodeInvalid},
		"missing pod":                     {body: msgBody(valid, func(m *agentlink.Message) { m.Pod = agentlink.MessagePod{} }), status: 400, errCode: httpjson.CodeInvalid},
		"unknown type":                    {body: msgBody(valid, func(m *agentlink.Message) { m.Type = "browser" }), status: 400, errCode: httpjson.CodeInvalid},
		"another pod (IP reused)":         {body: msgBody(valid, func(m *agentlink.Message) { m.Pod.UID = "uid-old" }), status: 409, errCode: agentlink.ErrCodeNotHolderPod},
		"handler fails":                   {body: msgBody(valid, func(m *agentlink.Message) { m.Type = "broken" }), status: 500, errCode: agentlink.ErrCodeHandler},
		"resource too long":               {body: msgBody(valid, func(m *agentlink.Message) { m.Resource = strings.Repeat("r", 1000) }), status: 400, errCode: httpjson.CodeInvalid},
		"payload value too long":          {body: msgBody(valid, func(m *agentlink.Message) { m.Payload = map[string]string{"k": strings.Repeat("v", 5000)} }), status: 400, errCode: httpjson.CodeInvalid},
		"oversized":                       {body: func() string { return `{"token":"` + strings.Repeat("x", 70<<10) + `"}` }, status: 400, errCode: httpjson.CodeInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			hub := notify.NewHub(time.Minute, clock.RealClock{})
			reg := handlers.NewDefaultRegistry(hub, nil, nil)
			_ = reg.Register("broken", revocation.HandlerFunc(func(context.Context, revocation.Revocation) error { return errors.New("boom") }))
			rc := agentlink.NewReceiver(self, reg, agentlink.WithAgentKey("right"))
			body := msgBody(valid, nil)
			if tc.body != nil {
				body = tc.body
			}
			method := http.MethodPost
			if tc.method != "" {
				method = tc.method
			}
			b := body()
			req := httptest.NewRequest(method, agentlink.ReceiverPath, strings.NewReader(b))
			switch tc.secret {
			case "":
				req.Header.Set(agentlink.SignatureHeader, hmacHex("right", b))
			case "-":
			case "=key":
				req.Header.Set(agentlink.SignatureHeader, "right")
			default:
				req.Header.Set(agentlink.SignatureHeader, hmacHex(tc.secret, b))
			}
			rec := httptest.NewRecorder()
			rc.ServeHTTP(rec, req)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.errCode != "" {
				var e struct{ Error, Message string }
				if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil || e.Error != tc.errCode || e.Message == "" {
					t.Errorf("error body %s, want error %s with a message", rec.Body, tc.errCode)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			ev, published := hub.Wait(ctx, "tok")
			if published != tc.publish {
				t.Fatalf("published = %v, want %v", published, tc.publish)
			}
			if tc.publish {
				want := notify.Event{Token: "tok", Reason: stdcmp.Or(tc.reason, "idle"), Type: "tex", Resource: "tex2pdf"}
				if diff := cmp.Diff(want, ev, cmpIgnoreAt); diff != "" {
					t.Errorf("event (-want +got):\n%s", diff)
				}
			}
		})
	}
}

// TestForgedFloodDoesNotGrowTheHub is issue 26's second reproduction: 1 500 unsigned POSTs
// with a large resource each. A receiver without a key (the shipped configuration without
// --internal-secret used to accept them) and one with a key both refuse every one, and the
// hub stays empty.
func TestForgedFloodDoesNotGrowTheHub(t *testing.T) {
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	for name, opts := range map[string][]agentlink.ReceiverOption{
		"no key":   nil,
		"with key": {agentlink.WithAgentKey("right")},
	} {
		t.Run(name, func(t *testing.T) {
			hub := notify.NewHub(5*time.Minute, clock.RealClock{})
			rc := agentlink.NewReceiver(self, handlers.NewDefaultRegistry(hub, nil, nil), opts...)
			big := strings.Repeat("r", 60<<10)
			for i := range 1500 {
				b := msgBody(func() agentlink.Message {
					return agentlink.Message{Token: fmt.Sprintf("forged-%d", i), Type: "tex", Resource: big, Reason: "revoke",
						Pod: agentlink.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
				}, nil)()
				rec := httptest.NewRecorder()
				rc.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, agentlink.ReceiverPath, strings.NewReader(b)))
				if rec.Code != http.StatusUnauthorized {
					t.Fatalf("forged message %d: status %d, want 401: %s", i, rec.Code, rec.Body)
				}
			}
			if n := hub.Len(); n != 0 {
				t.Errorf("hub keeps %d events (%d bytes) after the flood, want 0", n, hub.Bytes())
			}
		})
	}
}

// TestForwarderToReceiver sends a revocation through the HTTP forwarder to a receiver and
// checks that a long-poll waiting on the token ends with it.
func TestForwarderToReceiver(t *testing.T) {
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	hub := notify.NewHub(time.Minute, clock.RealClock{})
	mux := http.NewServeMux()
	mux.Handle("POST "+agentlink.ReceiverPath, agentlink.NewReceiver(self, handlers.NewDefaultRegistry(hub, nil, nil),
		agentlink.WithAgentKey(agentlink.AgentKey("k", self.Namespace))))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := srv.Listener.Addr().(*net.TCPAddr)
	ip, port := addr.IP.String(), addr.Port
	fw := agentlink.NewHTTPForwarder(nil, port, "k")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waited := make(chan notify.Event, 1)
	go func() {
		ev, _ := hub.Wait(ctx, "tok-1")
		waited <- ev
	}()
	msg := revocation.FromHolder(lease.Holder{Token: "tok-1", Type: "mcp", Resource: "browser", Pod: self,
		Payload: map[string]string{"sessionId": "s"}}, "revoke", revocation.SiteHolderPod)
	if err := fw.Forward(ctx, ip, msg); err != nil {
		t.Fatal(err)
	}
	ev := waitfor.Receive(t, waited, "the long-poll for tok-1 to return the forwarded revocation")
	if ev.Token != "tok-1" || ev.Reason != "revoke" || ev.Type != "mcp" {
		t.Errorf("long-poll got %+v", ev)
	}
	if err := agentlink.NewHTTPForwarder(nil, port, "wrong").Forward(ctx, ip, msg); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forward with a wrong secret: %v, want a 401 error", err)
	}
	// Another namespace's key does not verify this namespace's forwards.
	other := msg
	other.Pod.Namespace = "team-b"
	if err := fw.Forward(ctx, ip, other); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forward signed for another namespace: %v, want a 401 error", err)
	}
}

// TestForwardCarriesNoSecret: whatever listens at the address a forward goes to (a reused
// IP, a pod without an agent) learns neither the internal secret nor the agent key.
func TestForwardCarriesNoSecret(t *testing.T) {
	const secret = "manager-internal-secret"
	pod := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	var got *http.Request
	var body []byte
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r
		body, _ = io.ReadAll(r.Body)
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().(*net.TCPAddr)
	msg := revocation.FromHolder(lease.Holder{Token: "tok-1", Type: "tex", Pod: pod}, "pod", revocation.SiteHolderPod)
	if err := agentlink.NewHTTPForwarder(nil, addr.Port, secret).Forward(context.Background(), addr.IP.String(), msg); err != nil {
		t.Fatal(err)
	}
	key := agentlink.AgentKey(secret, pod.Namespace)
	for name, values := range got.Header {
		for _, v := range values {
			if strings.Contains(v, secret) || strings.Contains(v, key) {
				t.Errorf("header %s carries the secret or the key: %q", name, v)
			}
		}
	}
	if sig := got.Header.Get(agentlink.SignatureHeader); sig != hmacHex(key, string(body)) {
		t.Errorf("signature %q is not the body's HMAC under the namespace's agent key", sig)
	}
}

func hmacHex(key, body string) string {
	m := hmac.New(sha256.New, []byte(key))
	m.Write([]byte(body))
	return hex.EncodeToString(m.Sum(nil))
}

func msgBody(valid func() agentlink.Message, mut func(*agentlink.Message)) func() string {
	return func() string {
		m := valid()
		if mut != nil {
			mut(&m)
		}
		b, _ := json.Marshal(m)
		return string(b)
	}
}

// TestReceiverConfirmsWithTheStore: a revocation of a lease that is still held (a forged or
// stale POST) runs no handler; a store error answers 503.
func TestReceiverConfirmsWithTheStore(t *testing.T) {
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	msg := func() agentlink.Message {
		return agentlink.Message{Token: "tok", Type: "tex", Resource: "tex2pdf", Reason: "revoke", PodBound: true,
			Pod: agentlink.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
	}
	cases := map[string]struct {
		held    bool
		err     error
		status  int
		errCode string
	}{
		"gone from the store": {status: 200},
		"still held":          {held: true, status: 409, errCode: agentlink.ErrCodeStillHeld},
		"store down":          {err: lease.ErrUnavailable, status: 503, errCode: httpjson.CodeUnavailable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			hub := notify.NewHub(time.Minute, clock.RealClock{})
			var asked string
			rc := agentlink.NewReceiver(self, handlers.NewDefaultRegistry(hub, nil, nil),
				agentlink.WithHolderCheck(func(_ context.Context, token string) (bool, error) {
					asked = token
					return tc.held, tc.err
				}), agentlink.WithAgentKey("k"))
			rec := httptest.NewRecorder()
			b := msgBody(msg, nil)()
			req := httptest.NewRequest(http.MethodPost, agentlink.ReceiverPath, strings.NewReader(b))
			req.Header.Set(agentlink.SignatureHeader, hmacHex("k", b))
			rc.ServeHTTP(rec, req)
			if rec.Code != tc.status || asked != "tok" {
				t.Fatalf("status %d (asked about %q), want %d: %s", rec.Code, asked, tc.status, rec.Body)
			}
			if tc.errCode != "" && !strings.Contains(rec.Body.String(), tc.errCode) {
				t.Errorf("body %s, want %s", rec.Body, tc.errCode)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if _, published := hub.Wait(ctx, "tok"); published != (tc.status == 200) {
				t.Errorf("published = %v, want %v", published, tc.status == 200)
			}
		})
	}
}

// Review finding (internal endpoints): the receiver answered a store error with the driver's
// text (hosts, topology). Now it answers a fixed text with a correlation id, under which the
// cause is logged in full.
func TestReceiverStoreErrorIsAFixedText(t *testing.T) {
	const driverText = "server selection error: mongo-0.mongo.lease-system.svc:27017 (replica set rs0) unreachable"
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	var logged strings.Builder
	log := funcr.NewJSON(func(obj string) { logged.WriteString(obj + "\n") }, funcr.Options{})
	rc := agentlink.NewReceiver(self, handlers.NewDefaultRegistry(notify.NewHub(time.Minute, clock.RealClock{}), nil, nil),
		agentlink.WithHolderCheck(func(context.Context, string) (bool, error) { return false, errors.New(driverText) }),
		agentlink.WithAgentKey("k"), agentlink.WithReceiverLogger(log))
	b := msgBody(func() agentlink.Message {
		return agentlink.Message{Token: "tok", Type: "tex", Resource: "tex2pdf", Reason: "revoke",
			Pod: agentlink.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
	}, nil)()
	req := httptest.NewRequest(http.MethodPost, agentlink.ReceiverPath, strings.NewReader(b))
	req.Header.Set(agentlink.SignatureHeader, hmacHex("k", b))
	rec := httptest.NewRecorder()
	rc.ServeHTTP(rec, req)
	var eb httpjson.ErrorBody
	if rec.Code != http.StatusServiceUnavailable || json.Unmarshal(rec.Body.Bytes(), &eb) != nil || eb.Error != httpjson.CodeUnavailable {
		t.Fatalf("answer %d %s, want 503 LEASE_UNAVAILABLE", rec.Code, rec.Body)
	}
	for _, leak := range []string{"mongo", "rs0", "27017", "server selection"} {
		if strings.Contains(rec.Body.String(), leak) {
			t.Errorf("the answer carries the driver's %q: %s", leak, rec.Body)
		}
	}
	if eb.CorrelationID == "" || !strings.Contains(logged.String(), driverText) || !strings.Contains(logged.String(), eb.CorrelationID) {
		t.Errorf("answer %s, log %s; want the driver's error logged under the answer's correlation id", rec.Body, logged.String())
	}
}

// WithSenders: a signed message from a sender the check refuses is answered by the check and
// runs no handler; an unsigned one is refused before the check is asked (no pod lookup for a
// flood of forgeries).
func TestReceiverSenders(t *testing.T) {
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	for name, c := range map[string]struct {
		sender, signed bool
		want           int
		wantAsked      bool
	}{
		"a sender":                 {sender: true, signed: true, want: http.StatusOK, wantAsked: true},
		"another caller":           {signed: true, want: http.StatusForbidden, wantAsked: true},
		"unsigned, another caller": {want: http.StatusUnauthorized},
	} {
		t.Run(name, func(t *testing.T) {
			hub := notify.NewHub(time.Minute, clock.RealClock{})
			asked := false
			rc := agentlink.NewReceiver(self, handlers.NewDefaultRegistry(hub, nil, nil), agentlink.WithAgentKey("k"),
				agentlink.WithSenders(func(w http.ResponseWriter, _ *http.Request) bool {
					asked = true
					if !c.sender {
						httpjson.WriteError(w, http.StatusForbidden, httpjson.CodeTenantForbidden, "not a sender")
					}
					return c.sender
				}))
			b := msgBody(func() agentlink.Message {
				return agentlink.Message{Token: "tok", Type: "tex", Resource: "tex2pdf", Reason: "revoke",
					Pod: agentlink.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
			}, nil)()
			req := httptest.NewRequest(http.MethodPost, agentlink.ReceiverPath, strings.NewReader(b))
			if c.signed {
				req.Header.Set(agentlink.SignatureHeader, hmacHex("k", b))
			}
			rec := httptest.NewRecorder()
			rc.ServeHTTP(rec, req)
			if rec.Code != c.want || asked != c.wantAsked {
				t.Errorf("answer %d (check asked: %v), want %d (%v): %s", rec.Code, asked, c.want, c.wantAsked, rec.Body)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			defer cancel()
			if _, published := hub.Wait(ctx, "tok"); published != (c.want == http.StatusOK) {
				t.Errorf("handler ran = %v, want %v", published, c.want == http.StatusOK)
			}
		})
	}
}
