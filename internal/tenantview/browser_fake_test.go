package tenantview

import (
	"context"
	"strings"
	"testing"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/vancetope/lease-operator/internal/testutil/browser"
)

// The tests in this file drive the pages in headless Chromium over the in-memory fake
// source: they check the pages themselves (confirmation flow, view-only rendering, the
// phone layout). What a tenant sees and may revoke through RBAC is tested against the real
// live API in live_test.go.

// click clicks sel and waits for the page it leads to.
func click(t *testing.T, ctx context.Context, sel string) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel)))); err != nil {
		t.Fatalf("clicking %s: %v", sel, err)
	}
}

func navigate(t *testing.T, ctx context.Context, u string) {
	t.Helper()
	if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
		t.Fatalf("opening %s: %v", u, err)
	}
}

func eval[T any](t *testing.T, ctx context.Context, js string) T {
	t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// shownHolders are the holder names the table lists.
const shownHolders = `[...document.querySelectorAll("tr.holder")].map(r => r.dataset.holder)`

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	browser.Screenshot(t, name, png)
}

func TestFakeSourceBrowserRevokeThroughTheConfirmation(t *testing.T) {
	src := newFake()
	base := serve(t, src)
	ctx := browser.New(t, 1280, 900)
	navigate(t, ctx, base+"/")
	if got := eval[[]string](t, ctx, shownHolders); len(got) != 1 || got[0] != "0a1b2c" {
		t.Fatalf("holders shown: %v", got)
	}
	if got := eval[string](t, ctx, `document.querySelector("tr.holder .badge.warn").textContent.trim()`); got != "close to TTL" {
		t.Errorf("idle mark %q", got)
	}
	screenshot(t, ctx, "fake-index")
	click(t, ctx, `tr[data-holder="0a1b2c"] a.danger`)
	if got := eval[string](t, ctx, `document.querySelector("h2").textContent`); got != "Revoke this holder?" {
		t.Fatalf("confirmation page heading %q", got)
	}
	if len(src.revokedNames()) != 0 {
		t.Fatal("revoked before the confirmation")
	}
	click(t, ctx, "#confirm-revoke")
	if got := src.revokedNames(); len(got) != 1 {
		t.Fatalf("revoked %v; page: %s", got, eval[string](t, ctx, "document.body.innerText"))
	}
	if got := eval[[]string](t, ctx, shownHolders); len(got) != 0 {
		t.Errorf("holders shown after the revocation: %v", got)
	}
	if got := eval[string](t, ctx, `document.querySelector(".flash").textContent`); !strings.Contains(got, "revoked") {
		t.Errorf("flash %q", got)
	}
}

func TestFakeSourceBrowserPhoneLayout(t *testing.T) {
	base := serve(t, newFake())
	ctx := browser.New(t, 390, 844)
	navigate(t, ctx, base+"/")
	// On a narrow screen the table cells stack with their labels and nothing scrolls sideways.
	if w := eval[float64](t, ctx, `document.documentElement.scrollWidth - window.innerWidth`); w > 0 {
		t.Errorf("page is %v px wider than the phone's screen", w)
	}
	screenshot(t, ctx, "fake-phone")
}
