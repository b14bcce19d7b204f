package leaseclient_test

import (
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"

	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// partsReq acquires licence and gpu together (definitions in main_test.go).
var partsReq = leaseclient.Request{Type: "tex", Leases: []string{"licence", "gpu"}, Tenant: "acme", Project: "p1", User: "alice"}

var (
	gpuLevels     = []leaseclient.Level{{Level: "global", Scope: "*", Cap: 1}}
	licenceLevels = []leaseclient.Level{{Level: "project", Scope: "acme/p1", Cap: 2}}
)

func TestSeveralLeases(t *testing.T) {
	e := newEnv(t, envOpts{})
	dry, err := e.client.DryRun(ctx(t), partsReq)
	if err != nil {
		t.Fatal(err)
	}
	wantDry := &leaseclient.DryRunResult{Name: "gpu+licence", TTL: time.Minute, Parts: []leaseclient.Part{
		{Name: "gpu", Resource: "gpu", Levels: gpuLevels}, {Name: "licence", Resource: "licence", Levels: licenceLevels}}}
	if diff := cmp.Diff(wantDry, dry); diff != "" {
		t.Errorf("dry run (-want +got):\n%s", diff)
	}

	l, err := e.client.Acquire(ctx(t), partsReq)
	if err != nil {
		t.Fatal(err)
	}
	// One token; the parts in the order of their resources, each with its fence.
	want := &leaseclient.Lease{Token: l.Token, Name: "gpu+licence", TTL: time.Minute, Parts: []leaseclient.Part{
		{Name: "gpu", Resource: "gpu", Levels: gpuLevels, Fence: 1},
		{Name: "licence", Resource: "licence", Levels: licenceLevels, Fence: 1}}}
	if diff := cmp.Diff(want, l, cmpopts.IgnoreUnexported(leaseclient.Lease{})); diff != "" || l.Token == "" {
		t.Errorf("lease (-want +got):\n%s", diff)
	}
	if hs := e.holders(t); len(hs) != 1 || hs[0].Token != l.Token || len(hs[0].Parts) != 2 {
		t.Fatalf("stored holders = %+v, want one of two parts", hs)
	}
	if err := l.Check(ctx(t)); err != nil {
		t.Fatal(err)
	}

	// The gpu is taken: a second acquisition of both is refused, naming the full lease, and
	// books nothing.
	other := partsReq
	other.User = "bob"
	for name, call := range map[string]func() error{
		"acquire": func() error { _, err := e.client.Acquire(ctx(t), other); return err },
		"dry run": func() error { _, err := e.client.DryRun(ctx(t), other); return err },
	} {
		var busy *leaseclient.BusyError
		if err := call(); !errors.Is(err, leaseclient.ErrBusy) || !errors.As(err, &busy) {
			t.Fatalf("%s with the gpu held = %v, want a *BusyError", name, err)
		}
		busy.Message, busy.Waited = "", 0
		if diff := cmp.Diff(&leaseclient.BusyError{Lease: "gpu", Resource: "gpu", Level: "global", Scope: "*", Count: 1, Cap: 1, Explained: true}, busy); diff != "" {
			t.Errorf("%s: busy diagnosis (-want +got):\n%s", name, diff)
		}
	}
	if hs := e.holders(t); len(hs) != 1 {
		t.Errorf("holders = %d, want the first acquisition's alone", len(hs))
	}

	var inv *leaseclient.InvalidError
	bad := partsReq
	bad.Leases = []string{"gpu", "gpu"}
	if _, err := e.client.Acquire(ctx(t), bad); !errors.As(err, &inv) || inv.Field != "leases" {
		t.Errorf("acquire naming gpu twice = %v, want *InvalidError naming leases", err)
	}

	if err := l.Release(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if err := l.Check(ctx(t)); !errors.Is(err, leaseclient.ErrLost) {
		t.Errorf("check after release = %v, want ErrLost", err)
	}
	// Both are free again: the next grant has a higher fence for each.
	next, err := e.client.Acquire(ctx(t), other)
	if err != nil {
		t.Fatal(err)
	}
	for i, p := range next.Parts {
		if p.Fence <= l.Parts[i].Fence {
			t.Errorf("part %s: fence %d after %d", p.Name, p.Fence, l.Parts[i].Fence)
		}
	}
}
