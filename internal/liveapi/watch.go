package liveapi

import (
	"context"
	"errors"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metainternalversion "k8s.io/apimachinery/pkg/apis/meta/internalversion"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/livefeed"
)

// Feed is this replica's change feed of the store (*livefeed.Feed): every watch of the live
// API reads from it, none reads the store (docs/live-api.md, "Watch").
type Feed interface {
	// RV is the latest resource version ("" before the feed's first read).
	RV() string
	Watch(ctx context.Context, from string) (*livefeed.Subscription, error)
	// Seen tells the feed what a list or get read, so that it reports what becomes of an
	// object it never read itself.
	Seen(livefeed.State)
}

var _ Feed = (*livefeed.Feed)(nil)

// DefaultBookmarkInterval is how often a watch that allows bookmarks gets one, as the
// Kubernetes API server's watch cache sends them.
const DefaultBookmarkInterval = time.Minute

// listVersion is the resource version a list or a get read from the store now carries: the
// feed's latest, taken before the read, so that a watch from it misses nothing after.
func listVersion(d Deps) string {
	if d.Feed == nil {
		return ""
	}
	return d.Feed.RV()
}

// seen tells the feed, if there is one, what a list or get read from the store.
func seen(d Deps, holders []lease.Holder, waiters []lease.Waiter, counters []lease.Counter) {
	if d.Feed != nil {
		d.Feed.Seen(livefeed.NewState(holders, waiters, counters))
	}
}

// setVersion sets the resource version of the objects of a list.
func setVersion[T any, PT interface {
	*T
	SetResourceVersion(string)
}](items []T, rv string) {
	for i := range items {
		PT(&items[i]).SetResourceVersion(rv)
	}
}

// shown renders one store object as what one watch shows of it: the object in each
// namespace of the watch's scope where it appears and that passes its selectors, by
// namespace; nil or empty when it shows nowhere.
type shown func(ctx context.Context, obj any) map[string]runtime.Object

// serveWatch answers a watch of one resource from the feed: the events of kind, each turned
// by show into the namespaced objects the request sees. newObj makes the empty object of a
// bookmark.
func serveWatch(ctx context.Context, d Deps, resource string, o *metainternalversion.ListOptions,
	kind livefeed.Kind, show shown, newObj func() runtime.Object) (watch.Interface, error) {
	if d.Feed == nil {
		return nil, errNoWatch(resource)
	}
	from, initialEnd, bookmarks := "", false, false
	if o != nil {
		from, bookmarks = o.ResourceVersion, o.AllowWatchBookmarks
		if o.SendInitialEvents != nil {
			if *o.SendInitialEvents {
				// A streamed list: the current state (at least as new as any version asked
				// for), then, when bookmarks are allowed, one that says it is complete. (The
				// API server sets sendInitialEvents on a watch without a version itself.)
				from, initialEnd = "", o.AllowWatchBookmarks
			} else if from == "" || from == "0" {
				from = d.Feed.RV() // only what follows now
			}
		}
	}
	sub, err := d.Feed.Watch(ctx, from)
	var expired *livefeed.ExpiredError
	var invalid *livefeed.InvalidVersionError
	switch {
	case errors.As(err, &expired):
		return nil, apierrors.NewResourceExpired(expired.Error())
	case errors.As(err, &invalid):
		return nil, apierrors.NewBadRequest(invalid.Error())
	case err != nil:
		return nil, storeError(d.Log, "watching "+resource, err)
	}
	w := &liveWatch{out: make(chan watch.Event), done: make(chan struct{})}
	every := d.BookmarkInterval
	if every <= 0 {
		every = DefaultBookmarkInterval
	}
	// Bookmarks pace a connection; they decide nothing, so the real clock ticks them.
	go w.run(ctx, sub, kind, show, newObj, initialEnd, bookmarks, time.NewTicker(every))
	return w, nil
}

// errNoWatch answers a watch on a replica without a feed.
func errNoWatch(resource string) error {
	return &apierrors.StatusError{ErrStatus: metav1.Status{
		Status: metav1.StatusFailure,
		Code:   http.StatusMethodNotAllowed,
		Reason: metav1.StatusReasonMethodNotAllowed,
		Message: "watch is not supported on " + resource + ": this manager runs without the live API's change feed " +
			"(--live-watch-interval=0); poll instead (for example `watch kubectl get " + resource + "`)",
	}}
}

// liveWatch is one watch's result channel.
type liveWatch struct {
	out  chan watch.Event
	done chan struct{}
	once sync.Once
}

func (w *liveWatch) ResultChan() <-chan watch.Event { return w.out }
func (w *liveWatch) Stop()                          { w.once.Do(func() { close(w.done) }) }

func (w *liveWatch) run(ctx context.Context, sub *livefeed.Subscription, kind livefeed.Kind, show shown,
	newObj func() runtime.Object, initialEnd, bookmarks bool, ticker *time.Ticker) {
	defer close(w.out)
	defer sub.Stop()
	defer ticker.Stop()
	last := sub.From
	send := func(evs ...watch.Event) bool {
		for _, ev := range evs {
			select {
			case w.out <- ev:
			case <-w.done:
				return false
			case <-ctx.Done():
				return false
			}
		}
		return true
	}
	for _, e := range sub.Initial {
		if !send(events(ctx, e, kind, show)...) {
			return
		}
		last = max(last, e.RV)
	}
	if initialEnd {
		if !send(bookmark(newObj, last, true)) {
			return
		}
	}
	for {
		select {
		case e, ok := <-sub.C:
			if !ok {
				if err := sub.Err(); err != nil {
					// Too slow: the usual "too old" error, after which a client lists again.
					send(watch.Event{Type: watch.Error, Object: &apierrors.NewResourceExpired(err.Error()).ErrStatus})
				}
				return
			}
			if !send(events(ctx, e, kind, show)...) {
				return
			}
			last = e.RV
		case <-ticker.C:
			if bookmarks && !send(bookmark(newObj, last, false)) {
				return
			}
		case <-w.done:
			return
		case <-ctx.Done():
			return
		}
	}
}

// bookmark is a BOOKMARK event at rv: the watch has seen every change up to it.
func bookmark(newObj func() runtime.Object, rv int64, initialEnd bool) watch.Event {
	obj := newObj()
	m, _ := meta.Accessor(obj)
	m.SetResourceVersion(strconv.FormatInt(rv, 10))
	if initialEnd {
		m.SetAnnotations(map[string]string{metav1.InitialEventsAnnotationKey: "true"})
	}
	return watch.Event{Type: watch.Bookmark, Object: obj}
}

// events turns one change of the feed into the watch events one watch sees: in each
// namespace where the object shows, ADDED, MODIFIED or DELETED; a change that makes an object
// start or stop passing the watch's selectors shows as ADDED or DELETED, as a Kubernetes watch
// does.
func events(ctx context.Context, e *livefeed.Event, kind livefeed.Kind, show shown) []watch.Event {
	if e.Kind != kind {
		return nil
	}
	cur := show(ctx, e.Object)
	var prev map[string]runtime.Object
	switch e.Type {
	case livefeed.Deleted:
		prev, cur = cur, nil
	case livefeed.Modified:
		prev = show(ctx, e.Old)
	}
	rv := strconv.FormatInt(e.RV, 10)
	nss := slices.Sorted(maps.Keys(cur))
	for ns := range prev {
		if _, ok := cur[ns]; !ok {
			nss = append(nss, ns)
		}
	}
	var out []watch.Event
	for _, ns := range nss {
		n, p := cur[ns], prev[ns]
		ev := watch.Event{Type: watch.Modified, Object: n}
		switch {
		case p == nil:
			ev.Type = watch.Added
		case n == nil:
			ev = watch.Event{Type: watch.Deleted, Object: p}
		}
		m, _ := meta.Accessor(ev.Object)
		m.SetResourceVersion(rv)
		out = append(out, ev)
	}
	return out
}

// showByTenant is what one watch shows of an object that appears where its tenant's holders
// do: rendered in each namespace of the scope, when it passes the selectors (render's bool).
func showByTenant[T any](v *views, sc scope, tenant func(T) string, render func(T, string) (runtime.Object, bool)) shown {
	return func(_ context.Context, x any) map[string]runtime.Object {
		obj := x.(T)
		out := map[string]runtime.Object{}
		for _, ns := range sc.in(v.namespacesOfTenant(tenant(obj))) {
			if o, ok := render(obj, ns); ok {
				out[ns] = o
			}
		}
		return out
	}
}

// showHolder is what one watch of leaseholders shows of a holder.
func (s *holderStorage) showHolder(sc scope, sel listSelection) shown {
	return showByTenant(s.views, sc, func(h lease.Holder) string { return h.Tenant },
		func(h lease.Holder, ns string) (runtime.Object, bool) {
			obj := holderObject(h, ns, s.deps.Pods)
			return &obj, sel.matches(&obj)
		})
}

// showWaiter is what one watch of leasewaiters shows of a waiter.
func (s *waiterStorage) showWaiter(sc scope, sel listSelection) shown {
	return showByTenant(s.views, sc, func(w lease.Waiter) string { return w.Holder.Tenant },
		func(w lease.Waiter, ns string) (runtime.Object, bool) {
			obj := waiterObject(w, ns)
			return &obj, sel.matchesWaiter(&obj)
		})
}

// showCounter is what one watch of leasecounters shows of a counter.
func (s *counterStorage) showCounter(sc scope, sel counterSel) shown {
	return func(ctx context.Context, x any) map[string]runtime.Object {
		c := x.(lease.Counter)
		out := map[string]runtime.Object{}
		for _, obj := range s.render(ctx, sc, []lease.Counter{c}) {
			if sel.matches(&obj) {
				out[obj.Namespace] = &obj
			}
		}
		return out
	}
}
