package sweeper

import (
	"sync"
	"time"

	"k8s.io/utils/lru"
)

// gateSize is how many keys a relay's gate remembers: more resources (or pods and waiters)
// than are asked about in one interval on any cluster the operator is made for.
const gateSize = 10000

// gate passes one ask per key per interval. It remembers at most size keys, the least
// recently asked dropped first, with O(1) work per ask whatever it holds: the relays answer
// every agent, and a flood of ever new keys must cost a fixed amount of memory and time (the
// map it replaces scanned itself under its lock on every ask past 10 000 keys and grew on).
// A key dropped early is only passed again sooner: one more sweep, or one more reclaim check,
// which the store's answers make harmless.
type gate struct {
	every time.Duration

	mu   sync.Mutex // makes a look-up and its update one step
	last *lru.Cache // key → time.Time of the last ask passed
}

func newGate(size int, every time.Duration) *gate {
	return &gate{every: every, last: lru.New(size)}
}

// allow reports whether an ask for key at now passes, and if so remembers it.
func (g *gate) allow(key string, now time.Time) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	if v, ok := g.last.Get(key); ok && now.Sub(v.(time.Time)) < g.every {
		return false
	}
	g.last.Add(key, now)
	return true
}

// len is how many keys the gate remembers.
func (g *gate) len() int { return g.last.Len() }
