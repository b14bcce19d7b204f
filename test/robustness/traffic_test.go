//go:build robustness

package robustness

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

// recorder collects a run's history; times are monotonic, since origin.
type recorder struct {
	origin time.Time
	mu     sync.Mutex
	calls  []Entry
	faults []Fault
	// shortUntil is the end (ns since origin) of a window of cut deadlines, 0 when none.
	shortUntil atomic.Int64
}

func (r *recorder) now() int64 { return int64(time.Since(r.origin)) }

func (r *recorder) add(e Entry) {
	r.mu.Lock()
	r.calls = append(r.calls, e)
	r.mu.Unlock()
}

// lastLife is the latest answer 200 (its end, ns since origin) that a holder of resource got
// from a call of the churn (a grant or a check), among the holders their callers never
// released; 0 when there is none. Such a holder is its caller's: a check answered after a
// fault renews it, and its TTL runs from there, not from the fault.
func (r *recorder) lastLife(resource string) int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	last := map[string]int64{}
	released := map[string]bool{}
	for _, e := range r.calls {
		if e.Resource != resource || e.Probe || e.Answer.Status != http.StatusOK {
			continue
		}
		switch e.Op {
		case OpAcquire:
			last[e.Answer.Token] = max(last[e.Answer.Token], e.End)
		case OpCheck:
			last[e.Token] = max(last[e.Token], e.End)
		case OpRelease:
			released[e.Token] = true
		}
	}
	var at int64
	for tok, end := range last {
		if !released[tok] {
			at = max(at, end)
		}
	}
	return at
}

func (r *recorder) fault(f Fault) {
	r.mu.Lock()
	r.faults = append(r.faults, f)
	r.mu.Unlock()
}

// handedOut is every token a caller of the run was handed. When the cluster stops, no
// process's log may carry any of them (docs/security.md, "Tokens").
var handedOut tokenscan.Tokens

// caller is one application calling one process's admission API over a connection pool of
// its own.
type caller struct {
	id      int
	process int
	base    string
	http    *http.Client
	rec     *recorder
}

// newCaller returns a caller of the API at addr, connecting from source (the manager knows
// its callers by their source IP).
func newCaller(id, process int, addr, source string, rec *recorder) *caller {
	dialer := &net.Dialer{Timeout: 2 * time.Second, LocalAddr: &net.TCPAddr{IP: net.ParseIP(source)}}
	transport := &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 2, IdleConnTimeout: 30 * time.Second}
	return &caller{id: id, process: process, base: "http://" + addr, http: &http.Client{Transport: transport}, rec: rec}
}

// requestTimeout is a caller's deadline outside a window of cut deadlines.
const requestTimeout = 5 * time.Second

// wireAnswer is every answer body of the admission API that the suite reads.
type wireAnswer struct {
	Token   string `json:"token"`
	Outcome string `json:"outcome"`
	Error   string `json:"error"`
	Message string `json:"message"`
}

// do sends one call and records it.
func (c *caller) do(ctx context.Context, call Call, deadline time.Duration) Answer {
	call.Client, call.Process, call.DeadlineMs = c.id, c.process, deadline.Milliseconds()
	var method, path string
	var body []byte
	switch call.Op {
	case OpAcquire:
		method, path = http.MethodPost, "/v1/leases"
		body, _ = json.Marshal(map[string]any{
			"type": "tex", "lease": call.Resource, "project": "p" + string(rune('0'+c.process)),
			"holderRef": "robustness", "waitMs": call.WaitMs,
		})
	case OpCheck:
		method, path = http.MethodPost, "/v1/leases/"+call.Token+"/check"
	case OpRelease:
		method, path = http.MethodDelete, "/v1/leases/"+call.Token
	}
	ctx, cancel := context.WithTimeout(ctx, deadline)
	defer cancel()
	start := c.rec.now()
	a := c.send(ctx, method, path, body)
	c.rec.add(Entry{Call: call, Answer: a, Start: start, End: c.rec.now()})
	return a
}

func (c *caller) send(ctx context.Context, method, path string, body []byte) Answer {
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return Answer{NotSent: true, Err: err.Error()}
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return Answer{NotSent: errors.Is(err, syscall.ECONNREFUSED), Err: err.Error()}
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		// The status came, the body did not: the outcome is what the status says.
		return Answer{Status: resp.StatusCode, Err: err.Error()}
	}
	var w wireAnswer
	_ = json.Unmarshal(data, &w)
	if resp.StatusCode == http.StatusOK {
		handedOut.Add(w.Token)
	}
	return Answer{Status: resp.StatusCode, Code: w.Error, Message: w.Message, Token: w.Token, Outcome: w.Outcome}
}

// deadline is the caller's deadline for its next call: short (5–60 ms, below the store's
// latency under load) inside a window of cut deadlines.
func (c *caller) deadline(rng *rand.Rand) time.Duration {
	if c.rec.now() < c.rec.shortUntil.Load() {
		return time.Duration(5+rng.IntN(56)) * time.Millisecond
	}
	return requestTimeout
}

// churn loops acquire (waitMs 300) → hold 0–20 ms (a check during half of the holds) →
// release until ctx ends. Now and then it checks a lease it released or abandoned, which
// must answer 410 once gone.
func (c *caller) churn(ctx context.Context, resource string, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, uint64(c.id)))
	var old []string // released or abandoned tokens
	for ctx.Err() == nil {
		if len(old) > 0 && rng.IntN(20) == 0 {
			c.do(context.WithoutCancel(ctx), Call{Op: OpCheck, Resource: resource, Token: old[rng.IntN(len(old))]}, c.deadline(rng))
		}
		a := c.do(context.WithoutCancel(ctx), Call{Op: OpAcquire, Resource: resource, WaitMs: 300}, c.deadline(rng))
		switch {
		case a.Status == http.StatusOK && a.Token != "":
		case a.Status == http.StatusConflict:
			continue
		default:
			// Unavailable, or the process is down: do not spin.
			pause(ctx, time.Duration(20+rng.IntN(30))*time.Millisecond)
			continue
		}
		token := a.Token
		if rng.IntN(2) == 0 {
			c.do(context.WithoutCancel(ctx), Call{Op: OpCheck, Resource: resource, Token: token}, c.deadline(rng))
		}
		pause(context.WithoutCancel(ctx), time.Duration(rng.IntN(21))*time.Millisecond)
		c.do(context.WithoutCancel(ctx), Call{Op: OpRelease, Resource: resource, Token: token}, c.deadline(rng))
		old = append(old, token)
		if len(old) > 32 {
			old = old[len(old)-32:]
		}
		if rng.IntN(10) == 0 {
			c.do(context.WithoutCancel(ctx), Call{Op: OpCheck, Resource: resource, Token: token}, c.deadline(rng))
		}
	}
}

// pause waits d or until ctx ends.
func pause(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C: // real time: a hold, or a caller's back-off
	}
}
