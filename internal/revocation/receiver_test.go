package revocation_test

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/revocation"
)

var cmpIgnoreAt = cmpopts.IgnoreFields(notify.Event{}, "At")

func TestReceiver(t *testing.T) {
	self := lease.PodRef{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}
	valid := func() revocation.Message {
		return revocation.Message{Token: "tok", Type: "tex", Resource: "tex2pdf", Reason: "idle", PodBound: true,
			Pod: revocation.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
	}
	cases := map[string]struct {
		method  string
		secret  string
		body    func() string
		status  int
		errCode string
		publish bool
	}{
		"delivered":                       {status: 200, publish: true},
		"delivered with the right secret": {secret: "right", status: 200, publish: true},
		"wrong secret":                    {secret: "wrong", status: 401, errCode: httpjson.CodeUnauthorized},
		"missing secret":                  {secret: "-", status: 401, errCode: httpjson.CodeUnauthorized},
		"GET":                             {method: http.MethodGet, status: 405, errCode: httpjson.CodeMethodNotAllowed},
		"malformed JSON":                  {body: func() string { return `{"token":` }, status: 400, errCode: httpjson.CodeInvalid},
		"missing token":                   {body: msgBody(valid, func(m *revocation.Message) { m.Token = "" }), status: 400, errCode: httpjson.CodeInvalid},
		"bad reason":                      {body: msgBody(valid, func(m *revocation.Message) { m.Reason = "release" }), status: 400, errCode: httpjson.CodeInvalid},
		"missing pod":                     {body: msgBody(valid, func(m *revocation.Message) { m.Pod = revocation.MessagePod{} }), status: 400, errCode: httpjson.CodeInvalid},
		"unknown type":                    {body: msgBody(valid, func(m *revocation.Message) { m.Type = "browser" }), status: 400, errCode: httpjson.CodeInvalid},
		"another pod (IP reused)":         {body: msgBody(valid, func(m *revocation.Message) { m.Pod.UID = "uid-old" }), status: 409, errCode: revocation.ErrCodeNotHolderPod},
		"handler fails":                   {body: msgBody(valid, func(m *revocation.Message) { m.Type = "broken" }), status: 500, errCode: revocation.ErrCodeHandler},
		"oversized":                       {body: func() string { return `{"token":"` + strings.Repeat("x", 70<<10) + `"}` }, status: 400, errCode: httpjson.CodeInvalid},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			hub := notify.NewHub(time.Minute, clock.RealClock{})
			reg := revocation.NewDefaultRegistry(hub, nil, nil)
			_ = reg.Register("broken", revocation.HandlerFunc(func(context.Context, revocation.Revocation) error { return errors.New("boom") }))
			rc := revocation.NewReceiver(self, reg, revocation.WithSharedSecret("right"))
			body := msgBody(valid, nil)
			if tc.body != nil {
				body = tc.body
			}
			method := http.MethodPost
			if tc.method != "" {
				method = tc.method
			}
			req := httptest.NewRequest(method, revocation.ReceiverPath, strings.NewReader(body()))
			switch tc.secret {
			case "":
				req.Header.Set(revocation.SecretHeader, "right")
			case "-":
			default:
				req.Header.Set(revocation.SecretHeader, tc.secret)
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
				if diff := cmp.Diff(notify.Event{Token: "tok", Reason: "idle", Type: "tex", Resource: "tex2pdf"}, ev, cmpIgnoreAt); diff != "" {
					t.Errorf("event (-want +got):\n%s", diff)
				}
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
	mux.Handle("POST "+revocation.ReceiverPath, revocation.NewReceiver(self, revocation.NewDefaultRegistry(hub, nil, nil), revocation.WithSharedSecret("k")))
	srv := httptest.NewServer(mux)
	defer srv.Close()
	addr := srv.Listener.Addr().(*net.TCPAddr)
	ip, port := addr.IP.String(), addr.Port
	fw := revocation.NewHTTPForwarder(nil, port, "k")

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	waited := make(chan notify.Event, 1)
	go func() {
		ev, _ := hub.Wait(ctx, "tok-1")
		waited <- ev
	}()
	msg := revocation.MessageFor(revocation.FromHolder(lease.Holder{Token: "tok-1", Type: "mcp", Resource: "browser", Pod: self,
		Payload: map[string]string{"sessionId": "s"}}, "revoke", revocation.SiteHolderPod))
	if err := fw.Forward(ctx, ip, msg); err != nil {
		t.Fatal(err)
	}
	ev := <-waited
	if ev.Token != "tok-1" || ev.Reason != "revoke" || ev.Type != "mcp" {
		t.Errorf("long-poll got %+v", ev)
	}
	if err := revocation.NewHTTPForwarder(nil, port, "wrong").Forward(ctx, ip, msg); err == nil || !strings.Contains(err.Error(), "401") {
		t.Errorf("forward with a wrong secret: %v, want a 401 error", err)
	}
}

func msgBody(valid func() revocation.Message, mut func(*revocation.Message)) func() string {
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
	msg := func() revocation.Message {
		return revocation.Message{Token: "tok", Type: "tex", Resource: "tex2pdf", Reason: "revoke", PodBound: true,
			Pod: revocation.MessagePod{Namespace: "team-a", Name: "brain-0", UID: "uid-1"}}
	}
	cases := map[string]struct {
		held    bool
		err     error
		status  int
		errCode string
	}{
		"gone from the store": {status: 200},
		"still held":          {held: true, status: 409, errCode: revocation.ErrCodeStillHeld},
		"store down":          {err: lease.ErrUnavailable, status: 503, errCode: httpjson.CodeUnavailable},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			hub := notify.NewHub(time.Minute, clock.RealClock{})
			var asked string
			rc := revocation.NewReceiver(self, revocation.NewDefaultRegistry(hub, nil, nil),
				revocation.WithHolderCheck(func(_ context.Context, token string) (bool, error) {
					asked = token
					return tc.held, tc.err
				}))
			rec := httptest.NewRecorder()
			rc.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, revocation.ReceiverPath, strings.NewReader(msgBody(msg, nil)())))
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
