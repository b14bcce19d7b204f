package tenantview

import (
	"testing"

	"github.com/vancetope/lease-operator/internal/testutil/browser"
)

// The test in this file drives the page in headless Chromium over the in-memory fake source:
// it checks the layout only. What a tenant sees and may revoke through RBAC, in the same
// browser, is tested against the real live API in ./livetest.

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
