package browsertest

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/onsi/gomega"
	"k8s.io/client-go/rest"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/tenantview"
	"github.com/vancetope/lease-operator/internal/testutil/browser"
	"github.com/vancetope/lease-operator/internal/testutil/storetest"
)

func ctxT(t testing.TB) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// call sends an admission API request and returns the status and the JSON answer.
func call(t testing.TB, method, path, body string) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequestWithContext(ctxT(t), method, admission+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer func() { _ = resp.Body.Close() }()
	var out map[string]any
	_ = json.NewDecoder(resp.Body).Decode(&out) // some answers have no body
	return resp.StatusCode, out
}

// acquire takes a tex lease through the admission API, as a workload does, and releases it
// on cleanup.
func acquire(t testing.TB, tenant, project, user string) string {
	t.Helper()
	status, out := call(t, http.MethodPost, "/v1/leases",
		fmt.Sprintf(`{"type":"tex","lease":"tex","tenant":%q,"project":%q,"user":%q}`, tenant, project, user))
	token, _ := out["token"].(string)
	if status != http.StatusOK || token == "" {
		t.Fatalf("acquire %s/%s/%s: %d %v", tenant, project, user, status, out)
	}
	t.Cleanup(func() { call(t, http.MethodDelete, "/v1/leases/"+token, "") })
	return token
}

// check is the holder's check: 200 while it holds the lease, 410 LEASE_LOST after.
func check(t testing.TB, token string) int {
	t.Helper()
	status, _ := call(t, http.MethodPost, "/v1/leases/"+token+"/check", "")
	return status
}

// startView runs the view of namespace with user's credentials, as kubectl lease ui does,
// and returns its URL.
func startView(t testing.TB, user *rest.Config, namespace string, opts ...tenantview.Option) string {
	t.Helper()
	src, err := tenantview.NewKubeSource(user)
	if err != nil {
		t.Fatal(err)
	}
	view, err := tenantview.New(src, namespace, opts...)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: view.Handler(tenantview.HostsOf(ln.Addr())...), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

// What the page shows, read from the DOM as a person would see it.
const (
	jsHolders  = `[...document.querySelectorAll("tr.holder")].map(r => r.dataset.holder)`
	jsCounters = `[...document.querySelectorAll("tr.counter")].map(r => r.dataset.level + " " + r.dataset.scope + (r.classList.contains("drift") ? " drift" : ""))`
	// jsBars lists the occupancy card's levels as a person reads them: level, scope, the
	// bar's value/max when one is drawn, and its text.
	jsBars = `[...document.querySelectorAll("#occupancy li.level")].map(li => {
		const m = li.querySelector("meter");
		return li.dataset.level + " " + li.dataset.scope + ": " + (m ? "bar " + m.value + "/" + m.max + ", " : "") +
			li.querySelector(".num").textContent.trim().replace(/\s+/g, " ");
	})`
	jsHeading = `document.querySelector("main h2").textContent.trim()`
	jsRevokes = `document.querySelectorAll("a.danger").length`
)

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

func TestTenantSeesItsOwnHoldersAndCountersOnly(t *testing.T) {
	a1 := acquire(t, "acme", "thesis", "ann")
	a2 := acquire(t, "acme", "website", "cy")
	g1 := acquire(t, "globex", "apps", "bob")

	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	if got := browser.Eval[[]string](ctx, t, jsHolders); !slices.Equal(sorted(got...), sorted(lease.HolderID(a1), lease.HolderID(a2))) {
		t.Errorf("alice's view lists holders %v, want acme's %v (globex's is %s)", got, sorted(lease.HolderID(a1), lease.HolderID(a2)), lease.HolderID(g1))
	}
	// Counters of the other tests' released leases stay at 0 until a reconcile removes
	// them; they are acme's too.
	counters := browser.Eval[[]string](ctx, t, jsCounters)
	for _, want := range []string{"tenant acme", "project acme/thesis", "project acme/website"} {
		if !slices.Contains(counters, want) {
			t.Errorf("alice's view lists counters %v, lacking %q", counters, want)
		}
	}
	for _, c := range counters {
		if _, scope, _ := strings.Cut(c, " "); scope != "acme" && !strings.HasPrefix(scope, "acme/") {
			t.Errorf("alice's view lists counter %q, not of tenant acme", c)
		}
	}
	// Occupancy against the caps of the compiled-in tex definition (tenant 3, project 1,
	// user uncapped: no user counter).
	wantBars := sorted("tenant acme: bar 2/3, 2 of 3", "project acme/thesis: bar 1/1, 1 of 1 full",
		"project acme/website: bar 1/1, 1 of 1 full")
	if got := sorted(browser.Eval[[]string](ctx, t, jsBars)...); !slices.Equal(got, wantBars) {
		t.Errorf("alice's occupancy bars %q, want %q", got, wantBars)
	}
	if n := browser.Eval[float64](ctx, t, `document.querySelectorAll('[data-level="global"]').length`); n != 0 {
		t.Errorf("alice's view shows %v elements of the global level", n)
	}
	browser.Capture(ctx, t, "tenant-a")

	// The other tenant's namespace, with alice's credentials: the API says no.
	browser.Navigate(ctx, t, startView(t, alice, nsGlobex))
	if got := browser.Eval[string](ctx, t, jsHeading); got != "Not allowed for this tenant" {
		t.Errorf("alice's view of globex: heading %q", got)
	}
	// And bob sees globex's holder, none of acme's.
	browser.Navigate(ctx, t, startView(t, bob, nsGlobex))
	if got := browser.Eval[[]string](ctx, t, jsHolders); !slices.Equal(got, []string{lease.HolderID(g1)}) {
		t.Errorf("bob's view lists holders %v, want [%s]", got, lease.HolderID(g1))
	}
}

func TestRevokeInTheBrowser(t *testing.T) {
	h := acquire(t, "acme", "revoke", "dan")
	keep := acquire(t, "acme", "keep", "dan")
	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	browser.Click(ctx, t, fmt.Sprintf(`tr[data-holder=%q] a.danger`, lease.HolderID(h)))
	if got := browser.Eval[string](ctx, t, jsHeading); got != "Revoke this holder?" {
		t.Fatalf("after Revoke…: heading %q", got)
	}
	if got := check(t, h); got != http.StatusOK {
		t.Fatalf("check before the confirmation: %d, want 200", got)
	}
	browser.Capture(ctx, t, "confirm")
	browser.Click(ctx, t, "#confirm-revoke")

	if got := browser.Eval[string](ctx, t, `document.querySelector(".flash").textContent`); !strings.Contains(got, "revoked") {
		t.Errorf("flash after revoking: %q", got)
	}
	if got := browser.Eval[[]string](ctx, t, jsHolders); !slices.Equal(got, []string{lease.HolderID(keep)}) {
		t.Errorf("holders after revoking %s: %v, want [%s]", lease.HolderID(h), got, lease.HolderID(keep))
	}
	if got := check(t, h); got != http.StatusGone {
		t.Errorf("the revoked holder's check: %d, want 410 LEASE_LOST", got)
	}
	if got := check(t, keep); got != http.StatusOK {
		t.Errorf("the other holder's check: %d, want 200", got)
	}
}

// submitForged builds and submits a revoke form in the page, as a user who bypasses the
// missing button would; csrf true copies the page's own session token.
func submitForged(ctx context.Context, t *testing.T, holder string, csrf bool) {
	t.Helper()
	token := `""`
	if csrf {
		token = `document.querySelector('meta[name="csrf-token"]').content`
	}
	js := fmt.Sprintf(`(() => {
		const f = document.createElement("form");
		f.method = "post"; f.action = "/revoke";
		for (const [k, v] of [["csrf", %s], ["holder", %q]]) {
			const i = document.createElement("input");
			i.type = "hidden"; i.name = k; i.value = v; f.appendChild(i);
		}
		document.body.appendChild(f); f.submit(); return true;
	})()`, token, holder)
	bctx, cancel := browser.Bound(ctx)
	defer cancel()
	if _, err := chromedp.Run(bctx, chromedp.WaitEvent(page.LoadEventFired, nil, chromedp.Evaluate[bool](js))); err != nil {
		t.Fatalf("submitting a forged revoke: %v", err)
	}
}

func TestViewOnlyUserCannotRevoke(t *testing.T) {
	h := acquire(t, "acme", "viewonly", "eve")
	ctx := browser.New(t, 1280, 900)
	base := startView(t, vic, nsAcme)
	browser.Navigate(ctx, t, base)
	if got := browser.Eval[[]string](ctx, t, jsHolders); !slices.Contains(got, lease.HolderID(h)) {
		t.Fatalf("vic's view lists %v, want %s among them", got, lease.HolderID(h))
	}
	if n := browser.Eval[float64](ctx, t, jsRevokes); n != 0 {
		t.Errorf("vic's view shows %v revoke buttons, want none", n)
	}
	if !browser.Eval[bool](ctx, t, `document.getElementById("view-only") !== null`) {
		t.Error("vic's view does not say that it is view-only")
	}
	browser.Capture(ctx, t, "view-only")

	// With the session's token, the view passes the revocation on; the API refuses it.
	submitForged(ctx, t, lease.HolderID(h), true)
	if got := browser.Eval[string](ctx, t, jsHeading); got != "Not allowed for this tenant" {
		t.Errorf("forged revoke by a viewer: heading %q, want the API's refusal", got)
	}
	browser.Capture(ctx, t, "not-allowed")
	// Without it, the view refuses it itself.
	browser.Navigate(ctx, t, base)
	submitForged(ctx, t, lease.HolderID(h), false)
	if got := browser.Eval[string](ctx, t, jsHeading); got != "Request refused" {
		t.Errorf("revoke without the session's token: heading %q", got)
	}
	if got := check(t, h); got != http.StatusOK {
		t.Errorf("the holder after the forged revokes: check %d, want 200", got)
	}
}

func TestDriftShowsAndDisappearsAfterReconcile(t *testing.T) {
	acquire(t, "acme", "thesis", "ann")
	acquire(t, "acme", "website", "cy")
	h := acquire(t, "acme", "crash", "fay")
	// Entries of a holder that is gone at fay's counters, as bookings that arrived after
	// their holder's release leave them: the counters stay one above the holders that exist.
	held, err := store.GetHolder(ctxT(t), h)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := store.Release(ctxT(t), h); err != nil {
		t.Fatal(err)
	}
	for _, k := range held.Levels {
		if err := storetest.LateEntry(ctxT(t), dbURI, dbName, k, "lh-00000000000000000000dead"); err != nil {
			t.Fatal(err)
		}
	}

	ctx := browser.New(t, 1280, 1000)
	// The docs' screenshot shows this page as it looks 95 s later, when the holders are
	// close to their 120 s TTL.
	base := startView(t, alice, nsAcme, tenantview.WithClock(clocktesting.NewFakePassiveClock(time.Now().Add(95*time.Second))))
	browser.Navigate(ctx, t, base)
	counters := browser.Eval[[]string](ctx, t, jsCounters)
	for _, want := range []string{"tenant acme drift", "project acme/crash drift", "project acme/thesis"} {
		if !slices.Contains(counters, want) {
			t.Errorf("counters %v lack %q", counters, want)
		}
	}
	if !browser.Eval[bool](ctx, t, `document.getElementById("drift-banner") !== null`) {
		t.Error("no drift banner")
	}
	browser.Capture(ctx, t, "drift")

	// Reconcile removes the entries of the gone holder, and then the counter nobody books;
	// until then the drift stays on the page.
	gomega.NewWithT(t).Eventually(func() ([]string, error) {
		if _, err := store.Reconcile(ctxT(t)); err != nil {
			return nil, err
		}
		bctx, cancel := browser.Bound(ctx)
		defer cancel()
		if err := chromedp.Do(bctx, chromedp.Navigate(base)); err != nil {
			return nil, err
		}
		counters, err = chromedp.Run(bctx, chromedp.Evaluate[[]string](jsCounters))
		return counters, err
	}).WithTimeout(30*time.Second).WithPolling(100*time.Millisecond).
		Should(gomega.ConsistOf("tenant acme", "project acme/thesis", "project acme/website"),
			"counters after reconcile: the gone holder's entries removed, then the emptied counter deleted (after the safety margin)")
	if browser.Eval[bool](ctx, t, `document.getElementById("drift-banner") !== null`) {
		t.Error("drift banner still shown after reconcile")
	}
	if want := []string{"tenant acme", "project acme/thesis", "project acme/website"}; !slices.Equal(sorted(counters...), sorted(want...)) {
		t.Errorf("counters after reconcile %v, want %v", counters, want)
	}
}

// answer is a waiting acquisition's answer: its token once a slot is handed to it.
type answer struct {
	token string
	err   error
}

// acquireWaiting sends the acquisition body (with a long waitMs) to the admission API on its
// own goroutine: the answer comes when a slot is handed to it.
func acquireWaiting(body string) <-chan answer {
	got := make(chan answer, 1)
	go func() {
		resp, err := http.Post(admission+"/v1/leases", "application/json", strings.NewReader(body))
		if err != nil {
			got <- answer{err: err}
			return
		}
		defer func() { _ = resp.Body.Close() }()
		var out struct{ Token string }
		err = json.NewDecoder(resp.Body).Decode(&out)
		if err == nil && (resp.StatusCode != http.StatusOK || out.Token == "") {
			err = fmt.Errorf("waiting acquisition %s: status %d", body, resp.StatusCode)
		}
		got <- answer{out.Token, err}
	}()
	return got
}

// grantedTo waits for the answer of a waiting acquisition and releases it on cleanup.
func grantedTo(t testing.TB, ch <-chan answer) string {
	t.Helper()
	select {
	case a := <-ch:
		if a.err != nil {
			t.Fatal(a.err)
		}
		t.Cleanup(func() { call(t, http.MethodDelete, "/v1/leases/"+a.token, "") })
		return a.token
	case <-time.After(30 * time.Second): // real time: bounded wait for the hand-over's answer
		t.Fatal("no answer to a waiting acquisition")
		return ""
	}
}

// waitersInLine waits until the store lists n waiters matching f.
func waitersInLine(t testing.TB, f leasestore.HolderFilter, n int) {
	t.Helper()
	gomega.NewWithT(t).Eventually(func() int {
		ws, err := store.ListWaiters(ctxT(t), f)
		if err != nil {
			t.Fatal(err)
		}
		return len(ws)
	}).WithTimeout(20 * time.Second).Should(gomega.Equal(n))
}

// TestWaitersShowTheirPlaceInTheBrowser: acquisitions waiting for a full project level
// appear in the Waiting section, oldest first, with the full level, their position and,
// after a hand-over recorded a hold time, an estimated wait; globex's view shows none of
// them; and a waiter leaves the section when the slot is handed to it.
func TestWaitersShowTheirPlaceInTheBrowser(t *testing.T) {
	first := acquire(t, "acme", "queue", "ann")
	wait := func(user string) <-chan answer {
		return acquireWaiting(fmt.Sprintf(`{"type":"tex","lease":"tex","tenant":"acme","project":"queue","user":%q,"waitMs":30000}`, user))
	}
	granted := func(ch <-chan answer) string {
		t.Helper()
		return grantedTo(t, ch)
	}
	inLine := func(n int) {
		t.Helper()
		waitersInLine(t, leasestore.HolderFilter{Tenant: "acme", Project: "queue"}, n)
	}
	cy := wait("cy")
	inLine(1)
	time.Sleep(50 * time.Millisecond) // real time: ann holds for a measurable time before she hands over
	call(t, http.MethodDelete, "/v1/leases/"+first, "")
	cyToken := granted(cy) // the hand-over recorded ann's hold time
	dan := wait("dan")
	inLine(1)
	eve := wait("eve")
	inLine(2)

	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	const jsWaiters = `[...document.querySelectorAll("tr.waiter")].map(r =>
		[...r.querySelectorAll("td")].slice(2, 8).map(td => td.textContent.trim().replace(/\s+/g, " ")).join(" | "))`
	rows := browser.Eval[[]string](ctx, t, jsWaiters)
	if len(rows) != 2 || !strings.HasPrefix(rows[0], "dan | ") || !strings.HasPrefix(rows[1], "eve | ") {
		t.Fatalf("alice's Waiting section %q, want dan then eve", rows)
	}
	for i, row := range rows {
		cells := strings.Split(row, " | ")
		if cells[2] != "project acme/queue" || cells[3] != "0" || cells[4] != fmt.Sprintf("%d ahead", i) || !strings.HasPrefix(cells[5], "about ") {
			t.Errorf("waiter row %q: want the project level acme/queue, priority 0, %d ahead and an estimate", row, i)
		}
	}
	if got := browser.Eval[string](ctx, t, `document.querySelector("#wait-h").textContent.trim()`); got != "Waiting (2)" {
		t.Errorf("Waiting heading %q", got)
	}
	browser.Capture(ctx, t, "waiting")
	browser.Navigate(ctx, t, startView(t, bob, nsGlobex))
	if n := browser.Eval[float64](ctx, t, `document.querySelectorAll("tr.waiter").length`); n != 0 {
		t.Errorf("bob's view of globex shows %v of acme's waiters", n)
	}

	// cy's release hands the slot to dan: one waiter is left, first in line.
	call(t, http.MethodDelete, "/v1/leases/"+cyToken, "")
	danToken := granted(dan)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	if rows := browser.Eval[[]string](ctx, t, jsWaiters); len(rows) != 1 || !strings.HasPrefix(rows[0], "eve | ") || !strings.Contains(rows[0], "| 0 ahead |") {
		t.Errorf("after the hand-over: %q, want eve alone, 0 ahead", rows)
	}
	call(t, http.MethodDelete, "/v1/leases/"+danToken, "")
	call(t, http.MethodDelete, "/v1/leases/"+granted(eve), "")
}

// TestBorrowingAndPriorityShowInTheBrowser: under the suite's pdf definition (tenant 1, one
// slot borrowable, priorities up to 5), acme's second holder is granted above its tenant cap
// and its row is marked borrowed, the tenant counter counts it as borrowed, and of the two
// acquisitions then waiting at the tenant level the urgent one stands first with its
// priority shown, though it lined up last (docs/borrowing.md, docs/waiting.md "Priority").
func TestBorrowingAndPriorityShowInTheBrowser(t *testing.T) {
	take := func(user string) string {
		t.Helper()
		status, out := call(t, http.MethodPost, "/v1/leases",
			fmt.Sprintf(`{"type":"tex","lease":"pdf","tenant":"acme","project":"print","user":%q}`, user))
		token, _ := out["token"].(string)
		if status != http.StatusOK || token == "" {
			t.Fatalf("acquire pdf for %s: %d %v", user, status, out)
		}
		return token
	}
	within, borrower := take("ann"), take("bob")
	wait := func(user string, priority int) <-chan answer {
		return acquireWaiting(fmt.Sprintf(`{"type":"tex","lease":"pdf","tenant":"acme","project":"print","user":%q,"waitMs":30000,"priority":%d}`, user, priority))
	}
	inLine := func(n int) {
		t.Helper()
		waitersInLine(t, leasestore.HolderFilter{Tenant: "acme", Resource: "pdf"}, n)
	}
	dan := wait("dan", 0)
	inLine(1)
	cy := wait("cy", 3)
	inLine(2)

	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	const jsPdfHolders = `[...document.querySelectorAll("tr.holder")].filter(r => r.cells[0].textContent.trim().startsWith("pdf")).map(r =>
		r.cells[2].textContent.trim() + ": " + r.cells[0].textContent.trim().replace(/\s+/g, " ") + (r.classList.contains("borrowed") ? " (row marked)" : ""))`
	if got, want := browser.Eval[[]string](ctx, t, jsPdfHolders), []string{"ann: pdf", "bob: pdf borrowed (row marked)"}; !slices.Equal(got, want) {
		t.Errorf("pdf holders %q, want %q", got, want)
	}
	const jsBorrowed = `[...document.querySelectorAll("tr.counter[data-resource=pdf]")].map(r => r.dataset.level + " " + r.querySelector("td.borrowed").textContent.trim())`
	if got, want := browser.Eval[[]string](ctx, t, jsBorrowed), []string{"tenant 1"}; !slices.Equal(got, want) {
		t.Errorf("pdf counters' borrowed cells %q, want %q", got, want)
	}
	if got := browser.Eval[string](ctx, t, `document.querySelector("#occupancy li.level[data-level=tenant][data-scope=acme] .badge.borrowed")?.textContent.trim() ?? ""`); got != "1 borrowed" {
		t.Errorf("occupancy of pdf's tenant level says %q, want 1 borrowed", got)
	}
	const jsPdfWaiters = `[...document.querySelectorAll("tr.waiter")].map(r => r.cells[2].textContent.trim() + " priority " + r.querySelector("td.priority").textContent.trim() + ", " + r.querySelector("td.position").textContent.trim())`
	if got, want := browser.Eval[[]string](ctx, t, jsPdfWaiters), []string{"cy priority 3, 0 ahead", "dan priority 0, 1 ahead"}; !slices.Equal(got, want) {
		t.Errorf("Waiting section %q, want %q", got, want)
	}
	browser.Capture(ctx, t, "borrowing-priority")

	// The releases hand the slots over, the urgent waiter's first.
	call(t, http.MethodDelete, "/v1/leases/"+within, "")
	grantedTo(t, cy)
	call(t, http.MethodDelete, "/v1/leases/"+borrower, "")
	grantedTo(t, dan)
}

// TestTheViewUpdatesItself: with the page open (and not reloaded), a grant made outside
// appears in the holders' table, and its release takes it away, as they happen: the page
// follows the live API's watches through its event stream.
func TestTheViewUpdatesItself(t *testing.T) {
	ctx := browser.New(t, 1280, 900)
	browser.Navigate(ctx, t, startView(t, alice, nsAcme))
	waitPage := func(what, js string) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !browser.Eval[bool](ctx, t, js); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 20 s; the page shows holders %v", what, browser.Eval[[]string](ctx, t, jsHolders))
			}
			time.Sleep(50 * time.Millisecond) // real time: the browser runs apart
		}
	}
	waitPage("the live indicator", `!document.getElementById("live").hidden && document.getElementById("autorefresh").hidden`)
	browser.Eval[int](ctx, t, `window.sameDocument = 1`) // gone if the page reloads

	token := acquire(t, "acme", "thesis", "liv")
	id := lease.HolderID(token)
	waitPage("the grant made outside", fmt.Sprintf(`[...document.querySelectorAll("tr.holder")].some(r => r.dataset.holder === %q)`, id))
	if status, out := call(t, http.MethodDelete, "/v1/leases/"+token, ""); status != http.StatusOK {
		t.Fatalf("release: %d %v", status, out)
	}
	waitPage("the release", fmt.Sprintf(`![...document.querySelectorAll("tr.holder")].some(r => r.dataset.holder === %q)`, id))
	if !browser.Eval[bool](ctx, t, `window.sameDocument === 1`) {
		t.Error("the page was reloaded; want its content updated in place")
	}
}
