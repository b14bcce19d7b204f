package podwatch_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	testingclock "k8s.io/utils/clock/testing"
	logf "sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/podwatch"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// The cost of callers that are no pod (docs/operations.md, "Pod identity"): how many pod
// LISTs the kube-apiserver gets for 1 000 acquisitions from addresses no pod has.

var (
	envOnce sync.Once
	env     *testenv.Env
	envErr  error
)

func TestMain(m *testing.M) {
	logf.SetLogger(logr.Discard())
	code := m.Run()
	if env != nil {
		_ = env.Stop()
	}
	os.Exit(code)
}

// controlPlane starts the package's one control plane on first use, so that the unit tests
// run without it.
func controlPlane(tb testing.TB) *testenv.Env {
	tb.Helper()
	assets := testenv.AssetsOrSkip(tb)
	envOnce.Do(func() { env, envErr = testenv.Start(assets, testenv.Options{}) })
	if envErr != nil {
		tb.Fatal(envErr)
	}
	return env
}

// podLists counts the pod LISTs by IP (fieldSelector status.podIP) sent with its config:
// the lookups of Identify, not the informer's own LIST and WATCH.
type podLists struct{ n atomic.Int64 }

type roundTripperFunc func(*http.Request) (*http.Response, error)

func (f roundTripperFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func (c *podLists) config(base *rest.Config) *rest.Config {
	cfg := rest.CopyConfig(base)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return roundTripperFunc(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/pods") &&
				strings.Contains(r.URL.Query().Get("fieldSelector"), "status.podIP") {
				c.n.Add(1)
			}
			return rt.RoundTrip(r)
		})
	})
	return cfg
}

// startWatcher runs a Watcher on the control plane until the test ends, its informer synced.
func startWatcher(tb testing.TB, cfg *rest.Config, opt ...podwatch.Option) *podwatch.Watcher {
	tb.Helper()
	w, err := podwatch.New(cfg, opt...)
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Start(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Error(err)
		}
	})
	sync, cancelSync := context.WithTimeout(ctx, 30*time.Second)
	defer cancelSync()
	if !w.WaitForSync(sync) {
		tb.Fatal("pod informer did not sync")
	}
	return w
}

// answers counts Identify's answers by kind.
type answers struct {
	None        int // the zero PodRef: no pod
	Unavailable int // lease.ErrUnavailable
}

// unknownAddr is the i-th of the addresses no pod of the control plane has, in the block of
// round (so that rounds of a benchmark do not share addresses).
func unknownAddr(round, i int) string {
	return fmt.Sprintf("10.%d.%d.%d", 100+round%100, i/250, 1+i%250)
}

// calls returns the predicate of identifyUnknown for n calls.
func calls(n int) func(int) bool { return func(i int) bool { return i < n } }

// identifyUnknown calls Identify from distinct addresses (round robin), from workers
// goroutines, while more(the call's number) holds, and counts the answers.
func identifyUnknown(tb testing.TB, w *podwatch.Watcher, round, distinct, workers int, more func(int) bool) answers {
	tb.Helper()
	var (
		mu   sync.Mutex
		got  answers
		next atomic.Int64
		wg   sync.WaitGroup
	)
	for range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if !more(i) {
					return
				}
				ref, err := w.Identify(context.Background(), unknownAddr(round, i%distinct))
				mu.Lock()
				switch {
				case errors.Is(err, lease.ErrUnavailable):
					got.Unavailable++
				case err != nil || ref != (lease.PodRef{}):
					tb.Errorf("Identify(%s) = %v, %v; want no pod or unavailable", unknownAddr(round, i%distinct), ref, err)
				default:
					got.None++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	return got
}

// TestUnknownCallersCost: 1 000 acquisitions from addresses that no pod has cost the API
// server at most the lookup burst (DefaultLookupBurst, 20) in pod LISTs, however many
// addresses they come from; the rest is answered from memory (no pod) or refused
// (unavailable). The clock stands still, so the rate limit adds no tokens and no address is
// forgotten. Before the bound, each case cost 1 000 LISTs.
func TestUnknownCallersCost(t *testing.T) {
	e := controlPlane(t)
	cases := map[string]struct {
		distinct, workers int
		lists             int64
		want              answers
	}{
		// The first 20 addresses are looked up once each; every later call from them is
		// answered from the negative cache. The 30 others find the bucket empty.
		"50 addresses": {distinct: 50, workers: 1, lists: 20, want: answers{None: 400, Unavailable: 600}},
		// Concurrent callers of one address share one lookup.
		"50 addresses, 50 callers at once": {distinct: 50, workers: 50, lists: 20, want: answers{None: 400, Unavailable: 600}},
		"1000 addresses":                   {distinct: 1000, workers: 1, lists: 20, want: answers{None: 20, Unavailable: 980}},
	}
	round := 0
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			round++
			var lists podLists
			clk := testingclock.NewFakeClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
			w := startWatcher(t, lists.config(e.Config), podwatch.WithClock(clk))
			got := identifyUnknown(t, w, round, tc.distinct, tc.workers, calls(1000))
			t.Logf("1000 calls from %d addresses: %d pod LISTs, %+v", tc.distinct, lists.n.Load(), got)
			if n := lists.n.Load(); n != tc.lists {
				t.Errorf("pod LISTs = %d, want %d", n, tc.lists)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
		})
	}
}

// TestKnownPodsDuringAFlood: a flood that empties the bucket does not keep out a pod the
// informer knows, even at an address remembered as no pod: the informer is asked first.
func TestKnownPodsDuringAFlood(t *testing.T) {
	e := controlPlane(t)
	ctx := context.Background()
	var lists podLists
	clk := testingclock.NewFakeClock(time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC))
	w := startWatcher(t, lists.config(e.Config), podwatch.WithClock(clk))
	const round = 90
	got := identifyUnknown(t, w, round, 1000, 1, calls(1000))
	if got.Unavailable != 980 {
		t.Fatalf("the flood got %+v, want the bucket emptied", got)
	}
	remembered := unknownAddr(round, 0) // looked up, no pod: remembered

	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "flood-"}}
	if err := e.Client.Create(ctx, ns); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.Client.Delete(context.Background(), ns) })
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "app"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
	}
	if err := e.Client.Create(ctx, pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: remembered, PodIPs: []corev1.PodIP{{IP: remembered}}}
	if err := e.Client.Status().Update(ctx, pod); err != nil {
		t.Fatal(err)
	}
	want := podwatch.RefOf(pod)
	deadline := time.Now().Add(10 * time.Second)
	for {
		ref, err := w.Identify(ctx, remembered)
		if err == nil && ref == want {
			break
		}
		if err != nil || ref != (lease.PodRef{}) || time.Now().After(deadline) {
			t.Fatalf("Identify(%s) = %v, %v; want no pod until the informer knows %v, then it", remembered, ref, err, want)
		}
		time.Sleep(20 * time.Millisecond) // real time: waiting for the informer to see the pod
	}
	if n := lists.n.Load(); n != 20 {
		t.Errorf("pod LISTs = %d, want the 20 of the flood only", n)
	}
}

// BenchmarkUnknownCallers measures, on a real kube-apiserver, what 1 000 acquisitions from
// addresses no pod has cost a fresh Watcher: pod LISTs sent to the API server and callers
// refused as unavailable, from one caller and from 16 at once, with the default bound and
// without it (the cost before it; make bench, docs/operations.md, "Pod identity"). The clock
// is real.
func BenchmarkUnknownCallers(b *testing.B) {
	e := controlPlane(b)
	for _, bc := range []struct {
		name              string
		distinct, workers int
		opt               []podwatch.Option
	}{
		{name: "unbounded/50-addresses", distinct: 50, workers: 1, opt: unbounded()},
		{name: "unbounded/1000-addresses", distinct: 1000, workers: 1, opt: unbounded()},
		{name: "unbounded/1000-addresses-16-callers", distinct: 1000, workers: 16, opt: unbounded()},
		{name: "unbounded/1000-addresses-3-namespaces", distinct: 1000, workers: 1, opt: unbounded(threeNamespaces)},
		{name: "bounded/50-addresses", distinct: 50, workers: 1},
		{name: "bounded/1000-addresses", distinct: 1000, workers: 1},
		{name: "bounded/1000-addresses-16-callers", distinct: 1000, workers: 16},
		{name: "bounded/1000-addresses-3-namespaces", distinct: 1000, workers: 1, opt: []podwatch.Option{threeNamespaces}},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var lists podLists
			cfg := lists.config(e.Config)
			round, refused := 0, 0
			for b.Loop() {
				b.StopTimer()
				w := startWatcher(b, cfg, bc.opt...)
				b.StartTimer()
				got := identifyUnknown(b, w, round, bc.distinct, bc.workers, calls(1000))
				refused += got.Unavailable
				round++
			}
			b.ReportMetric(float64(lists.n.Load())/float64(round), "podLISTs/1000calls")
			b.ReportMetric(float64(refused)/float64(round), "unavailable/1000calls")
		})
	}
}

// BenchmarkUnknownCallerFlood measures a flood: 16 callers from ever new addresses for 3
// seconds, with the default bound and without it: pod LISTs and calls per second (run it
// with -benchtime 1x).
func BenchmarkUnknownCallerFlood(b *testing.B) {
	const length = 3 * time.Second
	e := controlPlane(b)
	for _, bc := range []struct {
		name string
		opt  []podwatch.Option
	}{
		{name: "unbounded", opt: unbounded()},
		{name: "bounded"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var lists podLists
			w := startWatcher(b, lists.config(e.Config), bc.opt...)
			round, total, refused := 0, 0, 0
			for b.Loop() {
				end := time.Now().Add(length)
				got := identifyUnknown(b, w, round, 60000, 16, func(int) bool { return time.Now().Before(end) })
				total += got.None + got.Unavailable
				refused += got.Unavailable
				round++
			}
			secs := float64(round) * length.Seconds()
			b.ReportMetric(float64(lists.n.Load())/secs, "podLISTs/s")
			b.ReportMetric(float64(total)/secs, "calls/s")
			b.ReportMetric(float64(refused)/float64(total), "unavailable/call")
		})
	}
}

var threeNamespaces = podwatch.WithNamespaces("default", "kube-system", "kube-public")

// unbounded returns the options of a Watcher without the bound (the cost before it).
func unbounded(opt ...podwatch.Option) []podwatch.Option {
	return append([]podwatch.Option{podwatch.WithUnknownIPCache(0, 0), podwatch.WithLookupLimit(0, 0)}, opt...)
}
