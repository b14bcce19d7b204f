package podwatch

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/liveness"
)

// The bound on what a caller that is no pod costs the API server (docs/operations.md, "Pod
// identity"): Identify asks the API server only about addresses its informer does not know,
// and these lookups go through three gates, in this order:
//
//  1. unknownIPs: an address the API server had no pod for is "no pod" for a short time,
//     without asking again;
//  2. singleflight: concurrent callers from one address share one lookup;
//  3. a token bucket over all addresses: when it is empty the caller is refused as
//     unavailable (fail closed) and the API server is not asked.
//
// The informer is asked before any of them, so a pod it knows is found whatever they say.

// Defaults of the bound (WithUnknownIPCache, WithLookupLimit); the reasons for the numbers are
// in docs/operations.md, "Pod identity".
const (
	// DefaultUnknownIPTTL is how long an address without a pod is answered from memory.
	DefaultUnknownIPTTL = 2 * time.Second
	// DefaultUnknownIPs is how many such addresses are remembered (the oldest go first).
	DefaultUnknownIPs = 10000
	// DefaultLookupRate is the rate of API server lookups, per second and per process.
	DefaultLookupRate = 10
	// DefaultLookupBurst is how many lookups may run at once before the rate applies.
	DefaultLookupBurst = 20
)

// lookupTimeout bounds one shared lookup: it runs on behalf of every caller that joined it,
// so it does not end with the first caller's request.
const lookupTimeout = 10 * time.Second

// Results of a lookup, the values of the result label of vance_lease_pod_identity_lookups_total.
const (
	// LookupFound: the API server knew one running pod with the address.
	LookupFound = "found"
	// LookupNone: the API server knew no running pod with the address (remembered).
	LookupNone = "none"
	// LookupCachedNone: the address was remembered as no pod; the API server was not asked.
	LookupCachedNone = "cached-none"
	// LookupLimited: the rate limit refused the lookup; the API server was not asked.
	LookupLimited = "limited"
	// LookupError: the API server could not be read, or more than one pod has the address.
	LookupError = "error"
)

// unknownIPs remembers, for ttl, the addresses the API server had no pod for: at most size of
// them, the oldest dropped first. Every entry lives ttl, so the oldest is also the first to
// expire: one list in insertion order serves both. Safe for concurrent use.
type unknownIPs struct {
	ttl  time.Duration
	size int

	mu    sync.Mutex
	until map[string]time.Time
	order *list.List // of unknownIP, oldest first
}

type unknownIP struct {
	ip    string
	until time.Time
}

// newUnknownIPs returns the memory of addresses without a pod; ttl or size 0 remembers none.
func newUnknownIPs(ttl time.Duration, size int) *unknownIPs {
	return &unknownIPs{ttl: ttl, size: size, until: map[string]time.Time{}, order: list.New()}
}

// has is true when ip was found without a pod less than ttl before now.
func (u *unknownIPs) has(ip string, now time.Time) bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	until, ok := u.until[ip]
	return ok && now.Before(until)
}

// add remembers that ip had no pod at now. Expired entries go first, then, when the memory
// is full, the oldest.
func (u *unknownIPs) add(ip string, now time.Time) {
	if u.ttl <= 0 || u.size <= 0 {
		return
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	for e := u.order.Front(); e != nil; e = u.order.Front() {
		expired := !now.Before(e.Value.(unknownIP).until)
		if !expired && len(u.until) < u.size {
			break
		}
		u.drop(e)
	}
	until := now.Add(u.ttl)
	u.until[ip] = until
	u.order.PushBack(unknownIP{ip: ip, until: until})
}

// drop removes e, and its address unless the address was remembered again since.
func (u *unknownIPs) drop(e *list.Element) {
	entry := e.Value.(unknownIP)
	u.order.Remove(e)
	if u.until[entry.ip].Equal(entry.until) {
		delete(u.until, entry.ip)
	}
}

// len is the number of addresses remembered (expired ones included until they are dropped).
func (u *unknownIPs) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.until)
}

// lookups runs the API server lookups of Identify through the gates above. lookup is the API
// round itself: the zero PodRef for no pod, an error satisfying lease.ErrUnavailable when it
// cannot decide.
type lookups struct {
	clock   clock.PassiveClock
	unknown *unknownIPs
	limit   *rate.Limiter // nil: unlimited
	flights singleflight.Group
	lookup  func(ctx context.Context, ip string) (lease.PodRef, error)
	// counted is told the result of every call (one of the Lookup constants).
	counted func(result string)
}

// lookupAnswer is what one shared lookup answers every caller that joined it.
type lookupAnswer struct {
	pod    lease.PodRef
	result string
}

// newLookups returns the gates with a limit of perSecond lookups (burst at once); perSecond
// 0 or less is no limit.
func newLookups(clk clock.PassiveClock, unknown *unknownIPs, perSecond float64, burst int,
	lookup func(context.Context, string) (lease.PodRef, error), counted func(string)) *lookups {
	l := &lookups{clock: clk, unknown: unknown, lookup: lookup, counted: counted}
	if perSecond > 0 {
		l.limit = rate.NewLimiter(rate.Limit(perSecond), burst)
	}
	return l
}

// identify answers for ip (normalized) from memory, from a lookup in flight, or from a new
// lookup when the limit allows one.
func (l *lookups) identify(ctx context.Context, ip string) (lease.PodRef, error) {
	if l.unknown.has(ip, l.clock.Now()) {
		l.counted(LookupCachedNone)
		return lease.PodRef{}, nil
	}
	ch := l.flights.DoChan(ip, func() (any, error) {
		return l.round(ctx, ip)
	})
	select {
	case r := <-ch:
		answer, _ := r.Val.(lookupAnswer)
		l.counted(answer.result)
		return answer.pod, r.Err
	case <-ctx.Done():
		return lease.PodRef{}, lease.Unavailable("identifying the pod of "+ip, ctx.Err())
	}
}

// round is one shared lookup. It outlives the request that started it (others may have
// joined), within lookupTimeout.
func (l *lookups) round(ctx context.Context, ip string) (lookupAnswer, error) {
	now := l.clock.Now()
	if l.unknown.has(ip, now) { // a lookup that ended since this caller looked
		return lookupAnswer{result: LookupCachedNone}, nil
	}
	if l.limit != nil && !l.limit.AllowN(now, 1) {
		return lookupAnswer{result: LookupLimited}, lease.Unavailable("identifying the pod of "+ip,
			fmt.Errorf("%w (at most %g lookups a second, %d at once)", liveness.ErrLookupLimited, float64(l.limit.Limit()), l.limit.Burst()))
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lookupTimeout)
	defer cancel()
	pod, err := l.lookup(ctx, ip)
	switch {
	case err != nil:
		return lookupAnswer{result: LookupError}, err
	case pod.Name == "":
		l.unknown.add(ip, l.clock.Now())
		return lookupAnswer{result: LookupNone}, nil
	default:
		return lookupAnswer{pod: pod, result: LookupFound}, nil
	}
}

// refusalLog writes at most one log line every interval for the callers refused over the
// lookup limit, with how many were refused since the line before: a flood of callers that
// are no pod must not become a flood of log lines. Each refusal is counted all the same, in
// vance_lease_pod_identity_lookups_total{result="limited"}.
type refusalLog struct {
	clock     clock.PassiveClock
	log       logr.Logger
	every     time.Duration
	perSecond float64
	burst     int

	mu   sync.Mutex
	last time.Time // of the last line; zero before the first
	n    int       // refused since the last line
}

// refused notes one refusal, and writes the line if the last one is an interval old.
func (r *refusalLog) refused() {
	r.mu.Lock()
	r.n++
	now := r.clock.Now()
	if !r.last.IsZero() && now.Sub(r.last) < r.every {
		r.mu.Unlock()
		return
	}
	n := r.n
	r.n, r.last = 0, now
	r.mu.Unlock()
	r.log.Info("Refused callers whose address the pod cache does not know: over the lookup limit",
		"refused", n, "lookupsPerSecond", r.perSecond, "burst", r.burst)
}
