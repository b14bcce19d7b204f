package leasestore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/event"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// Collection names of the storage model (docs/design.md, "Storage").
const (
	CountersCollection = "resource_lease_counters"
	HoldersCollection  = "resource_lease_holders"
	// FencesCollection keeps one document per resource with the last fence it granted
	// (fence.go). Nothing deletes these documents: reconcile works on counters only.
	FencesCollection = "resource_lease_fences"
)

// Defaults of the store options.
const (
	DefaultOpTimeout = 5 * time.Second
	// DefaultSafetyMargin is how long a counter without entries stays before reconcile
	// deletes it.
	DefaultSafetyMargin = 60 * time.Second
)

// Step names a point between two writes of a multi-write operation, where a fault hook
// (WithFault) can fail the operation or simulate a crash.
type Step string

// The steps at which WithFault is consulted.
const (
	// StepHolderCreated: after the PENDING holder insert, before the first level.
	StepHolderCreated Step = "holder-created"
	// StepBooked: after a level's entry was written, before the holder records the level.
	StepBooked Step = "booked"
	// StepLevelPushed: after a key was pushed to the holder, before the next level.
	StepLevelPushed Step = "level-pushed"
	// StepHolderReleased: after a holder was marked released (release, rollback, reap,
	// revocation, a waiter leaving), before its entries are given back and the holder deleted.
	StepHolderReleased Step = "holder-released"
	// StepQueued: after a holder entered a full level's line, before it tries the level
	// once more.
	StepQueued Step = "queued"
	// StepCreatedInLine: after a newcomer's holder was written straight into the line of its
	// first level (Acquire, when the store saw that line), before it tries the level.
	StepCreatedInLine Step = "created-in-line"
	// StepClaimBooked: after a waiting holder booked the level it waits at, before it leaves
	// the line with the level recorded.
	StepClaimBooked Step = "claim-booked"
	// StepPicked: after a hand-over named the waiter it gives a slot to (the waiter's
	// document), before the slot's entry moves to it.
	StepPicked Step = "picked"
	// StepHandedOver: after a slot's entry moved to a waiter, before the waiter is told and
	// the other slots are given back.
	StepHandedOver Step = "handed-over"
	// StepGivenBack: after a release removed its entries where nobody lines up, before it
	// hands over the others.
	StepGivenBack Step = "given-back"
	// StepUnborrowed: after a borrower was refused at the global level, before it gives its
	// borrowed tenant slot back and queues at its tenant level (borrow.go).
	StepUnborrowed Step = "unborrowed"
	// StepPartsFenced: after an acquisition of several resources took its parts' fences,
	// before the write that grants it (complete).
	StepPartsFenced Step = "parts-fenced"
	// StepCreatingEvents: before the store creates the capped events collection; an error
	// stands for a server that refuses it (no capped collections).
	StepCreatingEvents Step = "creating-events"
)

// ErrCrash is what a fault hook returns to make the operation stop where it is, without any
// cleanup, as a process crash would.
var ErrCrash = errors.New("simulated crash")

// FaultFunc is consulted at each Step with the counter key or token concerned. A nil
// return lets the operation go on; ErrCrash (or an error wrapping it) stops it dead; any
// other error is handled like a store error at that point.
type FaultFunc func(step Step, key string) error

type config struct {
	opTimeout    time.Duration
	safetyMargin time.Duration
	fault        FaultFunc
	observe      func(command string)
	// observeOffPath: see WithOffPathObserver.
	observeOffPath func(command string)
	observeReply   func(command string, docs int)
	observeFlight  func(started bool)
	// grantHook and publish: see events.go.
	grantHook GrantFunc
	publish   bool
	// small: see WithSmallPool.
	small uint64
}

// Option configures a Store.
type Option func(*config)

// WithOpTimeout bounds every store call that has no earlier deadline.
func WithOpTimeout(d time.Duration) Option { return func(c *config) { c.opTimeout = d } }

// WithSafetyMargin sets how long a counter without entries stays before reconcile deletes it.
func WithSafetyMargin(d time.Duration) Option { return func(c *config) { c.safetyMargin = d } }

// WithSmallPool sizes the client for one pod's callers (the lease agent): at most n
// connections in the pool, an idle one closed after smallPoolIdle, and the servers monitored
// by polling, one connection per server instead of two (the driver's default streams each
// server's state on one connection and measures its round trip on another). Idle, the agent
// then keeps one monitoring connection per server and the one its notifier polls through.
func WithSmallPool(n uint64) Option { return func(c *config) { c.small = n } }

// smallPoolIdle is how long a connection of a small pool stays open unused.
const smallPoolIdle = 30 * time.Second

// WithFault installs a fault hook (tests only).
func WithFault(f FaultFunc) Option { return func(c *config) { c.fault = f } }

// WithCommandObserver calls f with the name of every command sent to the server on a
// caller's path (one call per round trip); used by the benchmarks to count round trips.
func WithCommandObserver(f func(command string)) Option {
	return func(c *config) { c.observe = f }
}

// WithOffPathObserver calls f with the name of every command the store sends with no caller
// waiting for it (the batched deletes of released holders, marks.go), which WithCommandObserver
// leaves out; the benchmarks count both.
func WithOffPathObserver(f func(command string)) Option {
	return func(c *config) { c.observeOffPath = f }
}

// WithInFlightObserver calls f with true when a command a caller waits for is sent and with
// false when its answer (or failure) comes back; the tests count from it the round trips of
// an operation as its caller waits for them, two commands in flight together being one.
func WithInFlightObserver(f func(started bool)) Option {
	return func(c *config) { c.observeFlight = f }
}

// WithReplyObserver calls f with the name and the number of documents of every successful
// reply (cursor batches, a findAndModify's value); used by the benchmarks to count the
// documents an operation reads.
func WithReplyObserver(f func(command string, docs int)) Option {
	return func(c *config) { c.observeReply = f }
}

// commandMonitor is the driver's monitor for the observers of cfg.
func commandMonitor(cfg config) *event.CommandMonitor {
	mon := &event.CommandMonitor{}
	onPath := func(ctx context.Context) bool { return ctx.Value(offPath{}) == nil }
	observe, off, flight := cfg.observe, cfg.observeOffPath, cfg.observeFlight
	mon.Started = func(ctx context.Context, e *event.CommandStartedEvent) {
		f := observe
		if !onPath(ctx) {
			f = off
		} else if flight != nil {
			flight(true)
		}
		if f != nil {
			f(e.CommandName)
		}
	}
	mon.Succeeded = func(ctx context.Context, e *event.CommandSucceededEvent) {
		if flight != nil && onPath(ctx) {
			flight(false)
		}
		if cfg.observeReply != nil {
			cfg.observeReply(e.CommandName, replyDocs(e.Reply))
		}
	}
	mon.Failed = func(ctx context.Context, _ *event.CommandFailedEvent) {
		if flight != nil && onPath(ctx) {
			flight(false)
		}
	}
	return mon
}

// Store keeps counters and holders in one MongoDB database.
type Store struct {
	client   *mongo.Client
	db       *mongo.Database
	counters *mongo.Collection
	holders  *mongo.Collection
	events   *mongo.Collection
	fences   *mongo.Collection
	cfg      config

	// origin names this store in the freed-slot events it publishes; pub publishes them
	// (nil without WithFreedEvents); eventsReady: the capped collection exists.
	origin        string
	pub           *publisher
	eventsMu      sync.Mutex
	eventsReady   bool
	eventsRetryAt time.Time

	// holds: the recent hold times per resource this store last wrote or read (fence.go).
	holds holdCache
	// lined: when this store last saw a counter key with waiters (giveBack's hint).
	lined recentKeys
	// handedAt: when this store last handed a slot of a counter key over (queue's hint).
	handedAt recentKeys
	// marks deletes released holders off the callers' path (marks.go).
	marks *markDropper
	// handed keeps the holders this store's hand-overs completed for its own waiters, until
	// the waiter takes its answer (wait.go).
	handed handedHolders
	// heldHere keeps the leases this store answered HELD until their release (prefence.go).
	heldHere heldHere
}

// Connect opens a client for uri and uses the named database. It does not wait for the
// server; the first call fails with lease.ErrUnavailable when it cannot be reached.
func Connect(uri, database string, opts ...Option) (*Store, error) {
	cfg := config{opTimeout: DefaultOpTimeout, safetyMargin: DefaultSafetyMargin}
	for _, o := range opts {
		o(&cfg)
	}
	copts := options.Client().ApplyURI(uri).
		SetServerSelectionTimeout(cfg.opTimeout).
		SetConnectTimeout(cfg.opTimeout)
	if cfg.small > 0 {
		copts.SetMaxPoolSize(cfg.small).SetMaxConnIdleTime(smallPoolIdle).
			SetServerMonitoringMode(options.ServerMonitoringModePoll)
	}
	if cfg.observe != nil || cfg.observeOffPath != nil || cfg.observeReply != nil || cfg.observeFlight != nil {
		copts.SetMonitor(commandMonitor(cfg))
	}
	client, err := mongo.Connect(copts)
	if err != nil {
		return nil, fmt.Errorf("connecting to MongoDB: %w", err)
	}
	db := client.Database(database)
	s := &Store{
		client:   client,
		db:       db,
		counters: db.Collection(CountersCollection),
		holders:  db.Collection(HoldersCollection),
		events:   db.Collection(EventsCollection),
		fences:   db.Collection(FencesCollection),
		cfg:      cfg,
		origin:   newOrigin(),
	}
	if cfg.publish {
		s.startPublisher()
	}
	s.startMarkDropper()
	return s, nil
}

// Close disconnects the client.
func (s *Store) Close(ctx context.Context) error {
	s.stopPublisher()
	s.stopMarkDropper()
	ctx, cancel := s.bound(ctx)
	defer cancel()
	return s.client.Disconnect(ctx)
}

// Drop removes the store's database (tests and development only).
func (s *Store) Drop(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.db.Drop(ctx); err != nil {
		return unavailable("dropping database", err)
	}
	return nil
}

// Ping checks that the server answers.
func (s *Store) Ping(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	if err := s.db.RunCommand(ctx, bson.D{{Key: "ping", Value: 1}}).Err(); err != nil {
		return unavailable("pinging MongoDB", err)
	}
	return nil
}

// ServerTime returns the server's clock (the hello command's localTime). Idle reaping
// compares holders' lastSeenAt, written with $currentDate, against it, so no pod clock is
// involved.
func (s *Store) ServerTime(ctx context.Context) (time.Time, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var reply struct {
		LocalTime time.Time `bson:"localTime"`
	}
	if err := s.db.RunCommand(ctx, bson.D{{Key: "hello", Value: 1}}).Decode(&reply); err != nil {
		return time.Time{}, unavailable("reading server time", err)
	}
	if reply.LocalTime.IsZero() {
		return time.Time{}, unavailable("reading server time", errors.New("hello reply has no localTime"))
	}
	return reply.LocalTime, nil
}

// EnsureIndexes creates the indexes the queries need; it is idempotent.
func (s *Store) EnsureIndexes(ctx context.Context) error {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	holderIdx := []mongo.IndexModel{
		{Keys: bson.D{{Key: "resource", Value: 1}, {Key: "lastSeenAt", Value: 1}}},
		// The holders of several resources by each of them (ofResource). Sparse: a holder of
		// one resource, the usual one, has no entry, so its writes do not maintain it.
		{Keys: bson.D{{Key: "parts.resource", Value: 1}}, Options: options.Index().SetSparse(true)},
		{Keys: bson.D{{Key: "pod.uid", Value: 1}}},
		{Keys: bson.D{{Key: "pod.namespace", Value: 1}, {Key: "pod.name", Value: 1}}},
		{Keys: bson.D{{Key: "tenant", Value: 1}}},
		{Keys: bson.D{{Key: "pid", Value: 1}}},
		// The line of a full level: its highest, then oldest, live waiter first (giveBack).
		{Keys: lineOrderIndex},
		{Keys: bson.D{{Key: "levels", Value: 1}}},
		// The hand-overs a released holder began (finishHandOvers).
		{Keys: bson.D{{Key: "grantFrom", Value: 1}}},
	}
	if _, err := s.holders.Indexes().CreateMany(ctx, holderIdx); err != nil {
		return unavailable("creating holder indexes", err)
	}
	if err := s.holders.Indexes().DropOne(ctx, oldLineIndex); err != nil && !indexNotFound(err) {
		return unavailable("dropping the line index before priorities", err)
	}
	if err := s.backfillHolderIDs(ctx); err != nil {
		return err
	}
	counterIdx := []mongo.IndexModel{
		{Keys: bson.D{{Key: "resource", Value: 1}}},
		{Keys: bson.D{{Key: "tenant", Value: 1}}},
	}
	if _, err := s.counters.Indexes().CreateMany(ctx, counterIdx); err != nil {
		return unavailable("creating counter indexes", err)
	}
	_, err := s.migrateCounters(ctx)
	return err
}

// migrateCounters gives every counter written before bookings named their holders (one
// without slots: a count kept apart from the holders) the entries of the holders that book
// it, and its count the number of them; it runs on every start and finds nothing to do once
// done. A holder being released books nothing any more, and the fields of the former model
// (rev, a holder's incKey) go. Each counter is written on the condition that it has no
// slots yet, so replicas starting together write each once. It returns how many counters it
// migrated. No process of the former version may write the store meanwhile
// (docs/operations.md, "Upgrading").
func (s *Store) migrateCounters(ctx context.Context) (int, error) {
	old, err := s.findCounters(ctx, bson.D{{Key: "slots", Value: entryAbsent}})
	if err != nil || len(old) == 0 {
		return 0, err
	}
	entries := map[string]bson.D{}
	err = eachDoc(ctx, s, s.holders, "reading holders", bson.D{notReleased},
		bson.D{{Key: "_id", Value: 1}, {Key: "pid", Value: 1}, {Key: "levels", Value: 1}, {Key: "grantKey", Value: 1}, {Key: "borrowKey", Value: 1}}, nil,
		func(d holderDoc) error {
			pid := d.PID
			if pid == "" {
				pid = lease.HolderID(d.ID)
			}
			for _, k := range d.booked() {
				entries[k] = append(entries[k], bson.E{Key: pid, Value: slotDoc{Borrowed: k == d.BorrowKey}})
			}
			return nil
		})
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range old {
		slots := entries[c.ID]
		if slots == nil {
			slots = bson.D{}
		}
		wctx, cancel := s.bound(ctx)
		res, err := s.counters.UpdateOne(wctx, bson.D{{Key: "_id", Value: c.ID}, {Key: "slots", Value: entryAbsent}}, bson.D{
			{Key: "$set", Value: bson.D{{Key: "slots", Value: slots}, {Key: "count", Value: len(slots)}}},
			{Key: "$unset", Value: bson.D{{Key: "rev", Value: ""}}},
			{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
		})
		cancel()
		if err != nil {
			return n, unavailable("migrating counter "+c.ID, err)
		}
		n += int(res.ModifiedCount)
	}
	wctx, cancel := s.bound(ctx)
	defer cancel()
	if _, err := s.holders.UpdateMany(wctx, bson.D{{Key: "incKey", Value: entryPresent}}, bson.D{{Key: "$unset", Value: bson.D{{Key: "incKey", Value: ""}}}}); err != nil {
		return n, unavailable("migrating holders", err)
	}
	return n, nil
}

// lineOrderIndex serves the hand-over's sort (lineOrder) within one waitKey; oldLineIndex is
// the index of the line before priorities, which it replaces.
var lineOrderIndex = bson.D{{Key: "waitKey", Value: 1}, {Key: "priority", Value: -1}, {Key: "queuedAt", Value: 1}, {Key: "_id", Value: 1}}

const oldLineIndex = "waitKey_1_queuedAt_1__id_1"

// indexNotFound reports the server's answer to dropping an index that is not there.
func indexNotFound(err error) bool {
	var ce mongo.CommandError
	return errors.As(err, &ce) && (ce.Code == 27 || ce.Name == "IndexNotFound")
}

// bound gives ctx the store's operation timeout unless it already has an earlier deadline.
func (s *Store) bound(ctx context.Context) (context.Context, context.CancelFunc) {
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) <= s.cfg.opTimeout {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, s.cfg.opTimeout)
}

// fault consults the fault hook, if any.
func (s *Store) fault(step Step, key string) error {
	if s.cfg.fault == nil {
		return nil
	}
	return s.cfg.fault(step, key)
}

// newToken returns a random 128-bit holder token.
func newToken() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generating token: %w", err)
	}
	return hex.EncodeToString(b[:]), nil
}

// counterDoc is a document of resource_lease_counters: one level of one scope, with the
// entries of the holders that book it (slots.go).
type counterDoc struct {
	ID       string `bson:"_id"`
	Resource string `bson:"resource"`
	Level    string `bson:"level"`
	Scope    string `bson:"scope"`
	// Tenant is empty for the global level, which belongs to no tenant.
	Tenant string `bson:"tenant"`
	// Count is the number of entries in Slots, written by the same updates.
	Count int `bson:"count"`
	// Slots has one entry per booked slot, keyed by the public ID of its holder.
	Slots     map[string]slotDoc `bson:"slots"`
	UpdatedAt time.Time          `bson:"updatedAt"`
	// Lined: waiters line up at this counter (wait.go); a hint, not a record.
	Lined bool `bson:"lined,omitempty"`
	// LinedPrio: the highest priority a waiter had when it last tried this counter, cleared
	// with Lined; a hint that room at the counter is owed to a higher waiter (claim).
	LinedPrio int `bson:"linedPrio,omitempty"`
}

// podDoc is the pod of a holder document.
type podDoc struct {
	Namespace string `bson:"namespace"`
	Name      string `bson:"name"`
	UID       string `bson:"uid"`
}

// holderDoc is a document of resource_lease_holders.
type holderDoc struct {
	ID string `bson:"_id"`
	// PID is the public holder ID (lease.HolderID of ID), written with the holder so that
	// get and revoke by ID need no more round trips than by token. Holders stored before
	// IDs existed get it from EnsureIndexes.
	PID        string            `bson:"pid,omitempty"`
	State      string            `bson:"state"`
	LeaseName  string            `bson:"leaseName"`
	Resource   string            `bson:"resource"`
	Type       string            `bson:"type"`
	Tenant     string            `bson:"tenant"`
	Project    string            `bson:"project"`
	User       string            `bson:"user"`
	HolderRef  string            `bson:"holderRef"`
	Pod        podDoc            `bson:"pod"`
	PodBound   bool              `bson:"podBound"`
	Payload    map[string]string `bson:"payload"`
	TTLSeconds float64           `bson:"ttlSeconds"`
	Levels     []string          `bson:"levels"`
	AcquiredAt time.Time         `bson:"acquiredAt"`
	LastSeenAt time.Time         `bson:"lastSeenAt"`
	// The line (wait.go). WaitKey: the full level a WAITING holder waits at; QueuedAt: the
	// server's time it first waited (its place); WaitExp: when it lapses unless renewed (the
	// waiting process's clock); Origin: the store (process) that waits, to wake it.
	WaitKey string `bson:"waitKey,omitempty"`
	// WaitCap: the cap of the level at WaitKey when the holder lined up (the views estimate
	// its wait from it).
	WaitCap  int       `bson:"waitCap,omitempty"`
	QueuedAt time.Time `bson:"queuedAt,omitempty"`
	WaitExp  time.Time `bson:"waitExp,omitempty"`
	Origin   string    `bson:"origin,omitempty"`
	// Priority: the waiter's place among the priorities of its line, highest first (absent
	// is 0: a line without priorities is ordered exactly as before them).
	Priority int `bson:"priority,omitempty"`
	// GrantState: the state a waiter gets when a slot is handed to it, HELD when it waits at
	// its last level (the hand-over completes its acquisition), else PENDING.
	GrantState string `bson:"grantState,omitempty"`
	// GrantKey: a slot of this counter was handed to the holder (giveBack) and is booked by it:
	// until the holder pushes the key to its levels (PENDING), or for good when it was the
	// holder's last level (HELD).
	GrantKey string `bson:"grantKey,omitempty"`
	// GrantFrom: the holder whose slot of GrantKey a hand-over gives this one; the hand-over
	// is done when the counter's entry is moved (wait.go, handOverOf).
	GrantFrom string `bson:"grantFrom,omitempty"`
	// GrantAt: the server's time the hand-over named the holder.
	GrantAt time.Time `bson:"grantAt,omitempty"`
	// Keys are every counter of the holder's funnel, written with it: a release gives back
	// its entries at each of them (each removal is conditional on the entry), whatever the
	// holder's own record says.
	Keys []string `bson:"keys,omitempty"`
	// Fence: the number the write that granted the holder gave it (fence.go); 0 until then.
	Fence int64 `bson:"fence,omitempty"`
	// BorrowKey: the tenant counter whose slot the holder took above the cap BorrowCap
	// (borrow.go); absent for a holder within its caps, and so for every holder while
	// borrowing is off.
	BorrowKey string `bson:"borrowKey,omitempty"`
	BorrowCap int    `bson:"borrowCap,omitempty"`
	// Parts: the resources of a holder that books several at once, in the order of their
	// resources, each with its fence once granted; absent for a holder of one resource.
	// LeaseName, Resource and Fence are then the first part's.
	Parts []partDoc `bson:"parts,omitempty"`
}

// partDoc is one resource of a holder that books several.
type partDoc struct {
	Lease    string `bson:"lease"`
	Resource string `bson:"resource"`
	Fence    int64  `bson:"fence,omitempty"`
}

// partOf is the lease name the holder booked counter key under: its lease name, or that of
// its part of the key's resource.
func (d holderDoc) partOf(key string) string {
	r, _, _ := strings.Cut(key, "|")
	for _, p := range d.Parts {
		if p.Resource == r {
			return p.Lease
		}
	}
	return d.LeaseName
}

// resources names the holder's resources for a message: its resource, or its parts'.
func (d holderDoc) resources() string {
	if len(d.Parts) == 0 {
		return d.Resource
	}
	return lease.JoinParts(d.Parts, func(p partDoc) string { return p.Resource })
}

// stateReleased marks a holder whose slots are being given back (release, rollback, reap,
// revocation, a waiter leaving): it answers as gone everywhere, and its document stays until
// its entries are removed (slots.go).
const stateReleased = "RELEASED"

func (d holderDoc) holder() lease.Holder {
	id := d.PID
	if id == "" && d.ID != "" {
		id = lease.HolderID(d.ID)
	}
	return lease.Holder{
		Token:      d.ID,
		ID:         id,
		State:      lease.HolderState(d.State),
		LeaseName:  d.LeaseName,
		Resource:   d.Resource,
		Type:       d.Type,
		Tenant:     d.Tenant,
		Project:    d.Project,
		User:       d.User,
		HolderRef:  d.HolderRef,
		Pod:        lease.PodRef{Namespace: d.Pod.Namespace, Name: d.Pod.Name, UID: d.Pod.UID},
		PodBound:   d.PodBound,
		Payload:    d.Payload,
		TTL:        time.Duration(d.TTLSeconds * float64(time.Second)),
		Levels:     d.booked(),
		AcquiredAt: d.AcquiredAt,
		LastSeenAt: d.LastSeenAt,
		Fence:      d.Fence,
		Borrowed:   d.BorrowKey != "",
		Parts:      d.parts(),
	}
}

func (d holderDoc) parts() []lease.Part {
	if len(d.Parts) == 0 {
		return nil
	}
	out := make([]lease.Part, len(d.Parts))
	for i, p := range d.Parts {
		out[i] = lease.Part{LeaseName: p.Lease, Resource: p.Resource, Fence: p.Fence}
	}
	return out
}

// replyDocs counts the documents a reply carries: a cursor's batch, or a findAndModify's
// value.
func replyDocs(reply bson.Raw) int {
	for _, batch := range []string{"firstBatch", "nextBatch"} {
		if arr, ok := reply.Lookup("cursor", batch).ArrayOK(); ok {
			vals, _ := arr.Values()
			return len(vals)
		}
	}
	if v, err := reply.LookupErr("value"); err == nil && v.Type == bson.TypeEmbeddedDocument {
		return 1
	}
	return 0
}

// backfillHolderIDs writes the public ID onto holders stored without one (before IDs
// existed, or by an older agent during an upgrade), so that get, revoke and paging by ID
// find them. The ID is derived from the token, so replicas doing this at once agree.
func (s *Store) backfillHolderIDs(ctx context.Context) error {
	docs, err := s.findHolders(ctx, bson.D{{Key: "pid", Value: bson.D{{Key: "$exists", Value: false}}}},
		bson.D{{Key: "_id", Value: 1}})
	if err != nil {
		return err
	}
	for _, d := range docs {
		if _, err := s.holders.UpdateOne(ctx, bson.D{{Key: "_id", Value: d.ID}},
			bson.D{{Key: "$set", Value: bson.D{{Key: "pid", Value: lease.HolderID(d.ID)}}}}); err != nil {
			return unavailable("writing holder IDs", err)
		}
	}
	return nil
}
