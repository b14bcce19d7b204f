package leaseclient_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

func TestDryRun(t *testing.T) {
	e := newEnv(t, envOpts{})
	res, err := e.client.DryRun(ctx(t), soloReq)
	if err != nil {
		t.Fatal(err)
	}
	want := &leaseclient.DryRunResult{Name: "solo", Resource: "solo-res", TTL: time.Minute,
		Levels: []leaseclient.Level{{Level: "project", Scope: "acme/p1", Cap: 1}, {Level: "global", Scope: "*", Cap: 4}}}
	if diff := cmp.Diff(want, res); diff != "" {
		t.Errorf("dry run (-want +got):\n%s", diff)
	}
	if hs := e.holders(t); len(hs) != 0 {
		t.Fatalf("a dry run stored holders: %+v", hs)
	}

	// A full level: the same *BusyError as Acquire's, at once.
	if _, err := e.client.Acquire(ctx(t), soloReq); err != nil {
		t.Fatal(err)
	}
	other := soloReq
	other.User = "bob"
	start := time.Now()
	_, err = e.client.DryRun(ctx(t), other)
	var busy *leaseclient.BusyError
	if !errors.Is(err, leaseclient.ErrBusy) || !errors.As(err, &busy) {
		t.Fatalf("dry run of a full level = %v, want a *BusyError", err)
	}
	busy.Message = ""
	if diff := cmp.Diff(&leaseclient.BusyError{Resource: "solo-res", Level: "project", Scope: "acme/p1", Count: 1, Cap: 1, Explained: true}, busy); diff != "" {
		t.Errorf("busy diagnosis (-want +got):\n%s", diff)
	}
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("the busy dry run answered after %v; the definition's 10 s wait must not apply", elapsed)
	}

	for _, name := range []string{"none", ""} {
		req := soloReq
		req.Lease = name
		if res, err := e.client.DryRun(ctx(t), req); err != nil || !res.NoOp {
			t.Errorf("dry run of %q = %+v, %v; want NOOP", name, res, err)
		}
	}
	var inv *leaseclient.InvalidError
	if _, err := e.client.DryRun(ctx(t), leaseclient.Request{Type: "mcp", Lease: "seat", Tenant: "acme", Project: "p1"}); !errors.As(err, &inv) || inv.Field != "user" {
		t.Errorf("dry run without the capped user = %v, want *InvalidError naming user", err)
	}
	var forbidden *leaseclient.TenantForbiddenError
	if _, err := e.client.DryRun(ctx(t), leaseclient.Request{Type: "tex", Lease: "solo", Tenant: "globex", Project: "p1"}); !errors.As(err, &forbidden) {
		t.Errorf("dry run for another tenant = %v, want *TenantForbiddenError", err)
	}
	if hs := e.holders(t); len(hs) != 1 {
		t.Errorf("holders = %d, want the one acquisition", len(hs))
	}
}

// TestDryRunAgainstAnOlderServer: a server that ignores ?dryRun acquires instead; the client
// gives the lease back and fails closed rather than report a grant it holds unknowingly.
func TestDryRunAgainstAnOlderServer(t *testing.T) {
	e := newEnv(t, envOpts{wrap: func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.URL.RawQuery = ""
			h.ServeHTTP(w, r)
		})
	}})
	_, err := e.client.DryRun(ctx(t), soloReq)
	if !errors.Is(err, leaseclient.ErrUnavailable) {
		t.Fatalf("dry run against a server without dry runs = %v, want ErrUnavailable", err)
	}
	if hs := e.holders(t); len(hs) != 0 {
		t.Errorf("holders after the dry run = %+v, want the granted lease released", hs)
	}
}
