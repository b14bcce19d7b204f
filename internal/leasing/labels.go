package leasing

import (
	"container/list"
	"strings"
	"sync"

	"github.com/vancetope/lease-operator/internal/definition"
)

// tokenLabels is a bounded, least-recently-used map from token to the resource label of a
// lease this process handed out, so that check and release, which only carry the token, are
// labelled without a store round trip. A miss is labelled LabelUnknown.
type tokenLabels struct {
	mu    sync.Mutex
	max   int
	order *list.List // front: most recently used; values are tokens
	items map[string]*list.Element
	label map[string]string
}

func newTokenLabels(maxEntries int) *tokenLabels {
	return &tokenLabels{max: maxEntries, order: list.New(), items: map[string]*list.Element{}, label: map[string]string{}}
}

func (t *tokenLabels) put(token, label string) {
	if t.max <= 0 {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.items[token]; ok {
		t.order.MoveToFront(e)
		t.label[token] = label
		return
	}
	t.items[token] = t.order.PushFront(token)
	t.label[token] = label
	for t.order.Len() > t.max {
		oldest := t.order.Back()
		tok := oldest.Value.(string)
		t.order.Remove(oldest)
		delete(t.items, tok)
		delete(t.label, tok)
	}
}

func (t *tokenLabels) get(token string) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	e, ok := t.items[token]
	if !ok {
		return LabelUnknown
	}
	t.order.MoveToFront(e)
	return t.label[token]
}

func (t *tokenLabels) forget(token string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if e, ok := t.items[token]; ok {
		t.order.Remove(e)
		delete(t.items, token)
		delete(t.label, token)
	}
}

// labelSet bounds the distinct resource label values: a client can name arbitrary leases,
// and each label value is a time series. Only a resource that this process booked a holder
// on gets a value of its own (book); before that, and beyond the bound, it is LabelOther.
type labelSet struct {
	mu   sync.Mutex
	max  int
	seen map[string]struct{}
}

func newLabelSet(maxLabels int) *labelSet {
	return &labelSet{max: maxLabels, seen: map[string]struct{}{}}
}

// of returns the label value for a resource, without giving it a slot.
func (l *labelSet) of(resource string) string {
	if v, fixed := fixedLabel(resource); fixed {
		return v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[resource]; ok {
		return resource
	}
	return LabelOther
}

// book returns the label value for a resource a holder was just booked on, giving it a slot
// while there are any left.
func (l *labelSet) book(resource string) string {
	if v, fixed := fixedLabel(resource); fixed {
		return v
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.seen[resource]; ok {
		return resource
	}
	if len(l.seen) >= l.max {
		return LabelOther
	}
	l.seen[resource] = struct{}{}
	return resource
}

// fixedLabel is the label of resources that never take a slot.
func fixedLabel(resource string) (string, bool) {
	switch {
	case resource == "":
		return LabelNone, true
	case strings.HasPrefix(resource, definition.InlineResourcePrefix):
		// mcp-inline:<tenant>/<project>/<name>: tenant IDs are never label values.
		return LabelInline, true
	}
	return "", false
}
