package leasestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"sync"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Freed slots: every decrement (release, reap, revocation, rollback) and every reconcile
// correction that lowers a counter tells this process's waiters at once (WithFreedHook) and,
// with WithFreedEvents, the other processes through a small capped collection that each
// process's Notifier follows (docs/waiting.md).

// EventsCollection is the capped collection of freed-slot events.
const EventsCollection = "resource_lease_freed"

// Bounds of the events collection: it only has to cover the time a notifier takes to read
// the next batch (publishers batch their keys); a notifier that falls behind by more
// reconnects and wakes every waiter. Small, because FerretDB's awaitData re-reads the whole
// collection every 10 ms while a tailing cursor waits.
const (
	eventsMaxDocs = 32
	eventsBytes   = 64 << 10
)

// FreedFunc is told the counter keys that got slots back, one entry per slot.
type FreedFunc func(keys []string)

// WithFreedHook calls f, synchronously and after the counters were lowered, with the keys of
// every slot this store gives back.
func WithFreedHook(f FreedFunc) Option { return func(c *config) { c.freedHook = f } }

// WithFreedEvents makes the store publish every slot it gives back to the events collection,
// for the notifiers of other processes. Publishing is asynchronous and batched: it never
// delays the release, and one insert carries every slot freed while the previous was in
// flight. A lost event costs a waiter at most its safety timer.
func WithFreedEvents() Option { return func(c *config) { c.publish = true } }

// eventDoc is a document of the events collection.
type eventDoc struct {
	ID     bson.ObjectID `bson:"_id"`
	Origin string        `bson:"origin"`
	Keys   []string      `bson:"keys"`
}

// publisher batches freed keys into event inserts on its own goroutine.
type publisher struct {
	once    sync.Once
	mu      sync.Mutex
	pending []string
	kick    chan struct{}
	stop    chan struct{}
	done    chan struct{}
}

// freed reports slots given back on keys: the local hook, then the event publisher.
func (s *Store) freed(keys []string) {
	if len(keys) == 0 {
		return
	}
	if s.cfg.freedHook != nil {
		s.cfg.freedHook(keys)
	}
	if p := s.pub; p != nil {
		p.mu.Lock()
		if len(p.pending) < eventsMaxKeys {
			p.pending = append(p.pending, keys...)
		}
		p.mu.Unlock()
		select {
		case p.kick <- struct{}{}:
		default:
		}
	}
}

// eventsMaxKeys bounds the keys one process keeps waiting to be published.
const eventsMaxKeys = 4096

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
			keys := p.pending
			p.pending = nil
			p.mu.Unlock()
			if len(keys) > 0 {
				_ = s.publish(keys) // a lost event costs the waiters their safety timer, no more
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
func (s *Store) publish(keys []string) error {
	ctx, cancel := s.bound(context.Background())
	defer cancel()
	if err := s.ensureEvents(ctx); err != nil {
		return err
	}
	_, err := s.events.InsertOne(ctx, eventDoc{ID: bson.NewObjectID(), Origin: s.origin, Keys: keys})
	if err != nil {
		return unavailable("publishing freed slots", err)
	}
	return nil
}

// ensureEvents creates the capped events collection once per store (an insert into a missing
// collection would create an uncapped one).
func (s *Store) ensureEvents(ctx context.Context) error {
	s.eventsMu.Lock()
	defer s.eventsMu.Unlock()
	if s.eventsReady {
		return nil
	}
	err := s.db.CreateCollection(ctx, EventsCollection,
		options.CreateCollection().SetCapped(true).SetSizeInBytes(eventsBytes).SetMaxDocuments(eventsMaxDocs))
	var ce mongo.CommandError
	if err != nil && (!errors.As(err, &ce) || ce.Code != codeNamespaceExists) {
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

// repeat returns key n times: n slots of one counter.
func repeat(key string, n int) []string {
	if n <= 0 {
		return nil
	}
	out := make([]string, n)
	for i := range out {
		out[i] = key
	}
	return out
}

// NotifyMode is how a Notifier learns of slots freed by other processes.
type NotifyMode string

// Notifier modes, best first.
const (
	// NotifyChangeStream watches the events collection with a change stream (MongoDB replica
	// sets and sharded clusters).
	NotifyChangeStream NotifyMode = "changeStream"
	// NotifyTail tails the events collection with a tailable awaitData cursor (a standalone
	// MongoDB, FerretDB, the development server).
	NotifyTail NotifyMode = "tail"
	// NotifyPoll learns nothing from the store: waiters rely on their safety timers.
	NotifyPoll NotifyMode = "poll"
)

// Notifier follows the freed-slot events of other processes, one per process (never one
// cursor per waiter). Run it on its own goroutine.
type Notifier struct {
	store   *Store
	freed   FreedFunc
	reset   func()
	await   time.Duration
	backoff time.Duration

	mu   sync.Mutex
	mode NotifyMode
}

// NewNotifier returns a notifier that calls freed with the keys of slots freed by other
// stores (processes) and reset when it (re)connects after a break, so that every waiter
// re-checks once.
func NewNotifier(s *Store, freed FreedFunc, reset func()) *Notifier {
	return &Notifier{store: s, freed: freed, reset: reset, await: time.Second, backoff: time.Second}
}

// Mode is the mode of the current connection ("" before the first).
func (n *Notifier) Mode() NotifyMode {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.mode
}

// Run follows the events until ctx ends: a change stream if the server offers one, else a
// tailable cursor, else nothing (poll mode waits for ctx). A broken connection is retried
// after a pause and followed by reset.
func (n *Notifier) Run(ctx context.Context) {
	for broken := false; ctx.Err() == nil; broken = true {
		if broken {
			n.reset()
		}
		err := n.follow(ctx)
		if ctx.Err() != nil {
			return
		}
		_ = err // the next round reconnects; waiters meanwhile run on their safety timers
		select {
		case <-ctx.Done():
			return
		case <-time.After(n.backoff):
		}
	}
}

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
		last = eventDoc{ID: bson.NewObjectID(), Origin: "start", Keys: []string{}}
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

// deliver hands another process's freed keys to the waiters; this store's own events were
// delivered by the freed hook already.
func (n *Notifier) deliver(ev eventDoc) {
	if ev.Origin == n.store.origin || len(ev.Keys) == 0 {
		return
	}
	n.freed(ev.Keys)
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
