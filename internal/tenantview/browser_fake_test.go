package tenantview

import (
	"strings"
	"testing"

	"github.com/vancetope/lease-operator/internal/testutil/browser"
)

// The tests in this file drive the pages in headless Chromium over the in-memory fake
// source: they check the pages themselves (confirmation flow, view-only rendering, the
// phone layout). What a tenant sees and may revoke through RBAC is tested against the real
// live API in live_test.go.

// shownHolders are the holder names the table lists.
const shownHolders = `[...document.querySelectorAll("tr.holder")].map(r => r.dataset.holder)`

func TestFakeSourceBrowserRevokeThroughTheConfirmation(t *testing.T) {
	src := newFake()
	base := serve(t, src)
	ctx := browser.New(t, 1280, 900)
	browser.Navigate(t, ctx, base+"/")
	if got := browser.Eval[[]string](t, ctx, shownHolders); len(got) != 1 || got[0] != "0a1b2c" {
		t.Fatalf("holders shown: %v", got)
	}
	if got := browser.Eval[string](t, ctx, `document.querySelector("tr.holder .badge.warn").textContent.trim()`); got != "close to TTL" {
		t.Errorf("idle mark %q", got)
	}
	browser.Capture(t, ctx, "fake-index")
	browser.Click(t, ctx, `tr[data-holder="0a1b2c"] a.danger`)
	if got := browser.Eval[string](t, ctx, `document.querySelector("h2").textContent`); got != "Revoke this holder?" {
		t.Fatalf("confirmation page heading %q", got)
	}
	if len(src.revokedNames()) != 0 {
		t.Fatal("revoked before the confirmation")
	}
	browser.Click(t, ctx, "#confirm-revoke")
	if got := src.revokedNames(); len(got) != 1 {
		t.Fatalf("revoked %v; page: %s", got, browser.Eval[string](t, ctx, "document.body.innerText"))
	}
	if got := browser.Eval[[]string](t, ctx, shownHolders); len(got) != 0 {
		t.Errorf("holders shown after the revocation: %v", got)
	}
	if got := browser.Eval[string](t, ctx, `document.querySelector(".flash").textContent`); !strings.Contains(got, "revoked") {
		t.Errorf("flash %q", got)
	}
}

func TestFakeSourceBrowserPhoneLayout(t *testing.T) {
	base := serve(t, newFake())
	ctx := browser.New(t, 390, 844)
	browser.Navigate(t, ctx, base+"/")
	// On a narrow screen the table cells stack with their labels and nothing scrolls sideways.
	if w := browser.Eval[float64](t, ctx, `document.documentElement.scrollWidth - window.innerWidth`); w > 0 {
		t.Errorf("page is %v px wider than the phone's screen", w)
	}
	browser.Capture(t, ctx, "fake-phone")
}
