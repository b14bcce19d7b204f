package definition

import "container/list"

// DefaultCacheSize bounds the resolver's cache. Callers name leases freely (a NOOP for an
// unknown name is cached too, so that it costs no store read), so without a bound anybody who
// can reach the admission API could grow the process's memory at will.
const DefaultCacheSize = 10000

// defCache is the resolver's bounded, least-recently-used cache of merged definitions, indexed
// by name so that an invalidation finds a name's scopes without a scan. Not safe for
// concurrent use: the Resolver's lock guards it.
type defCache struct {
	max    int
	order  *list.List // front: most recently used; values are *cacheEntry
	byName map[string]map[scopeKey]*list.Element
}

type cacheEntry struct {
	name  string
	scope scopeKey
	def   Definition
}

func newDefCache(maxEntries int) *defCache {
	return &defCache{max: max(maxEntries, 1), order: list.New(), byName: map[string]map[scopeKey]*list.Element{}}
}

func (c *defCache) get(name string, sk scopeKey) (Definition, bool) {
	e, ok := c.byName[name][sk]
	if !ok {
		return Definition{}, false
	}
	c.order.MoveToFront(e)
	return e.Value.(*cacheEntry).def, true
}

func (c *defCache) put(name string, sk scopeKey, d Definition) {
	if e, ok := c.byName[name][sk]; ok {
		e.Value.(*cacheEntry).def = d
		c.order.MoveToFront(e)
		return
	}
	if c.byName[name] == nil {
		c.byName[name] = map[scopeKey]*list.Element{}
	}
	c.byName[name][sk] = c.order.PushFront(&cacheEntry{name: name, scope: sk, def: d})
	for c.order.Len() > c.max {
		oldest := c.order.Back().Value.(*cacheEntry)
		c.remove(oldest.name, oldest.scope)
	}
}

func (c *defCache) remove(name string, sk scopeKey) {
	scopes := c.byName[name]
	if e, ok := scopes[sk]; ok {
		c.order.Remove(e)
		delete(scopes, sk)
	}
	if len(scopes) == 0 {
		delete(c.byName, name)
	}
}

// scopes returns the cached scopes of name (the map is the cache's own: do not modify).
func (c *defCache) scopes(name string) map[scopeKey]*list.Element { return c.byName[name] }

func (c *defCache) len() int { return c.order.Len() }

func (c *defCache) clear() {
	c.order.Init()
	clear(c.byName)
}
