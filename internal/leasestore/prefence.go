package leasestore

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
)

// The fence beside the mark (docs/waiting.md, "Cost"). A contended release is the mark, the
// fence of the grant it hands over, naming the waiter and moving the entry. The mark and the
// fence write different documents and neither needs the other's answer: the fence only has
// to be taken while the releaser's entries still hold the slots, which they do until the
// move. So when this store granted the lease being released (it knows its resource, levels
// and fence without a read) and one of its levels was lined in the last second, the fence is
// taken beside the mark, and the hand-over that follows uses it: the waiter is answered
// three round trips after the release began instead of four. A fence taken for nothing (the
// mark found the holder gone, or nobody waited after all) is a gap, which fences allow.

// heldHere is what this store knows of the leases it answered HELD, by token, until they are
// released here: a bounded map (maxHeldHere), whose misses only cost the parallel fence.
type heldHere struct {
	mu sync.Mutex
	m  map[string]heldLease
}

type heldLease struct {
	levels []string
	fence  int64
	at     time.Time // this process's clock when it answered the grant
}

const maxHeldHere = 4096

// rememberHeld keeps h if it is a lease this store answers HELD; it returns its arguments.
func (s *Store) rememberHeld(h lease.Holder, err error) (lease.Holder, error) {
	if err != nil || h.State != lease.StateHeld || h.Token == "" {
		return h, err
	}
	k := &s.heldHere
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil || len(k.m) >= maxHeldHere {
		k.m = map[string]heldLease{} // full: it starts over (a miss costs the parallel fence only)
	}
	k.m[h.Token] = heldLease{levels: slices.Clone(h.Levels), fence: h.Fence, at: time.Now()}
	return h, err
}

// forgetHeld returns and forgets what rememberHeld kept of token.
func (s *Store) forgetHeld(token string) (heldLease, bool) {
	k := &s.heldHere
	k.mu.Lock()
	defer k.mu.Unlock()
	l, ok := k.m[token]
	delete(k.m, token)
	return l, ok
}

// preFence is a fence taken beside a release's mark, for the hand-over after it.
type preFence struct {
	resource string
	done     chan struct{}
	fence    int64
	err      error
	mu       sync.Mutex
	used     bool
}

// fenceBeside starts taking a fence of the lease token if this store granted it and one of
// its levels is lined; nil otherwise. The caller waits for it (wait) before it returns.
func (s *Store) fenceBeside(ctx context.Context, token string) *preFence {
	l, ok := s.forgetHeld(token)
	i := slices.IndexFunc(l.levels, s.linedRecently)
	if !ok || i < 0 {
		return nil
	}
	// The resource of the lined level: a lease of several resources has levels of each.
	resource, _, _ := strings.Cut(l.levels[i], "|")
	p := &preFence{resource: resource, done: make(chan struct{})}
	hold := holdSample{ms: max(time.Since(l.at).Milliseconds(), 1), slot: l.fence % holdSlots}
	go func() {
		defer close(p.done)
		p.fence, p.err = s.takeFences(ctx, resource, 1, hold)
	}()
	return p
}

// wait waits until the fence is taken (or failed); nil does nothing.
func (p *preFence) wait() {
	if p != nil {
		<-p.done
	}
}

// take returns the fence for a hand-over of resource, once; false when there is none to use
// (nil, another resource, used, or its write failed: the hand-over takes its own).
func (p *preFence) take(resource string) (int64, bool) {
	if p == nil || p.resource != resource {
		return 0, false
	}
	<-p.done
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.used || p.err != nil {
		return 0, false
	}
	p.used = true
	return p.fence, true
}
