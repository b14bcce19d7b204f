package podwatch

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	testingclock "k8s.io/utils/clock/testing"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
)

var t0 = time.Date(2026, 5, 1, 12, 0, 0, 0, time.UTC)

func TestUnknownIPs(t *testing.T) {
	type step struct {
		at  time.Duration // after t0
		add string
	}
	cases := map[string]struct {
		ttl   time.Duration
		size  int
		steps []step
		at    time.Duration
		want  map[string]bool // has, at at
		len   int
	}{
		"remembered for ttl": {ttl: 2 * time.Second, size: 10, steps: []step{{0, "a"}},
			at: 1999 * time.Millisecond, want: map[string]bool{"a": true, "b": false}, len: 1},
		"forgotten after ttl": {ttl: 2 * time.Second, size: 10, steps: []step{{0, "a"}},
			at: 2 * time.Second, want: map[string]bool{"a": false}, len: 1},
		"full: the oldest goes": {ttl: time.Minute, size: 2,
			steps: []step{{0, "a"}, {time.Second, "b"}, {2 * time.Second, "c"}},
			at:    3 * time.Second, want: map[string]bool{"a": false, "b": true, "c": true}, len: 2},
		"expired entries go before live ones": {ttl: time.Second, size: 3,
			steps: []step{{0, "a"}, {0, "b"}, {500 * time.Millisecond, "c"}, {1200 * time.Millisecond, "d"}},
			at:    1300 * time.Millisecond, want: map[string]bool{"a": false, "b": false, "c": true, "d": true}, len: 2},
		"remembered again after expiry": {ttl: time.Second, size: 1,
			steps: []step{{0, "a"}, {3 * time.Second, "a"}},
			at:    3500 * time.Millisecond, want: map[string]bool{"a": true}, len: 1},
		"ttl 0 remembers nothing": {ttl: 0, size: 10, steps: []step{{0, "a"}},
			at: 0, want: map[string]bool{"a": false}, len: 0},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			u := newUnknownIPs(tc.ttl, tc.size)
			for _, s := range tc.steps {
				u.add(s.add, t0.Add(s.at))
			}
			got := map[string]bool{}
			for ip := range tc.want {
				got[ip] = u.has(ip, t0.Add(tc.at))
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("has (-want +got):\n%s", diff)
			}
			if n := u.len(); n != tc.len {
				t.Errorf("len = %d, want %d", n, tc.len)
			}
		})
	}
}

// fakeAPI answers lookups from pods (an address missing there has no pod; "fail" is an
// error) and counts them.
type fakeAPI struct {
	pods  map[string]lease.PodRef
	calls atomic.Int64
}

func (f *fakeAPI) lookup(_ context.Context, ip string) (lease.PodRef, error) {
	f.calls.Add(1)
	if ip == "fail" {
		return lease.PodRef{}, lease.Unavailable("identifying the pod of "+ip, errors.New("API server down"))
	}
	return f.pods[ip], nil
}

// results records the results counted.
type results struct {
	mu  sync.Mutex
	got []string
}

func (r *results) count(result string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, result)
}

func TestLookups(t *testing.T) {
	pod := lease.PodRef{Namespace: "ns", Name: "app-0", UID: "uid-1"}
	type call struct {
		after time.Duration // clock step before the call
		ip    string
		want  string // the result counted
	}
	cases := map[string]struct {
		rate  float64
		burst int
		calls []call
		api   int64 // lookups the API server got
	}{
		"no pod is remembered for the ttl": {rate: 10, burst: 20, calls: []call{
			{0, "10.0.0.9", LookupNone},
			{time.Second, "10.0.0.9", LookupCachedNone},
			{999 * time.Millisecond, "10.0.0.9", LookupCachedNone},
			{time.Millisecond, "10.0.0.9", LookupNone},
		}, api: 2},
		"a pod found is asked for again (the informer will know it)": {rate: 10, burst: 20, calls: []call{
			{0, "10.0.0.1", LookupFound},
			{0, "10.0.0.1", LookupFound},
		}, api: 2},
		"an error is not remembered": {rate: 10, burst: 20, calls: []call{
			{0, "fail", LookupError},
			{0, "fail", LookupError},
		}, api: 2},
		"over the burst the caller is refused without a lookup": {rate: 1, burst: 2, calls: []call{
			{0, "10.0.0.7", LookupNone},
			{0, "10.0.0.8", LookupNone},
			{0, "10.0.0.9", LookupLimited},
			{0, "10.0.0.1", LookupLimited},
			{0, "10.0.0.7", LookupCachedNone}, // remembered: no token needed
			{time.Second, "10.0.0.1", LookupFound},
			{0, "10.0.0.9", LookupLimited},
		}, api: 3},
		"rate 0 is no limit": {rate: 0, burst: 0, calls: []call{
			{0, "10.0.0.7", LookupNone},
			{0, "10.0.0.8", LookupNone},
			{0, "10.0.0.9", LookupNone},
		}, api: 3},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			clk := testingclock.NewFakeClock(t0)
			api := &fakeAPI{pods: map[string]lease.PodRef{"10.0.0.1": pod}}
			var counted results
			l := newLookups(clk, newUnknownIPs(2*time.Second, 100), tc.rate, tc.burst, api.lookup, counted.count)
			var want []string
			for _, c := range tc.calls {
				clk.Step(c.after)
				want = append(want, c.want)
				got, err := l.identify(context.Background(), c.ip)
				switch c.want {
				case LookupFound:
					if err != nil || got != pod {
						t.Errorf("identify(%s) = %v, %v; want %v", c.ip, got, err, pod)
					}
				case LookupNone, LookupCachedNone:
					if err != nil || got != (lease.PodRef{}) {
						t.Errorf("identify(%s) = %v, %v; want no pod", c.ip, got, err)
					}
				case LookupLimited:
					if !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, liveness.ErrLookupLimited) {
						t.Errorf("identify(%s) error = %v, want unavailable, limited", c.ip, err)
					}
				case LookupError:
					if !errors.Is(err, lease.ErrUnavailable) {
						t.Errorf("identify(%s) error = %v, want unavailable", c.ip, err)
					}
				}
			}
			if diff := cmp.Diff(want, counted.got); diff != "" {
				t.Errorf("results (-want +got):\n%s", diff)
			}
			if n := api.calls.Load(); n != tc.api {
				t.Errorf("API lookups = %d, want %d", n, tc.api)
			}
		})
	}
}

// TestLookupsShareOneRound: callers from one address while its lookup is in flight wait for
// it instead of starting their own, and a caller that gives up does not end it for the others.
func TestLookupsShareOneRound(t *testing.T) {
	const callers = 10
	var (
		entered atomic.Int64
		calls   atomic.Int64
		release = make(chan struct{})
	)
	lookup := func(ctx context.Context, _ string) (lease.PodRef, error) {
		calls.Add(1)
		select {
		case <-release:
			return lease.PodRef{}, ctx.Err()
		case <-ctx.Done():
			return lease.PodRef{}, ctx.Err()
		}
	}
	var counted results
	l := newLookups(testingclock.NewFakeClock(t0), newUnknownIPs(2*time.Second, 100), 10, 20, lookup, counted.count)

	impatient, cancel := context.WithCancel(context.Background())
	errs := make(chan error, callers)
	for i := range callers {
		go func() {
			ctx := context.Background()
			if i == 0 {
				ctx = impatient
			}
			entered.Add(1)
			_, err := l.identify(ctx, "10.0.0.9")
			errs <- err
		}()
	}
	for entered.Load() < callers {
		time.Sleep(time.Millisecond) // real time: waiting for the goroutines to start
	}
	time.Sleep(50 * time.Millisecond) // real time: let them reach the flight (a late one finds the address remembered)
	cancel()
	if err := <-errs; !errors.Is(err, lease.ErrUnavailable) || !errors.Is(err, context.Canceled) {
		t.Fatalf("the impatient caller got %v, want unavailable, canceled", err)
	}
	close(release)
	for range callers - 1 {
		if err := <-errs; err != nil {
			t.Errorf("a caller got %v, want no pod", err)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Errorf("API lookups = %d, want 1 (one round for all callers)", n)
	}
}

// TestRefusalsAreLoggedOnceAnInterval: a flood of callers over the lookup limit writes one
// log line an interval, each saying how many were refused since the line before.
func TestRefusalsAreLoggedOnceAnInterval(t *testing.T) {
	clk := testingclock.NewFakeClock(t0)
	var lines []map[string]any
	log := funcr.NewJSON(func(obj string) {
		var m map[string]any
		if err := json.Unmarshal([]byte(obj), &m); err != nil {
			t.Errorf("log line %q: %v", obj, err)
		}
		lines = append(lines, m)
	}, funcr.Options{})
	r := &refusalLog{clock: clk, log: log, every: time.Second, perSecond: 10, burst: 20}
	refused := func(n int) {
		for range n {
			r.refused()
		}
	}
	refused(500) // the first refusal is logged at once, the 499 after it within the second are not
	clk.Step(999 * time.Millisecond)
	refused(100)
	clk.Step(time.Millisecond)
	refused(1) // a second after the first line: 599 since it, and this one
	clk.Step(10 * time.Second)
	refused(1)
	var got []float64
	for _, l := range lines {
		got = append(got, l["refused"].(float64))
	}
	if diff := cmp.Diff([]float64{1, 600, 1}, got); diff != "" {
		t.Errorf("refused per log line (-want +got):\n%s", diff)
	}
}
