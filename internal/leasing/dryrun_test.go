package leasing_test

import (
	"errors"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasing"
	"github.com/vancetope/lease-operator/internal/metrics"
)

// TestDryRunAgreesWithAcquire: in each state of the store, a dry run answers what a single
// attempt of Acquire then answers (the same levels, the same busy diagnosis, the same
// refusal), and the dry run alone sends no write and at most three reads (the counters, and
// for a full level its line and the resource's hold times).
func TestDryRunAgreesWithAcquire(t *testing.T) {
	e := newEnv(t, []leaseDef{
		{name: "seat", resource: "seats", user: 1, project: 2, global: 3, ttlSeconds: 60, waitMs: 5000},
		{name: "free", ttlSeconds: 60}, // no cap: NOOP
	}, envOpts{})
	single := func(r leasing.Request) leasing.Request { r.Wait = waitFor(0); return r }
	steps := []struct {
		name string
		req  leasing.Request
		// wantBusy is the level the dry run finds full ("" for a grant or another answer).
		wantBusy lease.Level
		wantErr  error
	}{
		{name: "free", req: req("seat", "acme", "p1", "ann")},
		{name: "user full", req: req("seat", "acme", "p1", "ann"), wantBusy: lease.LevelUser},
		{name: "other user", req: req("seat", "acme", "p1", "bob")},
		{name: "project full", req: req("seat", "acme", "p1", "cy"), wantBusy: lease.LevelProject},
		{name: "other project", req: req("seat", "acme", "p2", "cy")},
		{name: "global full", req: req("seat", "globex", "p1", "dee"), wantBusy: lease.LevelGlobal},
		{name: "no user", req: req("seat", "acme", "p3", ""), wantErr: lease.ErrInvalid},
		{name: "noop", req: req("free", "acme", "p1", "ann")},
		{name: "none", req: req("none", "acme", "p1", "ann")},
	}
	for _, st := range steps {
		e.cmds.mu.Lock()
		e.cmds.n = nil
		e.cmds.mu.Unlock()
		dry, dryErr := e.svc.DryRun(ctxT(t), st.req)
		reads, writes := e.cmds.counts()
		if writes != 0 || reads > 3 {
			t.Errorf("%s: the dry run sent %d writes and %d reads, want none and at most three", st.name, writes, reads)
		}
		got, err := e.svc.Acquire(ctxT(t), single(st.req))
		// A refused attempt repairs its level in the background: let that end before the
		// next dry run is counted.
		if derr := e.svc.Drain(ctxT(t)); derr != nil {
			t.Fatal(derr)
		}
		switch {
		case st.wantBusy != "":
			b := asBusy(t, dryErr)
			if b.Level != st.wantBusy || b.Waited != 0 {
				t.Errorf("%s: dry run busy at %s after %v, want %s at once", st.name, b.Level, b.Waited, st.wantBusy)
			}
			real := asBusy(t, err)
			if diff := cmp.Diff(real, b, cmpopts.IgnoreFields(lease.BusyError{}, "Waited", "Err")); diff != "" {
				t.Errorf("%s: busy diagnosis, acquire (-) and dry run (+):\n%s", st.name, diff)
			}
		case st.wantErr != nil:
			if !errors.Is(dryErr, st.wantErr) || !errors.Is(err, st.wantErr) || dryErr.Error() != err.Error() {
				t.Errorf("%s: dry run %v, acquire %v; want both %v", st.name, dryErr, err, st.wantErr)
			}
		default:
			if dryErr != nil || err != nil {
				t.Fatalf("%s: dry run %v, acquire %v; want both granted", st.name, dryErr, err)
			}
			if dry.Token != "" || dry.Fence != 0 {
				t.Errorf("%s: dry run carries token %q, fence %d", st.name, dry.Token, dry.Fence)
			}
			if diff := cmp.Diff(got, dry, cmpopts.IgnoreFields(leasing.Lease{}, "Token", "Fence")); diff != "" {
				t.Errorf("%s: grant, acquire (-) and dry run (+):\n%s", st.name, diff)
			}
		}
	}
	if n := counter(e.metrics.Acquire, "seats", metrics.AcquireSuccess); n != 3 {
		t.Errorf("acquire{seats,success} = %v, want the 3 grants (dry runs count nowhere)", n)
	}
	assertNoDrift(t, e.store)
}

// TestReviewTakesNoType: the live API's review names no lease type; a named one must still
// have a handler, and every other field is checked as for an acquisition.
func TestReviewTakesNoType(t *testing.T) {
	e := newEnv(t, []leaseDef{{name: "seat", user: 1, ttlSeconds: 60}}, envOpts{})
	r := req("seat", "acme", "p1", "ann")
	r.Type = ""
	if _, err := e.svc.DryRun(ctxT(t), r); !isInvalid(err, "type") {
		t.Errorf("DryRun without a type = %v, want invalid type", err)
	}
	if l, err := e.svc.Review(ctxT(t), r); err != nil || len(l.Levels) != 1 {
		t.Errorf("Review without a type = %+v, %v; want the user level", l, err)
	}
	r.Type = "pdf"
	if _, err := e.svc.Review(ctxT(t), r); !isInvalid(err, "type") {
		t.Errorf("Review of an unknown type = %v, want invalid type", err)
	}
	r.Type, r.Tenant = "", "ac/me"
	if _, err := e.svc.Review(ctxT(t), r); !isInvalid(err, "tenant") {
		t.Errorf("Review of a bad tenant = %v, want invalid tenant", err)
	}
	if n := e.cmds.total(); n != 1 {
		t.Errorf("reviews sent %d store commands, want the one probe", n)
	}
}

func isInvalid(err error, field string) bool {
	var inv *lease.InvalidError
	return errors.As(err, &inv) && inv.Field == field
}
