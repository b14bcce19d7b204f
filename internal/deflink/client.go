package deflink

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/utils/clock"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/httpjson"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/tenancy"
)

// Defaults of a Client.
const (
	// DefaultTimeout bounds one resolution asked of the manager (the caller's deadline, when
	// earlier, bounds it too).
	DefaultTimeout = 5 * time.Second
	// DefaultRetry is the pause after a failed watch before the next.
	DefaultRetry = time.Second
	// DefaultCacheSize bounds the cached definitions; a full cache is emptied.
	DefaultCacheSize = 4096
)

// Client is the agent's view of the manager's definitions: a leasing.Resolver with a cache
// that holds only while the watch is connected, a tenancy.Map of the pod's own namespace
// (Tenancy), and OnChange hooks run whenever the manager's version changes. Start runs the
// watch; Ready reports whether the manager was ever reached.
type Client struct {
	url       string
	key       string
	namespace string
	http      *http.Client
	clock     clock.WithTicker
	timeout   time.Duration
	retry     time.Duration
	hold      time.Duration
	cacheSize int
	log       logr.Logger

	mu       sync.Mutex
	cache    map[ResolveRequest]definition.Definition
	epoch    uint64 // bumped whenever the cache is emptied
	live     bool   // the last watch was answered: the cache may be used
	lostAt   time.Time
	stale    time.Duration // how long the cache serves after the watch went down
	reached  bool          // some watch was answered: Tenancy knows the tenant
	version  string
	watch    WatchAnswer
	onChange []func()
}

// ClientOption configures a Client.
type ClientOption func(*Client)

// WithHTTPClient sets the HTTP client (default: a plain one; the agent passes
// agentauth.HTTPClient, whose connections leave from its pod's address where that matters).
func WithHTTPClient(c *http.Client) ClientOption { return func(cl *Client) { cl.http = c } }

// WithClock sets the clock of the retry pause (default the real clock).
func WithClock(c clock.WithTicker) ClientOption { return func(cl *Client) { cl.clock = c } }

// WithTimeout bounds one resolution (default DefaultTimeout).
func WithTimeout(d time.Duration) ClientOption { return func(cl *Client) { cl.timeout = d } }

// WithRetry sets the pause after a failed watch (default DefaultRetry).
func WithRetry(d time.Duration) ClientOption { return func(cl *Client) { cl.retry = d } }

// WithWatchHold is how long the manager may hold a watch (default DefaultHold); the client
// gives up on a watch 10 s after it.
func WithWatchHold(d time.Duration) ClientOption { return func(cl *Client) { cl.hold = d } }

// DefaultStale is how long an agent keeps resolving from its cache once it lost the manager's
// watch: long enough for a manager to restart, so that its restart costs the agents'
// callers nothing (issue 24); a definition changed meanwhile takes effect when the watch is
// answered again.
const DefaultStale = time.Minute

// WithStale sets how long the cache serves once the watch is down (0: not at all).
func WithStale(d time.Duration) ClientOption { return func(cl *Client) { cl.stale = d } }

// WithCacheSize bounds the cache (default DefaultCacheSize).
func WithCacheSize(n int) ClientOption { return func(cl *Client) { cl.cacheSize = n } }

// WithClientLogger sets the logger of the watch.
func WithClientLogger(l logr.Logger) ClientOption { return func(cl *Client) { cl.log = l } }

// NewClient asks the manager at managerURL (its admission Service) for the definitions of
// the agent of a pod in namespace, signing with key (the namespace's agent key).
func NewClient(managerURL, namespace, key string, opts ...ClientOption) *Client {
	c := &Client{
		url: strings.TrimRight(managerURL, "/"), key: key, namespace: namespace,
		http: &http.Client{}, clock: clock.RealClock{}, timeout: DefaultTimeout, retry: DefaultRetry,
		hold: DefaultHold, cacheSize: DefaultCacheSize, log: logr.Discard(), stale: DefaultStale,
		cache: map[ResolveRequest]definition.Definition{},
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// Resolve returns the merged definition of name in (tenant, project) as the manager
// resolves it: from the cache while the watch is connected, else from the manager. An
// unreachable manager is a *definition.UnavailableError (LEASE_UNAVAILABLE), never a wait
// past ctx's deadline.
func (c *Client) Resolve(ctx context.Context, tenant, project, name string) (definition.Definition, error) {
	if name == "" || name == definition.NoneReference {
		return definition.Definition{}, nil
	}
	req := ResolveRequest{Tenant: tenant, Project: project, Name: name}
	c.mu.Lock()
	d, hit := c.cache[req]
	// While the watch is down (a manager restart), what is cached stays good for a while:
	// a change made meanwhile is seen when the watch is answered again (a new version
	// empties the cache), and a manager that stays away longer fails closed.
	hit = hit && (c.live || c.stale > 0 && c.clock.Since(c.lostAt) < c.stale)
	epoch := c.epoch
	c.mu.Unlock()
	if hit {
		return d, nil
	}
	unavailable := func(source string, err error) error {
		return &definition.UnavailableError{Name: name, Tenant: tenant, Project: project, Source: source, Err: err}
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var ans ResolveAnswer
	if err := c.call(ctx, ResolvePath, req, &ans); err != nil {
		return definition.Definition{}, unavailable("the manager at "+c.url, err)
	}
	switch {
	case ans.Invalid != nil:
		return definition.Definition{}, &lease.InvalidError{Field: ans.Invalid.Field, Detail: ans.Invalid.Detail}
	case ans.Unavailable != nil:
		return definition.Definition{}, unavailable(ans.Unavailable.Source, ans.Unavailable.cause())
	case ans.Definition == nil:
		return definition.Definition{}, unavailable("the manager at "+c.url, errors.New("an answer without a definition"))
	}
	d = ans.Definition.Definition()
	c.mu.Lock()
	defer c.mu.Unlock()
	// A change since the question may be one this answer was built without: use it, but do
	// not keep it. Nor while the watch is down: nothing would drop it.
	if c.epoch == epoch && c.live {
		if len(c.cache) >= c.cacheSize {
			clear(c.cache)
		}
		c.cache[req] = d
	}
	return d, nil
}

// ResolveInline checks an inline definition, as the manager would: it depends on no stored
// layer (definition.Inline).
func (c *Client) ResolveInline(tenant, project string, spec definition.InlineSpec) (definition.Definition, error) {
	return definition.Inline(tenant, project, spec)
}

// OnChange registers fn to run whenever the manager's version changes, after the cache was
// emptied: waiting acquisitions re-resolve (docs/waiting.md, "Definition changes"). fn runs
// on the watch's goroutine and must not block.
func (c *Client) OnChange(fn func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.onChange = append(c.onChange, fn)
}

// Ready reports whether the manager answered a watch at least once.
func (c *Client) Ready() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reached
}

// Start follows the manager's version until ctx ends: a long-poll that answers at once
// when the version differs from the one known, and within the hold otherwise. It is a
// controller-runtime Runnable.
func (c *Client) Start(ctx context.Context) error {
	failing := false
	for ctx.Err() == nil {
		c.mu.Lock()
		known := c.version
		c.mu.Unlock()
		var ans WatchAnswer
		wctx, cancel := context.WithTimeout(ctx, c.hold+10*time.Second)
		err := c.call(wctx, WatchPath, WatchRequest{Version: known}, &ans)
		cancel()
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			c.lost()
			if !failing {
				c.log.Error(err, "Watching the manager's definitions failed; definitions are asked of the manager per acquisition until it answers again", "manager", c.url)
			}
			failing = true
			select {
			case <-ctx.Done():
			case <-c.clock.After(c.retry):
			}
			continue
		}
		if failing {
			c.log.Info("Watching the manager's definitions again", "manager", c.url)
		}
		failing = false
		c.apply(ans)
	}
	return nil
}

// lost marks the watch down: nothing would tell the cache of a change now. The cache is kept
// for DefaultStale (Resolve), no answer got meanwhile is added to it.
func (c *Client) lost() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.live {
		c.lostAt = c.clock.Now()
	}
	c.live = false
	c.epoch++
}

// apply takes a watch answer: a new version empties the cache and runs the hooks.
func (c *Client) apply(ans WatchAnswer) {
	c.mu.Lock()
	c.live, c.reached = true, true
	c.watch = ans
	changed := ans.Version != c.version
	c.version = ans.Version
	var hooks []func()
	if changed {
		c.epoch++
		clear(c.cache)
		hooks = c.onChange
	}
	c.mu.Unlock()
	for _, fn := range hooks {
		fn()
	}
}

// call posts req to path, signed, and decodes a 200 answer into out.
func (c *Client) call(ctx context.Context, path string, req, out any) error {
	body, err := json.Marshal(req)
	if err != nil {
		return fmt.Errorf("encoding the request: %w", err)
	}
	hr, err := agentauth.NewRequest(ctx, c.key, c.url, path, body)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(hr)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxAnswerBytes))
	if err != nil {
		return fmt.Errorf("reading the manager's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		var eb httpjson.ErrorBody
		if json.Unmarshal(data, &eb) == nil && eb.Error != "" {
			return fmt.Errorf("the manager refused (%s): %s: %s", resp.Status, eb.Error, eb.Message)
		}
		return fmt.Errorf("the manager answered %s", resp.Status)
	}
	if err := json.Unmarshal(data, out); err != nil {
		return fmt.Errorf("decoding the manager's answer: %w", err)
	}
	return nil
}

// Tenancy is the tenancy.Map of the agent: the tenant of its own namespace as the manager
// last answered it. It knows no other namespace. Until the manager was reached it has not
// synced, so that the tenant binding answers LEASE_UNAVAILABLE rather than refuse
// (tenancy.Binder).
func (c *Client) Tenancy() tenancy.Map { return selfTenancy{c} }

type selfTenancy struct{ c *Client }

var _ tenancy.Map = selfTenancy{}

func (s selfTenancy) answer() (WatchAnswer, bool) {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	return s.c.watch, s.c.reached
}

// HasSynced reports whether the manager was reached once.
func (s selfTenancy) HasSynced() bool { return s.c.Ready() }

// SystemNamespace implements tenancy.Map.
func (s selfTenancy) SystemNamespace() string {
	a, _ := s.answer()
	return a.SystemNamespace
}

// TenantOf implements tenancy.Map: known only for the agent's own namespace.
func (s selfTenancy) TenantOf(namespace string) (string, bool) {
	a, ok := s.answer()
	if !ok || namespace != s.c.namespace || !a.Labelled || a.Tenant == "" {
		return "", false
	}
	return a.Tenant, true
}

// NamespacesOf implements tenancy.Map: the agent's own namespace, if it is tenant's.
func (s selfTenancy) NamespacesOf(tenant string) []string {
	if t, ok := s.TenantOf(s.c.namespace); ok && t == tenant {
		return []string{s.c.namespace}
	}
	return nil
}

// NamespacedTenants implements tenancy.Map: the agent's own tenant, if any.
func (s selfTenancy) NamespacedTenants() []string {
	if t, ok := s.TenantOf(s.c.namespace); ok {
		return []string{t}
	}
	return nil
}
