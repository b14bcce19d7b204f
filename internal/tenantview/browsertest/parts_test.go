package browsertest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/browser"
)

// partsRequest is acme's acquisition of several resources at once (issue 45), one part per
// lease name and resource, each capped at 1 globally.
func partsRequest(user string, parts ...[2]string) leasestore.AcquireRequest {
	req := leasestore.AcquireRequest{Tenant: "acme", Project: "parts", User: user, Type: "tex", TTL: time.Hour}
	for _, p := range parts {
		req.Parts = append(req.Parts, leasestore.Part{LeaseName: p[0], Resource: p[1],
			Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}}})
	}
	return req
}

// TestPartsShowInTheBrowser: a holder of two resources is one row whose resource joins
// both, and its revoke confirmation names both resources and both lease names; an
// acquisition of two resources that holds the first and waits for the second, held by that
// holder, shows in the Waiting section which part it waits on and the set it belongs to;
// globex's view shows neither.
func TestPartsShowInTheBrowser(t *testing.T) {
	h, err := store.Acquire(ctxT(t), partsRequest("ann", [2]string{"licence", "bt-licence"}, [2]string{"gpu", "bt-gpu"}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = store.Release(context.Background(), h.Token) })
	req := partsRequest("bea", [2]string{"licence", "bt-licence"}, [2]string{"disk", "bt-disk"})
	req.WaitTTL = time.Hour
	_, err = store.Acquire(ctxT(t), req)
	var lined *leasestore.WaitingError
	if !errors.As(err, &lined) {
		t.Fatalf("acquisition of bt-disk+bt-licence: %v, want it to wait", err)
	}
	t.Cleanup(func() { _ = store.Withdraw(context.Background(), lined.Token) })
	waiter := lease.HolderID(lined.Token)

	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	cellsOf := func(sel string) string {
		return fmt.Sprintf(`[...document.querySelectorAll(%q)].map(r =>
			[...r.querySelectorAll("td")].slice(0, 3).map(td => td.textContent.trim().replace(/\s+/g, " ")).join(" | "))`, sel)
	}
	if got := browser.Eval[[]string](ctx, t, cellsOf(fmt.Sprintf(`tr.holder[data-holder=%q]`, h.ID))); len(got) != 1 || got[0] != "bt-gpu+bt-licence | parts | ann" {
		t.Errorf("alice's row of the holder of two resources: %q, want resource bt-gpu+bt-licence", got)
	}
	if got := browser.Eval[[]string](ctx, t, cellsOf(fmt.Sprintf(`tr.waiter[data-waiter=%q]`, waiter))); len(got) != 1 ||
		got[0] != "bt-licence (of bt-disk+bt-licence) | parts | bea" {
		t.Errorf("alice's Waiting row of the acquisition of two resources: %q, want it waiting on bt-licence (of bt-disk+bt-licence)", got)
	}
	browser.Capture(ctx, t, "parts")

	browser.Click(ctx, t, fmt.Sprintf(`tr[data-holder=%q] a.danger`, h.ID))
	facts := browser.Eval[[]string](ctx, t, `[...document.querySelectorAll("dl.facts dt, dl.facts dd")].map(e => e.textContent.trim())`)
	if i := slices.Index(facts, "Resource"); i < 0 || i+1 >= len(facts) || facts[i+1] != "bt-gpu+bt-licence (lease gpu+licence, type tex)" {
		t.Errorf("the revoke confirmation: %q, want resource bt-gpu+bt-licence (lease gpu+licence, type tex)", facts)
	}

	browser.Navigate(ctx, t, startView(t, bob, nsGlobex))
	if got := browser.Eval[string](ctx, t, `document.querySelector("main").textContent`); strings.Contains(got, "bt-") {
		t.Errorf("bob's view of globex shows acme's holder or waiter of several resources:\n%s", got)
	}
}
