package tenantview

import (
	"context"
	"fmt"
	"testing"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"

	"github.com/vancetope/lease-operator/internal/testutil/browser"
)

// The tests in this file drive the pages in headless Chromium over the in-memory fake
// source: they check the layout and keyboard use only. What a tenant sees and may revoke
// through RBAC, in the same browser, is tested against the real live API in ./browsertest.

func TestFakeSourceBrowserPhoneLayout(t *testing.T) {
	base := serve(t, newFake())
	ctx := browser.New(t, 390, 844)
	browser.Navigate(ctx, t, base+"/")
	// On a narrow screen the table cells stack with their labels and nothing scrolls sideways.
	if w := browser.Eval[float64](ctx, t, `document.documentElement.scrollWidth - window.innerWidth`); w > 0 {
		t.Errorf("page is %v px wider than the phone's screen", w)
	}
	browser.Capture(ctx, t, "fake-phone")
}

// tabTo presses Tab until the focused element matches sel, at most limit times, and
// returns the number of presses.
func tabTo(ctx context.Context, t *testing.T, sel string, limit int) int {
	t.Helper()
	for i := 1; i <= limit; i++ {
		if err := chromedp.Do(ctx, chromedp.KeyEvent("\t")); err != nil {
			t.Fatalf("pressing Tab: %v", err)
		}
		if browser.Eval[bool](ctx, t, fmt.Sprintf(`document.activeElement.matches(%q)`, sel)) {
			return i
		}
	}
	t.Fatalf("%s not reached with %d Tabs; focus is on %s", sel, limit, browser.Eval[string](ctx, t, `document.activeElement.outerHTML`))
	return 0
}

// pressEnter presses Enter on the focused element and waits for the page it leads to.
func pressEnter(ctx context.Context, t *testing.T) {
	t.Helper()
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.KeyEvent("\r"))); err != nil {
		t.Fatalf("pressing Enter: %v", err)
	}
}

func TestFakeSourceBrowserKeyboardOnly(t *testing.T) {
	src := newFake()
	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, serve(t, src)+"/")
	if n := tabTo(ctx, t, "a.skip", 1); n != 1 {
		t.Errorf("the skip link is not the first stop")
	}
	tabTo(ctx, t, `tr[data-holder="0a1b2c"] a.danger`, 10)
	pressEnter(ctx, t)
	tabTo(ctx, t, "#confirm-revoke", 10)
	pressEnter(ctx, t)
	if got := src.revokedNames(); len(got) != 1 {
		t.Errorf("revoked %v with the keyboard, want the holder", got)
	}
}

// The refresh toggle is an enhancement: hidden without the script, shown and remembered
// with it.
func TestFakeSourceBrowserRefreshToggle(t *testing.T) {
	ctx := browser.New(t, 1280, 900)
	base := serve(t, newFake()) + "/"
	browser.Navigate(ctx, t, base)
	if browser.Eval[bool](ctx, t, `document.getElementById("autorefresh").hidden`) {
		t.Fatal("the refresh toggle stays hidden with the script running")
	}
	if err := chromedp.Do(ctx, chromedp.Click(chromedp.CSS("#autorefresh-box"))); err != nil {
		t.Fatal(err)
	}
	browser.Navigate(ctx, t, base)
	if !browser.Eval[bool](ctx, t, `document.getElementById("autorefresh-box").checked`) {
		t.Error("the refresh choice is not remembered across a reload")
	}
}
