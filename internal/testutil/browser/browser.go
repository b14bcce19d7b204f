// Package browser starts headless Chromium for tests that drive a page like a user
// (chromedp). Chromium is Debian's `chromium` package (/usr/bin/chromium) or $CHROMIUM. A
// missing browser skips the test on a developer's machine and fails it in CI (CI=true), so
// that the browser suites never silently stop running there.
package browser

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
)

// EnvChromium names the browser binary, overriding the default lookup.
const EnvChromium = "CHROMIUM"

// EnvArtifacts names the directory screenshots are written to (default: a temporary
// directory, printed in the test log).
const EnvArtifacts = "TEST_ARTIFACTS_DIR"

// ExecPath returns the Chromium binary, or "" when none is installed.
func ExecPath() string {
	if p := os.Getenv(EnvChromium); p != "" {
		// An explicit choice is not second-guessed with another browser.
		if _, err := exec.LookPath(p); err != nil {
			return ""
		}
		return p
	}
	for _, name := range []string{"/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	return ""
}

// Require returns the Chromium binary; without one it fails the test in CI and skips it
// elsewhere, naming the package to install.
func Require(t testing.TB) string {
	t.Helper()
	p := ExecPath()
	if p != "" {
		return p
	}
	msg := "headless Chromium is needed for the browser tests: install Debian's package `chromium` (apt-get install -y chromium) or set $" + EnvChromium
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}

// New starts a headless browser for the test and returns a context for chromedp.Run in a
// fresh tab; every call gets its own browser (own cookies, so its own session). The browser
// is closed on cleanup.
func New(t testing.TB, width, height int) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(Require(t)),
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.WindowSize(width, height),
		chromedp.Flag("no-first-run", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	)
	if os.Geteuid() == 0 {
		// Chromium refuses to run as root with its sandbox (containers, CI).
		opts = append(opts, chromedp.NoSandbox)
	}
	allocCtx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(allocCtx, chromedp.WithErrorf(t.Logf))
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting Chromium: %v", err)
	}
	return ctx
}

var (
	artifactsOnce sync.Once
	artifactsDir  string
	artifactsErr  error
)

// Screenshot writes png under the artifacts directory as name.png and returns its path.
func Screenshot(t testing.TB, name string, png []byte) string {
	t.Helper()
	artifactsOnce.Do(func() {
		artifactsDir = os.Getenv(EnvArtifacts)
		if artifactsDir == "" {
			artifactsDir, artifactsErr = os.MkdirTemp("", "lease-browser-artifacts-")
		} else {
			artifactsErr = os.MkdirAll(artifactsDir, 0o755)
		}
	})
	if artifactsErr != nil {
		t.Fatalf("artifacts directory: %v", artifactsErr)
	}
	path := filepath.Join(artifactsDir, strings.ReplaceAll(name, "/", "_")+".png")
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatalf("writing screenshot: %v", err)
	}
	t.Logf("Screenshot: %s", path)
	return path
}

// ActionTimeout bounds each browser action of the helpers below (and of tests that call
// chromedp themselves through Bound): a page that never loads or an event that never fires
// fails the test instead of hanging it.
const ActionTimeout = 30 * time.Second

// Bound returns ctx (a tab's context from New) with ActionTimeout on the actions run with it;
// the tab stays open when it ends.
func Bound(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, ActionTimeout)
}

// Navigate opens u in the tab of ctx and waits for it to load.
func Navigate(ctx context.Context, t testing.TB, u string) {
	t.Helper()
	ctx, cancel := Bound(ctx)
	defer cancel()
	if err := chromedp.Do(ctx, chromedp.Navigate(u)); err != nil {
		t.Fatalf("opening %s: %v", u, err)
	}
}

// Click clicks the element sel (CSS) and waits for the page it leads to.
func Click(ctx context.Context, t testing.TB, sel string) {
	t.Helper()
	ctx, cancel := Bound(ctx)
	defer cancel()
	if _, err := chromedp.Run(ctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Click(chromedp.CSS(sel)))); err != nil {
		t.Fatalf("clicking %s: %v", sel, err)
	}
}

// Eval evaluates js in the page and decodes its value.
func Eval[T any](ctx context.Context, t testing.TB, js string) T {
	t.Helper()
	ctx, cancel := Bound(ctx)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js))
	if err != nil {
		t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// Capture writes a full-page PNG screenshot of the tab as name.png in the artifacts
// directory and returns its path.
func Capture(ctx context.Context, t testing.TB, name string) string {
	t.Helper()
	ctx, cancel := Bound(ctx)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot: %v", err)
	}
	return Screenshot(t, name, png)
}
