package leaseclient_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/notify"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

var soloReq = leaseclient.Request{Type: "tex", Lease: "solo", Tenant: "acme", Project: "p1", User: "alice",
	HolderRef: "job-7", PodBound: true, Payload: map[string]string{"jobId": "j-1"}}

func TestLifecycle(t *testing.T) {
	e := newEnv(t, envOpts{})
	l, err := e.client.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	want := &leaseclient.Lease{Token: l.Token, Name: "solo", Resource: "solo-res", TTL: time.Minute, Fence: 1,
		Levels: []leaseclient.Level{{Level: "project", Scope: "acme/p1", Cap: 1}, {Level: "global", Scope: "*", Cap: 4}}}
	if diff := cmp.Diff(want, l, cmpopts.IgnoreUnexported(leaseclient.Lease{})); diff != "" || l.Token == "" {
		t.Errorf("lease (-want +got):\n%s", diff)
	}
	hs := e.holders(t)
	if len(hs) != 1 || hs[0].Token != l.Token || hs[0].Pod != testPod || !hs[0].PodBound || hs[0].HolderRef != "job-7" ||
		hs[0].Type != "tex" || !cmp.Equal(hs[0].Payload, map[string]string{"jobId": "j-1"}) {
		t.Fatalf("stored holders = %+v", hs)
	}

	if err := l.UpdatePayload(ctx(t), map[string]string{"jobId": "j-2", "endpoint": "http://x"}); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if p := e.holders(t)[0].Payload; !cmp.Equal(p, map[string]string{"jobId": "j-2", "endpoint": "http://x"}) {
		t.Errorf("payload after update = %v", p)
	}
	for i := range 2 {
		if err := l.Release(ctx(t)); err != nil {
			t.Fatalf("release #%d: %v", i+1, err)
		}
	}
	if hs := e.holders(t); len(hs) != 0 {
		t.Errorf("holders after release = %+v", hs)
	}
	if err := l.Check(ctx(t)); !errors.Is(err, leaseclient.ErrLost) {
		t.Errorf("check after release = %v, want ErrLost", err)
	}
	// The slot is free again.
	l2, err := e.client.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatalf("acquire after release: %v", err)
	}
	if err := l2.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
}

func TestBusy(t *testing.T) {
	e := newEnv(t, envOpts{})
	if _, err := e.client.Acquire(ctx(t), soloReq); err != nil {
		t.Fatal(err)
	}
	other := soloReq
	other.User = "bob"
	other.Wait = 200 * time.Millisecond
	_, err := e.client.Acquire(ctx(t), other)
	var busy *leaseclient.BusyError
	if !errors.Is(err, leaseclient.ErrBusy) || !errors.As(err, &busy) {
		t.Fatalf("acquire of a full level = %v, want a *BusyError", err)
	}
	waited := busy.Waited
	busy.Waited, busy.Message = 0, ""
	want := &leaseclient.BusyError{Resource: "solo-res", Level: "project", Scope: "acme/p1", Count: 1, Cap: 1, Explained: true}
	if diff := cmp.Diff(want, busy); diff != "" {
		t.Errorf("busy diagnosis (-want +got):\n%s", diff)
	}
	if waited < 200*time.Millisecond {
		t.Errorf("waited %v, want the request's 200ms", waited)
	}
	if hs := e.holders(t); len(hs) != 1 {
		t.Errorf("holders = %d, want the first only", len(hs))
	}
}

// TestDeadlineShortensTheWait: the definition waits 10 s, the caller's context 1 s. The
// client asks the server for less than the deadline, so the answer is LEASE_BUSY with its
// diagnosis, not a bare context error.
func TestDeadlineShortensTheWait(t *testing.T) {
	e := newEnv(t, envOpts{})
	if _, err := e.client.Acquire(ctx(t), soloReq); err != nil {
		t.Fatal(err)
	}
	other := soloReq
	other.User = "bob"
	// The client keeps a tenth of the deadline (300 ms here) for the answer to come back; a
	// 1 s deadline left 100 ms, which a loaded 2-core machine overran (a flake under a CPU
	// hog). How late a server may answer is the waiting issue's (docs/waiting.md).
	c, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	_, err := e.client.Acquire(c, other)
	var busy *leaseclient.BusyError
	if !errors.As(err, &busy) || busy.Level != "project" {
		t.Fatalf("acquire within a 3s deadline = %v, want a *BusyError", err)
	}
}

func TestInvalid(t *testing.T) {
	e := newEnv(t, envOpts{})
	cases := map[string]struct {
		req   leaseclient.Request
		field string
	}{
		"bad project":         {leaseclient.Request{Type: "tex", Lease: "solo", Tenant: "acme", Project: "p/1"}, "project"},
		"unknown type":        {leaseclient.Request{Type: "pdf", Lease: "solo", Tenant: "acme", Project: "p1"}, "type"},
		"user level, no user": {leaseclient.Request{Type: "mcp", Lease: "seat", Tenant: "acme", Project: "p1"}, "user"},
		"bad payload key":     {leaseclient.Request{Type: "tex", Lease: "solo", Tenant: "acme", Project: "p1", Payload: map[string]string{"$x": "1"}}, "payload"},
		"lease and inline": {leaseclient.Request{Type: "mcp", Lease: "solo", Tenant: "acme", Project: "p1",
			Inline: &leaseclient.Inline{Name: "b", Levels: leaseclient.InlineLevels{User: 1}}}, "inline"},
		"wait too long": {leaseclient.Request{Type: "tex", Lease: "solo", Tenant: "acme", Project: "p1", Wait: time.Hour}, ""},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			l, err := e.client.Acquire(ctx(t), tc.req)
			if tc.field == "" {
				// The client caps the wait at the server's bound instead of failing.
				if err != nil {
					t.Fatalf("acquire = %v", err)
				}
				_ = l.Release(ctx(t))
				return
			}
			var inv *leaseclient.InvalidError
			if !errors.Is(err, leaseclient.ErrInvalid) || !errors.As(err, &inv) || inv.Field != tc.field {
				t.Fatalf("acquire = %v, want an *InvalidError naming %q", err, tc.field)
			}
		})
	}
	if hs := e.holders(t); len(hs) != 0 {
		t.Errorf("invalid requests left holders: %+v", hs)
	}
	l, err := e.client.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	var inv *leaseclient.InvalidError
	if err := l.UpdatePayload(ctx(t), map[string]string{"a.b": "x"}); !errors.As(err, &inv) || inv.Field != "payload" {
		t.Errorf("bad payload update = %v, want an *InvalidError naming payload", err)
	}
}

func TestTenantForbidden(t *testing.T) {
	e := newEnv(t, envOpts{})
	_, err := e.client.Acquire(ctx(t), leaseclient.Request{Type: "tex", Lease: "solo", Tenant: "globex", Project: "p1"})
	var tf *leaseclient.TenantForbiddenError
	if !errors.Is(err, leaseclient.ErrTenantForbidden) || !errors.As(err, &tf) {
		t.Fatalf("acquire for another tenant = %v, want a *TenantForbiddenError", err)
	}
	if tf.Namespace != "apps" || tf.NamespaceTenant != "acme" || !strings.Contains(tf.Message, `"globex"`) {
		t.Errorf("refusal = %+v, want namespace apps speaking for acme, naming globex", tf)
	}
	if hs := e.holders(t); len(hs) != 0 {
		t.Errorf("a refused request left holders: %+v", hs)
	}
	// Without a tenant the server takes the pod's.
	l, err := e.client.Acquire(ctx(t), leaseclient.Request{Type: "tex", Lease: "solo", Project: "p1"})
	if err != nil {
		t.Fatalf("acquire without a tenant = %v", err)
	}
	if hs := e.holders(t); len(hs) != 1 || hs[0].Tenant != "acme" {
		t.Errorf("holders = %+v, want one of tenant acme", hs)
	}
	_ = l.Release(ctx(t))
}

func TestInlineDefinition(t *testing.T) {
	e := newEnv(t, envOpts{})
	req := leaseclient.Request{Type: "mcp", Tenant: "acme", Project: "p1", User: "alice",
		Inline: &leaseclient.Inline{Name: "browser", Levels: leaseclient.InlineLevels{User: 1}, TTLSeconds: 30}}
	l, err := e.client.Acquire(ctx(t), req)
	if err != nil {
		t.Fatal(err)
	}
	if l.Resource != "mcp-inline:acme/p1/browser" || l.TTL != 30*time.Second || len(l.Levels) != 1 || l.Levels[0].Level != "user" {
		t.Errorf("inline lease = %+v", l)
	}
	if _, err := e.client.Acquire(ctx(t), req); !errors.Is(err, leaseclient.ErrBusy) {
		t.Errorf("second inline acquire = %v, want ErrBusy", err)
	}
}

func TestUnavailable(t *testing.T) {
	t.Run("store down", func(t *testing.T) {
		e := newEnv(t, envOpts{uri: "mongodb://127.0.0.1:1/?connectTimeoutMS=300",
			storeOpts: []leasestore.Option{leasestore.WithOpTimeout(300 * time.Millisecond)}})
		_, err := e.client.Acquire(ctx(t), soloReq)
		var ue *leaseclient.UnavailableError
		if !errors.Is(err, leaseclient.ErrUnavailable) || !errors.As(err, &ue) || ue.Status != http.StatusServiceUnavailable || ue.Message == "" {
			t.Errorf("acquire with the store down = %v, want a 503 *UnavailableError", err)
		}
	})
	t.Run("no server", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		_ = ln.Close()
		c, err := leaseclient.New("http://" + addr)
		if err != nil {
			t.Fatal(err)
		}
		_, err = c.Acquire(ctx(t), soloReq)
		var ue *leaseclient.UnavailableError
		if !errors.Is(err, leaseclient.ErrUnavailable) || !errors.As(err, &ue) || ue.Status != 0 || ue.Err == nil {
			t.Errorf("acquire without a server = %v, want an *UnavailableError without status", err)
		}
	})
	t.Run("context ends", func(t *testing.T) {
		e := newEnv(t, envOpts{})
		if _, err := e.client.Acquire(ctx(t), soloReq); err != nil {
			t.Fatal(err)
		}
		other := soloReq
		other.User = "bob"
		c, cancel := context.WithCancel(context.Background())
		go func() {
			// Cancel once the acquisition is waiting on the server.
			time.Sleep(100 * time.Millisecond) // real time: the client shows no sign that its request waits on the server
			cancel()
		}()
		_, err := e.client.Acquire(c, other)
		if !errors.Is(err, leaseclient.ErrUnavailable) || !errors.Is(err, context.Canceled) {
			t.Errorf("acquire with a cancelled context = %v, want ErrUnavailable wrapping context.Canceled", err)
		}
	})
}

func TestLostAfterRevoke(t *testing.T) {
	e := newEnv(t, envOpts{})
	l, err := e.client.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok, err := e.store.Revoke(context.Background(), l.Token, "acme"); err != nil || !ok {
		t.Fatalf("revoke: %v %v", ok, err)
	}
	var lost *leaseclient.LostError
	err = l.Check(ctx(t))
	if !errors.Is(err, leaseclient.ErrLost) || !errors.As(err, &lost) || lost.Op != "check" || lost.Message == "" {
		t.Errorf("check after revoke = %v, want a *LostError of check", err)
	}
	// The server's text names the holder by its ID: the token is a bearer secret, and an
	// application logs such errors (docs/security.md, "Tokens").
	if hits := tokenscan.Text(fmt.Sprint(err), l.Token); len(hits) > 0 {
		t.Errorf("check after revoke: the error carries the token: %v", hits)
	}
	err = l.UpdatePayload(ctx(t), map[string]string{"jobId": "x"})
	if !errors.Is(err, leaseclient.ErrLost) {
		t.Errorf("payload after revoke = %v, want ErrLost", err)
	}
	if hits := tokenscan.Text(fmt.Sprint(err), l.Token); len(hits) > 0 {
		t.Errorf("payload after revoke: the error carries the token: %v", hits)
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Errorf("release after revoke = %v, want nil (already released)", err)
	}
}

// TestTransportErrorsHideTheToken: when no answer comes, the error (which an application
// logs) names the route, not the URL with the lease's token in its path.
func TestTransportErrorsHideTheToken(t *testing.T) {
	const token = "0f1e2d3c4b5a69788796a5b4c3d2e1f0"
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"token":"`+token+`","noop":false,"lease":"solo","resource":"solo-res","levels":[],"ttlSeconds":60,"fence":1}`)
	}))
	c, err := leaseclient.New(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	l, err := c.Acquire(ctx(t), soloReq)
	if err != nil || l.Token != token {
		t.Fatalf("acquire = %+v, %v", l, err)
	}
	srv.Close() // the agent is gone: every call fails before an answer
	for op, call := range map[string]func(context.Context) error{
		"check":   l.Check,
		"payload": func(ctx context.Context) error { return l.UpdatePayload(ctx, map[string]string{"jobId": "j"}) },
		"release": l.Release,
	} {
		err := call(ctx(t))
		var ue *leaseclient.UnavailableError
		if !errors.As(err, &ue) || ue.Status != 0 {
			t.Errorf("%s without a server = %v, want an *UnavailableError without status", op, err)
			continue
		}
		if hits := tokenscan.Text(err.Error(), token); len(hits) > 0 {
			t.Errorf("%s without a server: the error carries the token: %v", op, hits)
		}
		if !strings.Contains(err.Error(), "/v1/leases/{token}") {
			t.Errorf("%s without a server = %q, want it to name the route /v1/leases/{token}", op, err)
		}
	}
}

func TestNoop(t *testing.T) {
	e := newEnv(t, envOpts{})
	for _, name := range []string{"none", ""} {
		req := soloReq
		req.Lease = name
		l, err := e.client.Acquire(ctx(t), req)
		if err != nil || !l.NoOp || l.Token != "" {
			t.Fatalf("acquire of %q = %+v, %v; want a NOOP lease", name, l, err)
		}
		if err := errors.Join(l.Check(ctx(t)), l.UpdatePayload(ctx(t), nil), l.Release(ctx(t)), l.Release(ctx(t))); err != nil {
			t.Errorf("NOOP lease calls: %v", err)
		}
		select {
		case ev := <-l.Revoked():
			t.Errorf("NOOP lease revoked: %+v", ev)
		default:
		}
	}
	if hs := e.holders(t); len(hs) != 0 {
		t.Errorf("NOOP acquisitions stored holders: %+v", hs)
	}
	// A nil lease (a failed Acquire) is safe in defer.
	var l *leaseclient.Lease
	if err := errors.Join(l.Check(ctx(t)), l.UpdatePayload(ctx(t), nil), l.Release(ctx(t))); err != nil {
		t.Errorf("nil lease calls: %v", err)
	}
}

func TestRevokedEvent(t *testing.T) {
	// The first two long-polls fail in front of the server: the client reconnects.
	var failures atomic.Int32
	failures.Store(2)
	var polls atomic.Int32
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/events") {
				polls.Add(1)
				if failures.Add(-1) >= 0 {
					http.Error(w, "bad gateway", http.StatusBadGateway)
					return
				}
			}
			next.ServeHTTP(w, r)
		})
	}
	e := newEnv(t, envOpts{wrap: wrap}, leaseclient.WithReconnectDelay(10*time.Millisecond), leaseclient.WithEventTimeout(time.Second))
	l, err := e.client.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	ch := l.Revoked()
	if ch != l.Revoked() {
		t.Error("Revoked returns a different channel on the second call")
	}
	// Publish only once the client is polling past the failures, so that the event is seen
	// by a live long-poll.
	deadline := time.Now().Add(20 * time.Second)
	for polls.Load() < 3 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // real time: polling the fake server's count of polls (bounded by deadline)
	}
	if _, ok, err := e.store.Revoke(context.Background(), l.Token, "acme"); err != nil || !ok {
		t.Fatalf("revoke: %v %v", ok, err)
	}
	e.hub.Publish(notify.Event{Token: l.Token, Reason: "revoke", Type: "tex", Resource: "solo-res"})
	select {
	case ev := <-ch:
		if ev.Token != l.Token || ev.Reason != "revoke" || ev.Type != "tex" || ev.Resource != "solo-res" {
			t.Errorf("event = %+v", ev)
		}
	case <-time.After(20 * time.Second):
		t.Fatalf("no revocation notice after %d long-polls", polls.Load())
	}
	if err := l.Check(ctx(t)); !errors.Is(err, leaseclient.ErrLost) {
		t.Errorf("check after the notice = %v, want ErrLost", err)
	}
}

func TestReleaseStopsTheLongPoll(t *testing.T) {
	var polls atomic.Int32
	wrap := func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.HasSuffix(r.URL.Path, "/events") {
				polls.Add(1)
			}
			next.ServeHTTP(w, r)
		})
	}
	e := newEnv(t, envOpts{wrap: wrap}, leaseclient.WithEventTimeout(time.Second))
	l, err := e.client.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	l.Revoked()
	waitfor.Until(t, "the client polls for events", func() bool { return polls.Load() >= 1 })
	if err := l.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	// A poll in flight ends by cancellation; no further poll starts after it.
	n := polls.Load()
	time.Sleep(2500 * time.Millisecond) // real time: no further poll may start; an absence needs time to show
	if got := polls.Load(); got > n+1 {
		t.Errorf("%d long-polls after release, want at most the one in flight", got-n)
	}
}

func TestNewFromEnv(t *testing.T) {
	t.Setenv(leaseclient.EnvURL, "")
	var inv *leaseclient.InvalidError
	if _, err := leaseclient.NewFromEnv(); !errors.As(err, &inv) || inv.Field != "url" {
		t.Errorf("NewFromEnv without %s = %v, want an *InvalidError naming url", leaseclient.EnvURL, err)
	}
	if _, err := leaseclient.Acquire(context.Background(), soloReq); !errors.Is(err, leaseclient.ErrInvalid) {
		t.Errorf("Acquire without %s = %v, want ErrInvalid", leaseclient.EnvURL, err)
	}
	e := newEnv(t, envOpts{})
	t.Setenv(leaseclient.EnvURL, e.srv.URL+"/")
	l, err := leaseclient.Acquire(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"127.0.0.1:8090", "ftp://x", "http://"} {
		if _, err := leaseclient.New(bad); !errors.As(err, &inv) {
			t.Errorf("New(%q) = %v, want an *InvalidError", bad, err)
		}
	}
}
