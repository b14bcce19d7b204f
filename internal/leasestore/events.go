package leasestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Wake-ups across processes: a slot handed to a waiter (wait.go) wakes it at once when it
// waits in this process (WithGrantHook) and, with WithGrantEvents, through a small capped
// collection that each process's Notifier follows when it waits in another one. An event
// names the waiting holders by public ID, so only their processes act on it, and only they.
// A lost event costs the waiter its next safety look, no more: the waiter reads its own
// holder then.

// EventsCollection is the capped collection of hand-over events.
const EventsCollection = "resource_lease_freed"

// Bounds of the events collection: it only has to cover the time a notifier takes to read
// the next batch; a notifier that falls behind by more reconnects and wakes every waiter
// once. An event carries at most eventMaxGrants grants, so that a batch never outgrows it.
const (
	eventsMaxDocs  = 32
	eventsBytes    = 64 << 10
	eventMaxGrants = 32
)

// GrantFunc is told the slots handed to waiters.
type GrantFunc func(grants []Grant)

// WithGrantHook calls f, synchronously after the hand-over, with the slots handed to waiters
// of this store (process).
func WithGrantHook(f GrantFunc) Option { return func(c *config) { c.grantHook = f } }

// WithGrantEvents makes the store publish the slots it hands to waiters of other processes
// to the events collection, for their notifiers. Publishing is asynchronous and batched: it
// never delays the release, and one insert carries every grant made while the previous was
// in flight.
func WithGrantEvents() Option { return func(c *config) { c.publish = true } }

// eventDoc is a document of the events collection.
type eventDoc struct {
	ID     bson.ObjectID `bson:"_id"`
	Origin string        `bson:"origin"`
	Grants []Grant       `bson:"grants"`
}

// publisher batches grants into event inserts on its own goroutine.
type publisher struct {
	once    sync.Once
	mu      sync.Mutex
	pending []Grant
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// granted tells the waiters of grants (origins: the store each waits in): this store's at
// once through the hook, the others through the publisher.
func (s *Store) granted(grants []Grant, origins []string) {
	var local, remote []Grant
	for i, g := range grants {
		if origins[i] == s.origin {
			local = append(local, g)
		} else {
			remote = append(remote, g)
		}
	}
	if len(local) > 0 && s.cfg.grantHook != nil {
		s.cfg.grantHook(local)
	}
	if p := s.pub; p != nil && len(remote) > 0 {
		p.mu.Lock()
		if len(p.pending) < eventsMaxPending {
			p.pending = append(p.pending, remote...)
		}
		p.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// eventsMaxPending bounds the grants one process keeps waiting to be published.
const eventsMaxPending = 4096

func (s *Store) startPublisher() {
	p := &publisher{kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	s.pub = p
	go func() {
		defer close(p.done)
		for {
			select {
			case <-p.stop:
				return
			case <-p.kick:
			}
			p.mu.Lock()
			grants := p.pending
			p.pending = nil
			p.mu.Unlock()
			for len(grants) > 0 {
				n := min(len(grants), eventMaxGrants)
				_ = s.publish(grants[:n]) // a lost event costs a waiter its safety look, no more
				grants = grants[n:]
			}
		}
	}()
}

func (s *Store) stopPublisher() {
	if s.pub == nil {
		return
	}
	s.pub.once.Do(func() { close(s.pub.stop) })
	<-s.pub.done
}

// publish inserts one event.
func (s *Store) publish(grants []Grant) error {
	ctx, cancel := s.bound(context.Background())
	defer cancel()
	if err := s.ensureEvents(ctx); err != nil {
		return err
	}
	_, err := s.events.InsertOne(ctx, eventDoc{ID: bson.NewObjectID(), Origin: s.origin, Grants: grants})
	if err != nil {
		return unavailable("publishing hand-overs", err)
	}
	return nil
}

// eventsRetry is how long a store waits before it tries to create the events collection
// again after a failure (a server without capped collections): the publisher does not pay a
// failing command on every hand-over.
const eventsRetry = 30 * time.Second

// ensureEvents creates the capped events collection once per store (an insert into a missing
// collection would create an uncapped one).
func (s *Store) ensureEvents(ctx context.Context) error {
	s.eventsMu.Lock()
	defer s.eventsMu.Unlock()
	if s.eventsReady {
		return nil
	}
	if time.Now().Before(s.eventsRetryAt) {
		return unavailable("creating "+EventsCollection, errors.New("failed recently; not retried yet"))
	}
	err := s.fault(StepCreatingEvents, EventsCollection)
	if err == nil {
		err = s.db.CreateCollection(ctx, EventsCollection,
			options.CreateCollection().SetCapped(true).SetSizeInBytes(eventsBytes).SetMaxDocuments(eventsMaxDocs))
	}
	var ce mongo.CommandError
	if err != nil && (!errors.As(err, &ce) || ce.Code != codeNamespaceExists) {
		s.eventsRetryAt = time.Now().Add(eventsRetry)
		return unavailable("creating "+EventsCollection, err)
	}
	s.eventsReady = true
	return nil
}

// codeNamespaceExists is the server's error code for creating a collection that exists.
const codeNamespaceExists = 48

// newOrigin names one store instance in the events it publishes.
func newOrigin() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// NotifyMode is how a Notifier learns of slots handed to this process's waiters by others.
type NotifyMode string

// Notifier modes, best first.
const (
	// NotifyChangeStream watches the events collection with a change stream (MongoDB replica
	// sets and sharded clusters).
	NotifyChangeStream NotifyMode = "changeStream"
	// NotifyTail tails the events collection with a tailable awaitData cursor (a standalone
	// MongoDB, FerretDB, the development server).
	NotifyTail NotifyMode = "tail"
	// NotifyPoll learns nothing from the store: waiters learn of hand-overs at their safety
	// looks.
	NotifyPoll NotifyMode = "poll"
)

// Notifier follows the hand-over events of other processes, one per process (never one
// cursor per waiter). Run it on its own goroutine.
type Notifier struct {
	store   *Store
	granted GrantFunc
	reset   func()
	await   time.Duration
	backoff time.Duration

	mu   sync.Mutex
	mode NotifyMode
}

// NewNotifier returns a notifier that calls granted with the slots other stores (processes)
// handed over, and reset when it reconnects after a break of a following connection, so
// that every waiter reads its own state once (events may have been lost meanwhile).
func NewNotifier(s *Store, granted GrantFunc, reset func()) *Notifier {
	return &Notifier{store: s, granted: granted, reset: reset, await: time.Second, backoff: time.Second}
}

// Mode is the mode of the current connection ("" before the first).
func (n *Notifier) Mode() NotifyMode {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mode
}

// Run follows the events until ctx ends: a change stream if the server offers one, else a
// tailable cursor, else nothing (poll). A connection that broke after following is retried
// after a pause and followed by reset. A server that offers neither is asked again less and
// less often (up to maxBackoff), without waking anyone: in poll mode waiters learn of
// hand-overs at their safety looks anyway.
func (n *Notifier) Run(ctx context.Context) {
	backoff := n.backoff
	for ctx.Err() == nil {
		err := n.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		_ = err // the next round reconnects; waiters meanwhile learn at their safety looks
		followed := n.Mode() != NotifyPoll
		if followed {
			backoff = n.backoff
		} else {
			backoff = min(2*backoff, maxBackoff)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(backoff):
		}
		if followed {
			n.reset()
		}
	}
}

// maxBackoff bounds the pause between two tries of a notifier that found no way to follow.
const maxBackoff = time.Minute

func (n *Notifier) setMode(m NotifyMode) {
	n.mu.Lock()
	n.mode = m
	n.mu.Unlock()
}

// follow runs one connection of the notifier until it breaks or ctx ends.
func (n *Notifier) follow(ctx context.Context) error {
	s := n.store
	cctx, cancel := s.bound(ctx)
	err := s.ensureEvents(cctx)
	cancel()
	if err != nil {
		n.setMode(NotifyPoll)
		return err
	}
	cs, err := s.events.Watch(ctx, mongo.Pipeline{{{Key: "$match", Value: bson.D{{Key: "operationType", Value: "insert"}}}}},
		options.ChangeStream().SetMaxAwaitTime(n.await))
	if err == nil {
		n.setMode(NotifyChangeStream)
		defer func() { _ = cs.Close(context.WithoutCancel(ctx)) }()
		for cs.Next(ctx) {
			var ev struct {
				Doc eventDoc `bson:"fullDocument"`
			}
			if err := cs.Decode(&ev); err == nil {
				n.deliver(ev.Doc)
			}
		}
		return cs.Err()
	}
	return n.tail(ctx)
}

// tail follows the events collection with a tailable awaitData cursor, skipping the events
// that were there before it started.
func (n *Notifier) tail(ctx context.Context) error {
	s := n.store
	// The newest event now: everything up to it is old. FerretDB closes a tailable cursor
	// whose first batch is short, so the cursor asks for one document and the collection
	// must not be empty.
	var last eventDoc
	rctx, cancel := s.bound(ctx)
	err := s.events.FindOne(rctx, bson.D{}, options.FindOne().SetSort(bson.D{{Key: "$natural", Value: -1}})).Decode(&last)
	if errors.Is(err, mongo.ErrNoDocuments) {
		last = eventDoc{ID: bson.NewObjectID(), Origin: "start", Grants: []Grant{}}
		_, err = s.events.InsertOne(rctx, last)
	}
	cancel()
	if err != nil {
		n.setMode(NotifyPoll)
		return unavailable("reading "+EventsCollection, err)
	}
	cur, err := s.events.Find(ctx, bson.D{},
		options.Find().SetCursorType(options.TailableAwait).SetBatchSize(1).SetMaxAwaitTime(n.await))
	if err != nil {
		n.setMode(NotifyPoll)
		return unavailable("tailing "+EventsCollection, err)
	}
	defer func() { _ = cur.Close(context.WithoutCancel(ctx)) }()
	n.setMode(NotifyTail)
	cur.SetBatchSize(100)
	// Skip up to the newest event seen at the start; if it was pushed out of the capped
	// collection meanwhile, stop skipping after a collection's worth (a spurious wake costs
	// a waiter one read, a skipped one its safety timer).
	skip := eventsMaxDocs
	for cur.Next(ctx) {
		var ev eventDoc
		if err := cur.Decode(&ev); err != nil {
			continue
		}
		if skip > 0 {
			skip--
			if ev.ID == last.ID {
				skip = 0
			}
			continue
		}
		n.deliver(ev)
	}
	if err := cur.Err(); err != nil {
		return unavailable("tailing "+EventsCollection, err)
	}
	return errors.New("tailable cursor closed")
}

// deliver hands another process's grants to the waiters (those of other processes are
// ignored by the queue); this store's own grants to its own waiters went through the hook.
func (n *Notifier) deliver(ev eventDoc) {
	if ev.Origin == n.store.origin || len(ev.Grants) == 0 {
		return
	}
	for _, g := range ev.Grants {
		if g.Held && g.To == n.store.origin {
			n.store.keepHanded(holderDoc{PID: g.ID, GrantKey: g.Key, State: string(lease.StateHeld), Fence: g.Fence})
		}
	}
	n.granted(ev.Grants)
}

// DropEvents drops the events collection (tests: it breaks every notifier's cursor).
func (s *Store) DropEvents(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	s.eventsMu.Lock()
	s.eventsReady = false
	s.eventsMu.Unlock()
	if err := s.events.Drop(ctx); err != nil {
		return unavailable("dropping "+EventsCollection, err)
	}
	return nil
}
