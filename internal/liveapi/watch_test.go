package liveapi_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/livefeed"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
)

// follower is a `kubectl get -w` running in the background, its output line by line.
type follower struct {
	t       *testing.T
	lines   chan string
	seen    []string
	pending []string
}

// follow starts kubectl with args and stops it when the test ends.
func follow(t *testing.T, kubeconfig string, args ...string) *follower {
	t.Helper()
	return followCommand(t, "kubectl", append([]string{"--kubeconfig", kubeconfig}, args...)...)
}

// followCommand starts a command and reads its output until the test ends, which stops it.
func followCommand(t *testing.T, name string, args ...string) *follower {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, name, args...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	f := &follower{t: t, lines: make(chan string, 100)}
	go func() {
		for s := bufio.NewScanner(out); s.Scan(); {
			f.lines <- s.Text()
		}
		close(f.lines)
	}()
	t.Cleanup(func() {
		cancel()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("%s %s: stderr:\n%s", name, strings.Join(args, " "), stderr.String())
		}
	})
	return f
}

// next waits for the next row of the table kubectl prints (--output-watch-events -o wide)
// and returns its event and holder ID. A holder read while it still books its levels
// (PENDING) is left out with the MODIFIED that makes it HELD: whether the feed's read falls in
// those milliseconds is chance.
func (f *follower) next() string {
	f.t.Helper()
	for {
		row := strings.Fields(f.line())
		if row[0] == "EVENT" {
			continue // the header
		}
		id := row[slices.IndexFunc(row, func(c string) bool { return strings.HasPrefix(c, lease.HolderIDPrefix) })]
		if slices.Contains(row, string(lease.StatePending)) {
			f.pending = append(f.pending, id)
			if row[0] == "ADDED" {
				f.seen = append(f.seen, "ADDED "+id)
				return "ADDED " + id
			}
			continue
		}
		if i := slices.Index(f.pending, id); i >= 0 && row[0] == "MODIFIED" {
			f.pending = slices.Delete(f.pending, i, i+1)
			continue
		}
		f.seen = append(f.seen, row[0]+" "+id)
		return row[0] + " " + id
	}
}

// line waits for kubectl's next line.
func (f *follower) line() string {
	f.t.Helper()
	select {
	case l, ok := <-f.lines:
		if !ok {
			f.t.Fatalf("the command ended; it printed %q", f.seen)
		}
		return l
	case <-time.After(20 * time.Second): // real time: a separate process's output
		f.t.Fatalf("no line from the command in 20 s; it printed %q", f.seen)
	}
	return ""
}

// expect reads the next row and requires it to be want. A row the same as one before is
// left out, and so is a MODIFIED of a holder shown before: a change the list showed may come
// once more from the watch. The list carries the feed's version from before its read, so
// a holder the feed last read while it booked its levels and the list read HELD comes again
// as MODIFIED at the feed's next read, with what the list showed.
func (f *follower) expect(want string) {
	f.t.Helper()
	got := f.next()
	for got != want && f.repeats(got) {
		got = f.next()
	}
	if got != want {
		f.t.Fatalf("kubectl printed %q, want %q (before: %q)", got, want, f.seen[:len(f.seen)-1])
	}
}

// repeats tells whether got, the last row read, shows again what an earlier row showed.
func (f *follower) repeats(got string) bool {
	before := f.seen[:len(f.seen)-1]
	if slices.Contains(before, got) {
		return true
	}
	id, ok := strings.CutPrefix(got, "MODIFIED ")
	return ok && slices.Contains(before, "ADDED "+id)
}

// quiet requires that nothing more is printed within d.
func (f *follower) quiet(d time.Duration) {
	f.t.Helper()
	select {
	case l, ok := <-f.lines:
		if ok {
			f.t.Errorf("kubectl printed %q, want nothing more", l)
		}
	case <-time.After(d): // real time: waiting for a line that must not come
	}
}

const holderKind = "leaseholder.live.lease.vancetope.io/"

// TestKubectlWatchesHolders: `kubectl get leaseholders -w` (the real kubectl) as a tenant user
// prints a grant, a check, a revocation and a release as they happen, in order, and never
// another tenant's holder; the cluster operator's `-A -w` sees both tenants.
func TestKubectlWatchesHolders(t *testing.T) {
	res := "kwatch"
	sel := "-l=live.lease.vancetope.io/resource=" + res
	// kubectl lists first and prints what it found as ADDED: the marker, in acme, tells that
	// each follower watches from then on.
	marker := acquire(t, "acme", res, "u0")
	alices := follow(t, aliceFile, "-n", nsAcme, "get", "leaseholders", sel, "-w", "--output-watch-events", "-o", "wide")
	all := follow(t, operatorFile, "get", "leaseholders", "-A", sel, "-w", "--output-watch-events", "-o", "wide")
	alices.expect("ADDED " + marker.ID)
	all.expect("ADDED " + marker.ID)
	// The issue's own command: names only, one line per change.
	names := follow(t, operatorFile, "get", "leaseholders", "-A", sel, "-w", "-o", "name")
	if l := <-names.lines; l != holderKind+marker.ID {
		t.Fatalf("kubectl get -w -o name printed %q first, want the marker", l)
	}

	a := acquire(t, "acme", res, "u1")
	alices.expect("ADDED " + a.ID)
	all.expect("ADDED " + a.ID)
	g := acquire(t, "globex", res, "g1")
	all.expect("ADDED " + g.ID)

	// A check moves lastSeenAt, which the holder shows.
	if err := store.Touch(ctxT(t), a.Token); err != nil {
		t.Fatal(err)
	}
	alices.expect("MODIFIED " + a.ID)
	all.expect("MODIFIED " + a.ID)

	// Revoked through the live API, and released.
	mustKubectl(t, bobFile, "-n", nsGlobex, "delete", "leaseholder", g.ID)
	all.expect("DELETED " + g.ID)
	if _, err := store.Release(ctxT(t), a.Token); err != nil {
		t.Fatal(err)
	}
	alices.expect("DELETED " + a.ID)
	all.expect("DELETED " + a.ID)
	// Names only: a's grant comes first, then g's, and nothing but a's and g's names (a
	// holder read while PENDING prints its name once more).
	var printed []string
	for len(printed) < 5 {
		select {
		case l := <-names.lines:
			if l == holderKind+marker.ID {
				continue // the list's holder once more (follower.expect)
			}
			if l != holderKind+a.ID && l != holderKind+g.ID {
				t.Fatalf("kubectl get -w -o name printed %q, want only %s and %s", l, a.ID, g.ID)
			}
			printed = append(printed, strings.TrimPrefix(l, holderKind))
		case <-time.After(20 * time.Second): // real time: a separate process's output
			t.Fatalf("kubectl get -w -o name: %q in 20 s, want at least grant, check, revocation and two releases", printed)
		}
	}
	if printed[0] != a.ID || slices.Index(printed, g.ID) < 1 {
		t.Errorf("kubectl get -w -o name printed %q, want %s first and %s later", printed, a.ID, g.ID)
	}
	alices.quiet(500 * time.Millisecond)
	if slices.ContainsFunc(alices.seen, func(l string) bool { return strings.Contains(l, g.ID) }) {
		t.Errorf("alice's watch in acme showed globex's holder %s: %q", g.ID, alices.seen)
	}
}

// TestKubectlWaitForDelete: `kubectl wait --for=delete` on a holder returns when it is released.
func TestKubectlWaitForDelete(t *testing.T) {
	h := acquire(t, "acme", "kwait", "u1")
	ctx, cancel := context.WithTimeout(ctxT(t), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "kubectl", "--kubeconfig", aliceFile, "-n", nsAcme, "wait", "--for=delete", "leaseholder/"+h.ID, "--timeout=30s")
	out := make(chan error, 1)
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { out <- cmd.Wait() }()
	time.Sleep(time.Second) // real time: kubectl is watching (or has read the holder) by then
	select {
	case err := <-out:
		t.Fatalf("kubectl wait returned before the release: %v\n%s%s", err, stdout.String(), stderr.String())
	default:
	}
	if _, err := store.Release(ctxT(t), h.Token); err != nil {
		t.Fatal(err)
	}
	if err := <-out; err != nil {
		t.Fatalf("kubectl wait --for=delete: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	if want := holderKind + h.ID + " condition met"; strings.TrimSpace(stdout.String()) != want {
		t.Errorf("kubectl wait printed %q, want %q", stdout.String(), want)
	}
}

// watchEvent is a watch event as type and object name.
type watchEvent struct{ Type, Name string }

// byObject groups events by object, each object's in order: the order a watch keeps (the
// changes to several objects that one read of the feed finds come in the order of names).
func byObject(evs []watchEvent) map[string][]string {
	out := map[string][]string{}
	for _, e := range evs {
		out[e.Name] = append(out[e.Name], e.Type)
	}
	return out
}

// collect reads w's events of objects (bookmarks left out) until n have come.
func collect(t *testing.T, w watch.Interface, n int) []watchEvent {
	t.Helper()
	var got []watchEvent
	timeout := time.After(20 * time.Second) // real time: the server's feed reads every 50 ms
	for len(got) < n {
		select {
		case e, ok := <-w.ResultChan():
			if !ok {
				t.Fatalf("the watch ended after %v", got)
			}
			if e.Type == watch.Error {
				t.Fatalf("watch error: %v", apierrors.FromObject(e.Object))
			}
			if e.Type != watch.Bookmark {
				got = append(got, watchEvent{string(e.Type), e.Object.(*unstructured.Unstructured).GetName()})
			}
		case <-timeout:
			t.Fatalf("%d events in 20 s, want %d: %v", len(got), n, got)
		}
	}
	return got
}

// TestAWatchFromAListsVersionMissesNothing: changes made between a list and a watch from its
// resourceVersion arrive in the watch, in order; a version older than the feed's window is
// 410 Expired.
func TestAWatchFromAListsVersionMissesNothing(t *testing.T) {
	res := "kresume"
	opts := metav1.ListOptions{LabelSelector: livev1alpha1.LabelResource + "=" + res}
	c := client(t, alice).Resource(holders).Namespace(nsAcme)
	list, err := c.List(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	if list.GetResourceVersion() == "" {
		t.Fatal("the list has no resourceVersion")
	}
	a := acquire(t, "acme", res, "u1")
	b := acquire(t, "acme", res, "u2")
	if _, err := store.Release(ctxT(t), a.Token); err != nil {
		t.Fatal(err)
	}
	time.Sleep(3 * feedInterval) // real time: the feed has read all three changes, before the watch starts

	opts.ResourceVersion = list.GetResourceVersion()
	w, err := c.Watch(ctxT(t), opts)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	// a's grant and release may come in one read of the feed (then a is never seen) or two;
	// a holder read while PENDING adds a MODIFIED, left out here.
	got := map[string][]string{}
	for deadline := time.Now().Add(20 * time.Second); len(got[b.ID]) == 0 || len(got[a.ID]) == 1; {
		if time.Now().After(deadline) {
			t.Fatalf("events in 20 s: %v", got)
		}
		for _, e := range collect(t, w, 1) {
			if e.Type != "MODIFIED" {
				got[e.Name] = append(got[e.Name], e.Type)
			}
		}
	}
	want := map[string][]string{b.ID: {"ADDED"}}
	if len(got[a.ID]) > 0 {
		want[a.ID] = []string{"ADDED", "DELETED"}
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("watch from the list's version, by holder (-want +got):\n%s", d)
	}

	_, err = c.Watch(ctxT(t), metav1.ListOptions{ResourceVersion: "1"})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("watch from version 1: %v, want 410 Expired", err)
	}
}

// TestAWatchBookmarksAndStreamsItsInitialState: with sendInitialEvents the watch starts with
// the holders there are and a bookmark that ends them; bookmarks follow when allowed.
func TestAWatchBookmarksAndStreamsItsInitialState(t *testing.T) {
	res := "kstream"
	h := acquire(t, "acme", res, "u1")
	time.Sleep(3 * feedInterval) // real time: the feed has read the grant
	yes := true
	w, err := client(t, alice).Resource(holders).Namespace(nsAcme).Watch(ctxT(t), metav1.ListOptions{
		LabelSelector: livev1alpha1.LabelResource + "=" + res, AllowWatchBookmarks: true,
		SendInitialEvents: &yes, ResourceVersionMatch: metav1.ResourceVersionMatchNotOlderThan,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	var types []string
	for len(types) < 3 {
		select {
		case e := <-w.ResultChan():
			u := e.Object.(*unstructured.Unstructured)
			types = append(types, string(e.Type))
			switch len(types) {
			case 1:
				if e.Type != watch.Added || u.GetName() != h.ID {
					t.Fatalf("first event %s %s, want ADDED %s", e.Type, u.GetName(), h.ID)
				}
			case 2:
				if e.Type != watch.Bookmark || u.GetAnnotations()[metav1.InitialEventsAnnotationKey] != "true" || u.GetResourceVersion() == "" {
					t.Fatalf("second event %s %v, want the bookmark that ends the initial events", e.Type, u.Object)
				}
			case 3:
				if e.Type != watch.Bookmark || len(u.GetAnnotations()) != 0 {
					t.Fatalf("third event %s %v, want a plain bookmark", e.Type, u.Object)
				}
			}
		case <-time.After(10 * time.Second): // real time: bookmarks come every 200 ms
			t.Fatalf("events %v in 10 s, want ADDED and two bookmarks", types)
		}
	}
}

// TestWatchesKeepTenantsApart: a tenant user's watch in its namespace never carries another
// tenant's holder, waiter or counter, not even as DELETED, whatever its selectors say.
func TestWatchesKeepTenantsApart(t *testing.T) {
	res := "kapart"
	byTenant := metav1.ListOptions{FieldSelector: "spec.tenant=acme"}
	watches := map[string]watch.Interface{}
	for name, w := range map[string]struct {
		cfg  *rest.Config
		ns   string
		opts metav1.ListOptions
		gvr  string
	}{
		"bob's holders":                      {bob, nsGlobex, metav1.ListOptions{}, livev1alpha1.ResourceHolders},
		"bob's holders of tenant acme":       {bob, nsGlobex, byTenant, livev1alpha1.ResourceHolders},
		"bob's waiters":                      {bob, nsGlobex, metav1.ListOptions{}, livev1alpha1.ResourceWaiters},
		"bob's counters":                     {bob, nsGlobex, metav1.ListOptions{}, livev1alpha1.ResourceCounters},
		"bob's counters of tenant acme":      {bob, nsGlobex, metav1.ListOptions{FieldSelector: "tenant=acme"}, livev1alpha1.ResourceCounters},
		"the operator's in globex's holders": {operator, nsGlobex, byTenant, livev1alpha1.ResourceHolders},
	} {
		gvr := holders
		gvr.Resource = w.gvr
		wi, err := client(t, w.cfg).Resource(gvr).Namespace(w.ns).Watch(ctxT(t), w.opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		defer wi.Stop()
		watches[name] = wi
	}
	// Alice's own watches in acme see the waiter come and go, and the tenant counter change.
	seeWaiters, err := client(t, alice).Resource(holders.GroupVersion().WithResource(livev1alpha1.ResourceWaiters)).Namespace(nsAcme).
		Watch(ctxT(t), metav1.ListOptions{ResourceVersion: feed.RV()})
	if err != nil {
		t.Fatal(err)
	}
	defer seeWaiters.Stop()
	seeCounters, err := client(t, alice).Resource(counters).Namespace(nsAcme).
		Watch(ctxT(t), metav1.ListOptions{ResourceVersion: feed.RV(), FieldSelector: "metadata.name=" + res + ".tenant.acme"})
	if err != nil {
		t.Fatal(err)
	}
	defer seeCounters.Stop()

	// acme takes the level and a second acquisition waits; both go.
	caps := []lease.LevelCap{{Level: lease.LevelTenant, Cap: 1}}
	req := func(user string) leasestore.AcquireRequest {
		return leasestore.AcquireRequest{LeaseName: res, Resource: res, Tenant: "acme", Project: "p1", User: user, Type: "tex",
			Caps: caps, Pod: self, TTL: time.Hour, WaitTTL: time.Hour}
	}
	first, err := store.Acquire(ctxT(t), req("u1"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = store.Acquire(ctxT(t), req("u2"))
	var lined *leasestore.WaitingError
	if !errors.As(err, &lined) {
		t.Fatalf("second acquisition: %v, want it to wait", err)
	}
	time.Sleep(3 * feedInterval) // real time: the feed reads the grant and the waiter
	if err := store.Withdraw(ctxT(t), lined.Token); err != nil {
		t.Fatal(err)
	}
	if _, err := store.Release(ctxT(t), first.Token); err != nil {
		t.Fatal(err)
	}
	time.Sleep(10 * feedInterval) // real time: the feed reads both, and the watches would have had them
	if got := byObject(collect(t, seeWaiters, 2)); !cmp.Equal(got, map[string][]string{lease.HolderID(lined.Token): {"ADDED", "DELETED"}}) {
		t.Errorf("alice's waiters watch: %v, want the waiter ADDED and DELETED", got)
	}
	if got := byObject(collect(t, seeCounters, 2)); len(got[res+".tenant.acme"]) < 2 || got[res+".tenant.acme"][0] != "ADDED" {
		t.Errorf("alice's counters watch: %v, want the tenant counter ADDED and changed", got)
	}
	for name, w := range watches {
		for drained := false; !drained; {
			select {
			case e := <-w.ResultChan():
				// Globex's own objects of other tests may come; nothing that names acme may.
				if strings.Contains(fmt.Sprint(e.Object.(*unstructured.Unstructured).Object), "acme") {
					t.Errorf("%s: got %s %v, want nothing of acme", name, e.Type, e.Object)
				}
			default:
				drained = true
			}
		}
	}
}

// TestAnInformerFollowsHolders: a client-go informer (list, then watch from the list's
// version) on leaseholders sees holders come and go.
func TestAnInformerFollowsHolders(t *testing.T) {
	res := "kinformer"
	before := acquire(t, "acme", res, "u0")
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client(t, alice), time.Hour, nsAcme,
		func(o *metav1.ListOptions) { o.LabelSelector = livev1alpha1.LabelResource + "=" + res })
	inf := factory.ForResource(holders).Informer()
	var mu sync.Mutex
	var seen []watchEvent
	record := func(typ string) func(any) {
		return func(obj any) {
			if d, ok := obj.(cache.DeletedFinalStateUnknown); ok {
				obj = d.Obj
			}
			mu.Lock()
			defer mu.Unlock()
			seen = append(seen, watchEvent{typ, obj.(*unstructured.Unstructured).GetName()})
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    record("ADDED"),
		DeleteFunc: record("DELETED"),
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("the informer did not sync")
	}
	until := func(want map[string][]string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for {
			mu.Lock()
			got := byObject(seen)
			mu.Unlock()
			if d := cmp.Diff(want, got); d == "" {
				return
			} else if time.Now().After(deadline) {
				t.Fatalf("informer events (-want +got):\n%s", d)
			}
			time.Sleep(50 * time.Millisecond) // real time: the informer runs apart
		}
	}
	// Held until the informer has it: a holder that comes and goes between two reads of the
	// feed makes no event (docs/live-api.md, "Watch").
	h := acquire(t, "acme", res, "u1")
	until(map[string][]string{before.ID: {"ADDED"}, h.ID: {"ADDED"}})
	for _, tok := range []string{before.Token, h.Token} {
		if _, err := store.Release(ctxT(t), tok); err != nil {
			t.Fatal(err)
		}
	}
	until(map[string][]string{before.ID: {"ADDED", "DELETED"}, h.ID: {"ADDED", "DELETED"}})
	if n := len(inf.GetStore().List()); n != 0 {
		t.Errorf("the informer's cache holds %d holders, want none", n)
	}
}

// TestWatchersAcrossAManagerRestart: `kubectl get leaseholders -A -w -o name` and an informer
// follow grants, a revocation, a reap (of a dead pod's holder) and releases; the manager
// restarts (its watches end), a holder is released while it is down, and afterwards the
// informer, after the 410 of its old version and a relist, holds exactly what the store does,
// and a new kubectl watch follows the new manager.
func TestWatchersAcrossAManagerRestart(t *testing.T) {
	res := "krestart"
	sel := "-l=live.lease.vancetope.io/resource=" + res
	marker := acquire(t, "acme", res, "u0")
	names := follow(t, operatorFile, "get", "leaseholders", "-A", sel, "-w", "-o", "name")
	if l := <-names.lines; l != holderKind+marker.ID {
		t.Fatalf("kubectl printed %q first, want the marker", l)
	}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(client(t, operator), time.Hour, "",
		func(o *metav1.ListOptions) { o.LabelSelector = livev1alpha1.LabelResource + "=" + res })
	inf := factory.ForResource(holders).Informer()
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	go inf.Run(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		t.Fatal("the informer did not sync")
	}
	cached := func() []string {
		var ids []string
		for _, o := range inf.GetStore().List() {
			ids = append(ids, o.(*unstructured.Unstructured).GetName())
		}
		slices.Sort(ids)
		return slices.Compact(ids) // a holder of a tenant with one namespace: once
	}
	converge := func(what string, want ...string) {
		t.Helper()
		slices.Sort(want)
		for deadline := time.Now().Add(60 * time.Second); ; {
			got := cached()
			if slices.Equal(got, want) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the informer holds %v, want %v", what, got, want)
			}
			time.Sleep(50 * time.Millisecond) // real time: the informer runs apart
		}
	}
	// nextName waits for want's line; lines of holders named before may come between (a
	// change the list showed may come again, and a grant read while PENDING comes twice).
	known := []string{marker.ID}
	nextName := func(want string) {
		t.Helper()
		for {
			select {
			case l, ok := <-names.lines:
				id := strings.TrimPrefix(l, holderKind)
				switch {
				case ok && id == want:
					known = append(known, want)
					return
				case !ok || !slices.Contains(known, id):
					t.Fatalf("kubectl get -w -o name printed %q (open %v), want %s", l, ok, want)
				}
			case <-time.After(20 * time.Second): // real time: a separate process's output
				t.Fatalf("kubectl get -w -o name: nothing for %s in 20 s", want)
			}
		}
	}

	// Grants: a and the dead pod's d in acme, b in globex.
	a := acquire(t, "acme", res, "u1")
	nextName(a.ID)
	dead := lease.PodRef{Namespace: nsAcme, Name: "dead-0", UID: "uid-dead-0"}
	d, err := store.Acquire(ctxT(t), leasestore.AcquireRequest{LeaseName: res, Resource: res, Tenant: "acme", Project: "p1", User: "u2",
		Type: "tex", Caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 100}}, Pod: dead, PodBound: true, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	nextName(d.ID)
	b := acquire(t, "globex", res, "g1")
	nextName(b.ID)
	converge("after the grants", marker.ID, a.ID, d.ID, b.ID)

	// A revocation (kubectl delete) and a reap (the reaper's revocation of a dead pod's holders).
	mustKubectl(t, bobFile, "-n", nsGlobex, "delete", "leaseholder", b.ID)
	nextName(b.ID)
	if _, err := store.RevokePod(ctxT(t), dead.Namespace, dead.Name); err != nil {
		t.Fatal(err)
	}
	nextName(d.ID)
	converge("after the revocation and the reap", marker.ID, a.ID)
	list, err := client(t, operator).Resource(holders).List(ctxT(t), metav1.ListOptions{LabelSelector: livev1alpha1.LabelResource + "=" + res})
	if err != nil {
		t.Fatal(err)
	}

	// The manager goes away; a is released while it is down; a new manager, a new feed.
	stopping := time.Now()
	env.StopServing()
	t.Logf("the manager stopped in %v", time.Since(stopping).Round(time.Millisecond))
	if _, err := store.Release(ctxT(t), a.Token); err != nil {
		t.Fatal(err)
	}
	restarted := livefeed.New(feedStore, livefeed.Options{Interval: feedInterval})
	go func() { _ = restarted.Run(suiteCtx) }()
	deps := suiteDeps
	deps.Feed = restarted
	t0 := time.Now()
	if err := env.Serve(suiteCtx, deps); err != nil {
		t.Fatal(err)
	}
	feed = restarted
	// The aggregator marks the API unavailable while no server answers, and available again
	// when its check finds the new one (in a cluster, other replicas answer meanwhile).
	if err := aggregatortest.WaitServed(ctxT(t), env.Config, livev1alpha1.GroupVersion); err != nil {
		t.Fatal(err)
	}
	t.Logf("served again %v after the restart", time.Since(t0).Round(time.Millisecond))
	converge("after the restart", marker.ID)

	// The old version is the old manager's: 410, and the client lists again.
	_, err = client(t, operator).Resource(holders).Watch(ctxT(t), metav1.ListOptions{ResourceVersion: list.GetResourceVersion()})
	if !apierrors.IsResourceExpired(err) && !apierrors.IsGone(err) {
		t.Errorf("watch from the old manager's version: %v, want 410 Expired", err)
	}
	// A kubectl watch of the new manager follows it.
	again := follow(t, operatorFile, "get", "leaseholders", "-A", sel, "-w", "-o", "name")
	if l := <-again.lines; l != holderKind+marker.ID {
		t.Fatalf("kubectl after the restart printed %q first, want the marker", l)
	}
	e := acquire(t, "acme", res, "u3")
	names = again
	nextName(e.ID)
	converge("after a grant on the new manager", marker.ID, e.ID)
}

// TestTheHolderWatchExampleReactsToGrantsAndEnds: examples/holder-watch, built and run with
// alice's kubeconfig on acme, prints a grant and the end of a lease as they happen.
func TestTheHolderWatchExampleReactsToGrantsAndEnds(t *testing.T) {
	bin := filepath.Join(t.TempDir(), "holder-watch")
	build := exec.Command("go", "build", "-o", bin, "../../examples/holder-watch")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building examples/holder-watch: %v\n%s", err, out)
	}
	res := "kexample"
	f := followCommand(t, bin, "-n", nsAcme, "-l", livev1alpha1.LabelResource+"="+res, "--kubeconfig", aliceFile)
	expect := func(prefix string) {
		t.Helper()
		if l := f.line(); !strings.HasPrefix(l, prefix) {
			t.Fatalf("holder-watch printed %q, want %q…", l, prefix)
		}
	}
	expect("watching leaseholders in namespace acme with " + livev1alpha1.LabelResource + "=" + res)
	h := acquire(t, "acme", res, "u1")
	expect(fmt.Sprintf("granted acme/%s: %s for p1/u1, fence %d", h.ID, res, h.Fence))
	if _, err := store.Release(ctxT(t), h.Token); err != nil {
		t.Fatal(err)
	}
	expect(fmt.Sprintf("ended acme/%s: %s (released, revoked or reaped)", h.ID, res))
}
