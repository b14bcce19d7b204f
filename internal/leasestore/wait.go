package leasestore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// The line of a full level (docs/waiting.md). A holder that finds a level full, and may wait,
// stays in the holders collection as WAITING at that level's counter key: its place is the
// server's time it first waited. Every path that frees a slot (release, rollback, reap,
// revocation, a waiter giving up) hands it to the first live waiter of that key instead of
// removing its entry (handover.go): the entry moves from the releaser to the waiter in one
// update, so the level stays full and newcomers stay behind the line, and the waiter's
// process is woken by the waiter's holder ID. The waiting holders are the line; there is no
// second record of it.

// WaitingError is the answer of an attempt whose holder now waits in a level's line: the
// level it waits at and the token of the waiting holder (Resume, Withdraw).
type WaitingError struct {
	Busy  *lease.BusyError
	Token string
}

func (e *WaitingError) Error() string { return "waiting in line: " + e.Busy.Error() }

// Unwrap makes a WaitingError a *lease.BusyError for callers that do not wait.
func (e *WaitingError) Unwrap() error { return e.Busy }

// ErrNotWaiting is Resume's answer when the waiting holder is gone: reaped as idle (its
// renewals stopped for a whole TTL), its pod gone, or withdrawn.
var ErrNotWaiting = errors.New("the waiting holder is gone")

// Grant tells a waiting process that a slot of Key was handed to the holder with public ID ID.
//
// Held: the hand-over completed the waiter's acquisition (Key was its last level), so the
// waiter answers without a store call; To: the store (process) the waiter waits in.
type Grant struct {
	ID   string `bson:"id"`
	Key  string `bson:"key"`
	Held bool   `bson:"held,omitempty"`
	To   string `bson:"to,omitempty"`
	// Fence: the fence of a grant that completed the acquisition (Held).
	Fence int64 `bson:"fence,omitempty"`
}

// NewToken returns a random 128-bit holder token.
func NewToken() (string, error) { return newToken() }

// wait puts the holder in l's line (the state write), then tries l once more: a slot freed
// between the failed increment and the state write went to no waiter, and this try takes
// it. claimed is true when the holder booked l after all (the caller goes on with the next
// level); otherwise the answer is a *WaitingError, or an error after a rollback.
func (b *funnelRun) wait(ctx context.Context, l funnelLevel, busy *lease.BusyError) (claimed bool, err error) {
	s, token := b.store, b.doc.ID
	set := bson.D{
		{Key: "state", Value: string(lease.StateWaiting)},
		{Key: "waitKey", Value: l.key},
		{Key: "waitCap", Value: l.Cap},
		{Key: "waitExp", Value: time.Now().Add(b.waitTTL)},
		{Key: "origin", Value: s.origin},
		{Key: "grantState", Value: string(b.grantState(l.key))},
	}
	if p := b.prio(); p > 0 { // absent is 0: a line without priorities is written as before
		set = append(set, bson.E{Key: "priority", Value: p})
	}
	dates := bson.D{{Key: "lastSeenAt", Value: true}}
	if b.doc.QueuedAt.IsZero() { // a place is kept from level to level
		dates = append(dates, bson.E{Key: "queuedAt", Value: true})
	}
	res, err := s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StatePending)}},
		bson.D{{Key: "$set", Value: set}, {Key: "$currentDate", Value: dates}})
	switch {
	case err != nil:
		return false, s.abandon(ctx, b.doc, unavailable("queueing for "+l.key, err))
	case res.MatchedCount == 0:
		return false, s.abandon(ctx, b.doc, busy) // released under it: what it booked goes
	}
	if err := s.fault(StepQueued, l.key); err != nil {
		return false, s.abandon(ctx, b.doc, unavailable("queueing for "+l.key, err))
	}
	b.doc.State, b.doc.WaitKey, b.doc.WaitCap = string(lease.StateWaiting), l.key, l.Cap
	if b.doc.QueuedAt.IsZero() {
		b.doc.QueuedAt = time.Now() // the place is set: a wider level keeps it
	}
	return b.inLine(ctx, l, busy)
}

// inLine follows a holder's entering l's line: it tries l once (claim), so that a slot freed
// just before is not missed. claimed is true when the holder booked l after all; otherwise the
// answer is a *WaitingError with busy (its count refreshed by the try), joined to the store's
// error if the try failed (the holder is still in line: the caller's Resume sorts it out).
func (b *funnelRun) inLine(ctx context.Context, l funnelLevel, busy *lease.BusyError) (claimed bool, err error) {
	ok, count, err := b.claim(ctx, l)
	waiting := &WaitingError{Busy: busy, Token: b.doc.ID}
	if err == nil && !ok && count >= 0 {
		busy.Count = count
	}
	switch {
	case err != nil:
		return false, errors.Join(waiting, err)
	case !ok:
		return false, waiting
	}
	return true, nil
}

// queue is Acquire's first level when this store saw that level's line in the last second:
// the holder was created in the line already (one write instead of a refused increment and
// the write that queues), and the level is tried once, as after any entry into a line.
func (b *funnelRun) queue(ctx context.Context) (lease.Holder, error) {
	s, l := b.store, b.levels[0]
	if err := s.fault(StepCreatedInLine, l.key); err != nil {
		return lease.Holder{}, s.abandon(ctx, b.doc, unavailable("queueing for "+l.key, err))
	}
	busy := &lease.BusyError{Resource: b.doc.Resource, Level: l.Level, Scope: l.scope, Count: l.Cap, Cap: l.Cap}
	if b.prio() == 0 && b.borrow == nil && s.handedRecently(l.key) {
		// This store handed a slot of the level over a moment ago: the level was full with a
		// line, and a slot that comes back goes to the line. The try would find it full; the
		// holder's first look tries it instead (room that came back with nobody to hand it
		// to waits at most that long).
		return lease.Holder{}, &WaitingError{Busy: busy, Token: b.doc.ID}
	}
	claimed, err := b.inLine(ctx, l, busy)
	switch {
	case err != nil || !claimed:
		return lease.Holder{}, err
	case len(b.levels) == 1:
		return b.doc.holder(), nil
	}
	return b.from(ctx, 1)
}

// claim books l for a holder waiting at it, if it has room: the level is marked lined and
// read in one write (a release then hands its slots over rather than giving them to the
// counter), and with room the holder's entry is added (book); then the holder leaves the
// line with the level recorded (leaveLine). An entry of the holder there already is a slot
// handed to it (or booked by an earlier try whose answer was lost): the holder takes it the
// same way. Room owed to a waiter of a higher priority (the counter's linedPrio) is handed to
// it (passUp).
//
// count is the level's count as the try saw it, -1 when it did not get that far.
func (b *funnelRun) claim(ctx context.Context, l funnelLevel) (ok bool, count int, err error) {
	s, pid := b.store, b.doc.PID
	c, err := s.markLined(ctx, l, b.prio(), l.resource, b.doc.Tenant)
	if err != nil || c == nil {
		return false, -1, err
	}
	s.sawLined(l.key)
	i := b.index(l.key)
	entry, mine := c.Slots[pid]
	borrowed := entry.Borrowed
	if !mine {
		limit := l.Cap
		if c.Count >= l.Cap {
			// Full: a waiter at its tenant level may still borrow (borrow.go).
			if !b.borrowable(i) || c.Count >= b.borrowLimit(i) {
				return false, c.Count, nil
			}
			room, err := b.globalHasRoom(ctx, i)
			if err != nil || !room {
				return false, c.Count, err
			}
			limit, borrowed = b.borrowLimit(i), true
		}
		got, n, err := s.book(ctx, l, l.resource, b.doc.Tenant, pid, limit, slotDoc{Borrowed: borrowed})
		switch {
		case err != nil:
			// Ambiguous: the entry may be there; the holder is still in line, and its next
			// try finds it.
			return false, -1, err
		case !got:
			return false, n, nil
		}
		if err := s.fault(StepClaimBooked, l.key); err != nil {
			return false, -1, unavailable("claiming "+l.key, err)
		}
		if c.LinedPrio > b.prio() && !borrowed { // a borrowed slot is owed to nobody
			// A waiter of higher priority tried this level lately: the room is its, and goes
			// to it by a hand-over, as a freed slot would.
			if passed, err := b.passUp(ctx, l); passed || err != nil {
				return false, l.Cap, err
			}
		}
	}
	if err := b.leaveLine(ctx, i, borrowed); err != nil {
		return false, -1, err
	}
	if b.doc.State == string(lease.StateWaiting) {
		return false, -1, nil // out of the line already: Resume reads why
	}
	return true, c.Count + 1, nil
}

// markLined marks the counter of l lined (with the holder's priority as a hint) and returns
// it as written; a counter that is gone (reconcile deletes unused ones) is created first.
func (s *Store) markLined(ctx context.Context, l funnelLevel, prio int, resource, tenant string) (*counterDoc, error) {
	mark := bson.D{{Key: "$set", Value: bson.D{{Key: "lined", Value: true}}}}
	if prio > 0 {
		mark = append(mark, bson.E{Key: "$max", Value: bson.D{{Key: "linedPrio", Value: prio}}})
	}
	var c counterDoc
	for attempt := 0; ; attempt++ {
		err := s.counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: l.key}}, mark,
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&c)
		switch {
		case err == nil:
			return &c, nil
		case !errors.Is(err, mongo.ErrNoDocuments):
			return nil, unavailable("reading counter "+l.key, err)
		case attempt > 0:
			return nil, nil
		}
		if err := s.createCounter(ctx, l, resource, tenant); err != nil {
			return nil, err
		}
	}
}

// leaveLine records level i, whose entry the waiting holder has, on the holder and takes it
// out of the line: HELD with a fence at the funnel's last level, PENDING before it. A holder
// no longer in line (a hand-over named it, or it was released) is left as it is and b.doc
// keeps WAITING; one released meanwhile gets its entry at the level given back here, since
// its release may have looked before the entry was written.
func (b *funnelRun) leaveLine(ctx context.Context, i int, borrowed bool) error {
	s, l := b.store, b.levels[i]
	state, fence, err := b.grantOf(ctx, i)
	if err != nil {
		return err // still in line with the entry: the next try takes it
	}
	update := bson.D{
		{Key: "$set", Value: b.stateSet(state, fence)},
		{Key: "$addToSet", Value: bson.D{{Key: "levels", Value: l.key}}},
	}
	update = unsetting(update, "waitKey", "waitCap", "waitExp", "grantState")
	if borrowed {
		update = b.borrowing(update, i)
	}
	inLine := bson.D{{Key: "_id", Value: b.doc.ID}, {Key: "state", Value: string(lease.StateWaiting)}, {Key: "waitKey", Value: l.key}}
	res, err := s.holders.UpdateOne(ctx, inLine, update)
	if err != nil {
		// Ambiguous: the holder may have left the line. Either way it has the entry, and
		// Resume's read finds out which.
		return unavailable("claiming "+l.key, err)
	}
	if res.MatchedCount == 0 {
		if _, err := s.GetHolder(ctx, b.doc.ID); errors.Is(err, lease.ErrLost) {
			return s.giveBack(ctx, []string{l.key}, b.doc.PID, holdSample{}, true)
		}
		return nil
	}
	b.doc.State, b.doc.WaitKey, b.doc.GrantState, b.doc.Fence = string(state), "", "", fence
	b.doc.Levels = append(b.doc.Levels, l.key)
	return nil
}

// passUp hands the entry a claim has just added at l to the first live waiter of l's line of
// a priority above the holder's. passed is false when no such waiter stands (the hint was
// stale): the claim goes on and keeps the slot.
func (b *funnelRun) passUp(ctx context.Context, l funnelLevel) (passed bool, err error) {
	rest, err := b.store.handOverOf(ctx, l.resource, []string{l.key}, b.doc.PID, holdSample{}, nil,
		bson.E{Key: "priority", Value: bson.D{{Key: "$gt", Value: b.prio()}}})
	if err != nil {
		return false, err // still in line with the entry: the next try takes it
	}
	return len(rest) == 0, nil
}

// unsetting adds fields to the $unset of update (creating it).
func unsetting(update bson.D, fields ...string) bson.D {
	for i, e := range update {
		if e.Key == "$unset" {
			d := e.Value.(bson.D)
			for _, f := range fields {
				d = append(d, bson.E{Key: f, Value: ""})
			}
			update[i].Value = d
			return update
		}
	}
	d := bson.D{}
	for _, f := range fields {
		d = append(d, bson.E{Key: f, Value: ""})
	}
	return append(update, bson.E{Key: "$unset", Value: d})
}

// grantState is the state a waiter at key gets when a slot of key is handed to it: HELD at
// the funnel's last level, where the hand-over completes the acquisition, else PENDING. A
// hand-over never completes an acquisition of several resources: it takes a fence per part
// itself (complete).
func (b *funnelRun) grantState(key string) lease.HolderState {
	if b.index(key) == len(b.levels)-1 && !b.multi {
		return lease.StateHeld
	}
	return lease.StatePending
}

// index is the position of key in the funnel, or -1.
func (b *funnelRun) index(key string) int {
	return slices.IndexFunc(b.levels, func(l funnelLevel) bool { return l.key == key })
}

// Resume goes on with a waiting acquisition (req is the request it was queued with,
// Token included): the holder's state decides. Still in line: the entry is renewed
// (WaitTTL) and, with look, the level is tried once (room nobody was handed: a lapsed
// waiter's, a repaired counter's, a raised cap's); the answer is then a *WaitingError again.
// A hand-over named it (grantKey): once the slot's entry is the holder's, the level is booked
// and the funnel goes on from the next level, where it may queue again. granted names the
// key a wake-up said was handed over (the entry moved): then the state is not read first (one
// round trip less for the usual case). ErrNotWaiting: the holder is gone.
func (s *Store) Resume(ctx context.Context, req AcquireRequest, granted string, look bool) (lease.Holder, error) {
	return s.rememberHeld(s.resume(ctx, req, granted, look))
}

func (s *Store) resume(ctx context.Context, req AcquireRequest, granted string, look bool) (lease.Holder, error) {
	if err := validateAcquire(req); err != nil {
		return lease.Holder{}, err
	}
	levels, err := funnelOf(req)
	if err != nil {
		return lease.Holder{}, err
	}
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	b := &funnelRun{store: s, levels: levels, waitTTL: req.WaitTTL, priority: req.Priority, borrow: req.Borrow, multi: len(req.Parts) > 0}
	renew := bson.D{{Key: "waitExp", Value: time.Now().Add(req.WaitTTL)}}
	if req.Priority > 0 { // raised past the age bound, or as it was: its place in the line
		renew = append(renew, bson.E{Key: "priority", Value: req.Priority})
	}
	if granted != "" {
		if i := b.index(granted); i >= 0 {
			if i == len(levels)-1 && !b.multi {
				if h, ok := s.handedHolder(req, levels, granted); ok {
					return h, nil
				}
			}
			// An error here is ambiguous: the read below finds out.
			if h, done, err := b.takeGrant(ctx, req.Token, i); done {
				return h, err
			}
		}
	}
	err = s.holders.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: req.Token}, notReleased},
		bson.D{{Key: "$set", Value: renew},
			{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}}},
		options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&b.doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return lease.Holder{}, ErrNotWaiting
	case err != nil:
		return lease.Holder{}, unavailable("renewing the wait for "+levels[0].resource, err)
	}
	if b.doc.GrantKey != "" {
		i := b.index(b.doc.GrantKey)
		if i < 0 { // the definition changed under the waiter: it starts over
			return lease.Holder{}, ErrNotWaiting
		}
		h, done, err := b.verifyGrant(ctx, i)
		if done || err != nil {
			return h, err
		}
	}
	switch {
	case b.doc.State == string(lease.StateHeld):
		return b.doc.holder(), nil // left the line, its answer lost
	case b.doc.State != string(lease.StateWaiting):
		return lease.Holder{}, ErrNotWaiting
	}
	i := b.index(b.doc.WaitKey)
	if i < 0 { // the definition changed under the waiter: it starts over
		return lease.Holder{}, ErrNotWaiting
	}
	l := b.levels[i]
	waiting := &WaitingError{Busy: l.busy(l.Cap), Token: req.Token}
	if !look {
		return lease.Holder{}, waiting
	}
	ok, count, err := b.claim(ctx, l)
	switch {
	case err != nil:
		return lease.Holder{}, err
	case !ok:
		if count >= 0 {
			waiting.Busy.Count = count
		}
		return lease.Holder{}, waiting
	case i == len(levels)-1 && !b.multi:
		return b.doc.holder(), nil
	}
	return b.from(ctx, i+1)
}

// verifyGrant follows a read of a holder that a hand-over named (grantKey, the funnel's level
// i): the slot is the holder's once the counter's entry is, so the entry is read. There: the
// level is taken (takeGrant). Not there: the hand-over is still moving it, or stopped before
// (its releaser crashed, or found its own entry given back by another): after the longest a
// hand-over can take (the operation timeout and markMargin after it named the holder) the
// holder goes back to its place in the line, and b.doc says so; before, the answer is that it
// waits. done is false when the caller goes on with b.doc as it is (back in line).
func (b *funnelRun) verifyGrant(ctx context.Context, i int) (h lease.Holder, done bool, err error) {
	s, l := b.store, b.levels[i]
	has, err := s.bookedBy(ctx, []string{l.key}, b.doc.PID)
	if err != nil {
		return lease.Holder{}, true, err
	}
	if len(has) == 1 {
		if b.doc.State == string(lease.StateHeld) {
			return b.doc.holder(), true, nil
		}
		h, done, err := b.takeGrant(ctx, b.doc.ID, i)
		if !done && err == nil {
			err = ErrNotWaiting
		}
		return h, true, err
	}
	if b.doc.LastSeenAt.Sub(b.doc.GrantAt) < s.cfg.opTimeout+markMargin {
		return lease.Holder{}, true, &WaitingError{Busy: l.busy(l.Cap), Token: b.doc.ID}
	}
	res, err := s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: b.doc.ID}, {Key: "grantKey", Value: l.key}, {Key: "grantFrom", Value: b.doc.GrantFrom}},
		bson.D{
			{Key: "$rename", Value: bson.D{{Key: "grantKey", Value: "waitKey"}}},
			{Key: "$set", Value: bson.D{{Key: "state", Value: string(lease.StateWaiting)}, {Key: "grantState", Value: string(b.grantState(l.key))},
				{Key: "waitCap", Value: l.Cap}, {Key: "waitExp", Value: time.Now().Add(b.waitTTL)}}},
			{Key: "$unset", Value: bson.D{{Key: "grantFrom", Value: ""}, {Key: "grantAt", Value: ""}, {Key: "fence", Value: ""}}},
		})
	switch {
	case err != nil:
		return lease.Holder{}, true, unavailable("returning to the line of "+l.key, err)
	case res.MatchedCount == 0:
		return lease.Holder{}, true, ErrNotWaiting
	}
	b.doc.State, b.doc.WaitKey, b.doc.GrantKey, b.doc.GrantFrom, b.doc.Fence = string(lease.StateWaiting), l.key, "", "", 0
	return lease.Holder{}, false, nil
}

// takeGrant books the key handed to the holder (the funnel's level i), whose entry there is
// the holder's, and goes on with the funnel. done is false when the holder had no grant of
// that key (the wake-up was stale).
func (b *funnelRun) takeGrant(ctx context.Context, token string, i int) (h lease.Holder, done bool, err error) {
	s, l := b.store, b.levels[i]
	if i == len(b.levels)-1 && !b.multi {
		// The hand-over of a last level made the holder HELD: nothing is left to write.
		var d holderDoc
		err := s.holders.FindOne(ctx, bson.D{{Key: "_id", Value: token}, {Key: "grantKey", Value: l.key}, {Key: "state", Value: string(lease.StateHeld)}}).Decode(&d)
		switch {
		case errors.Is(err, mongo.ErrNoDocuments):
			return lease.Holder{}, false, nil
		case err != nil:
			return lease.Holder{}, false, unavailable("reading the slot handed over on "+l.key, err)
		}
		return d.holder(), true, nil
	}
	update := bson.D{
		{Key: "$set", Value: b.stateSet(lease.StatePending, 0)},
		{Key: "$addToSet", Value: bson.D{{Key: "levels", Value: l.key}}},
		{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}},
	}
	update = unsetting(update, "grantKey", "grantFrom", "grantAt")
	err = s.holders.FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StatePending)}, {Key: "grantKey", Value: l.key}},
		update, options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&b.doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return lease.Holder{}, false, nil
	case err != nil:
		// Ambiguous; the holder has the entry either way, and a Resume that reads the state
		// finds out which.
		return lease.Holder{}, false, unavailable("taking the slot handed over on "+l.key, err)
	}
	h, err = b.from(ctx, i+1)
	return h, true, err
}

// Withdraw takes a waiting acquisition out of the line for good (its deadline came, its
// caller left): the holder is released whatever its state, and every slot it booked (its
// narrower levels, a slot handed to it meanwhile) is given back, to the next waiter first.
// It runs to its end whatever ctx, within the store's operation timeout.
func (s *Store) Withdraw(ctx context.Context, token string) error {
	_, _, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: token}}, nil)
	return err
}

// booked lists the counter keys the holder's document says it books: its levels, and a slot
// handed to it that it has not taken yet.
func (d holderDoc) booked() []string {
	if d.GrantKey == "" || slices.Contains(d.Levels, d.GrantKey) {
		return d.Levels
	}
	return append(slices.Clip(d.Levels), d.GrantKey)
}

// InLine is one waiting holder of a level's line.
type InLine struct {
	// ID is the waiting holder's public ID.
	ID  string
	Pod lease.PodRef
	// QueuedAt is the server's time it first waited: its place.
	QueuedAt time.Time
	// Priority orders it before the waiters of lower priorities.
	Priority int
	// Lapsed: its process has not renewed it within its WaitTTL; hand-overs pass it over.
	Lapsed bool
}

// Line lists the waiters of counter key ("" for every key) in the order of the hand-overs:
// highest priority first, oldest first within a priority.
func (s *Store) Line(ctx context.Context, key string) ([]InLine, error) {
	filter := bson.D{{Key: "state", Value: string(lease.StateWaiting)}}
	if key != "" {
		filter = append(filter, bson.E{Key: "waitKey", Value: key})
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cur, err := s.holders.Find(ctx, filter, options.Find().SetSort(lineOrder))
	if err != nil {
		return nil, unavailable("reading the line of "+key, err)
	}
	var docs []holderDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("reading the line of "+key, err)
	}
	now := time.Now()
	out := make([]InLine, len(docs))
	for i, d := range docs {
		h := d.holder()
		out[i] = InLine{ID: h.ID, Pod: h.Pod, QueuedAt: d.QueuedAt, Priority: d.Priority, Lapsed: !d.WaitExp.After(now)}
	}
	return out, nil
}

// maxLined bounds the counter keys a store remembers as lined.
const maxLined = 1024

// handedHolders keeps, by public ID, the waiters of this store whose acquisition a hand-over
// completed (HELD at their last level): the whole holder when this store handed it over, what
// the event said when another did. The waiter, woken, answers from it without a store call.
// An entry goes when the waiter takes it or its holder is released; when maxHanded are kept,
// entries older than a minute are dropped first, and a waiter not found here reads its holder.
type handedHolders struct {
	mu   sync.Mutex
	docs map[string]handedHolder
}

type handedHolder struct {
	doc holderDoc
	at  time.Time
}

const maxHanded = 4096

func (s *Store) keepHanded(d holderDoc) {
	h := &s.handed
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.docs == nil {
		h.docs = map[string]handedHolder{}
	}
	now := time.Now()
	if len(h.docs) >= maxHanded {
		for id, e := range h.docs {
			if now.Sub(e.at) > time.Minute {
				delete(h.docs, id)
			}
		}
	}
	if len(h.docs) < maxHanded {
		pid := d.PID
		if d.ID != "" {
			pid = lease.HolderID(d.ID)
		}
		h.docs[pid] = handedHolder{doc: d, at: now}
	}
}

// takeHanded returns and forgets what is kept for the waiter with public ID pid.
func (s *Store) takeHanded(pid string) (holderDoc, bool) {
	h := &s.handed
	h.mu.Lock()
	defer h.mu.Unlock()
	e, ok := h.docs[pid]
	delete(h.docs, pid)
	return e.doc, ok
}

// handedHolder is the answer of a waiter whose last level, key, was handed to it, from what
// this store kept of the hand-over: the holder as the hand-over wrote it, or, when another
// process's event told it, the holder as the request describes it (its times unknown).
func (s *Store) handedHolder(req AcquireRequest, levels []funnelLevel, key string) (lease.Holder, bool) {
	d, ok := s.takeHanded(lease.HolderID(req.Token))
	if !ok || d.GrantKey != key {
		return lease.Holder{}, false
	}
	if d.ID != "" {
		return d.holder(), true
	}
	keys := make([]string, len(levels))
	for i, l := range levels {
		keys[i] = l.key
	}
	return lease.Holder{
		Token: req.Token, ID: lease.HolderID(req.Token), State: lease.StateHeld,
		LeaseName: req.LeaseName, Resource: req.Resource, Type: req.Type,
		Tenant: req.Tenant, Project: req.Project, User: req.User, HolderRef: req.HolderRef,
		Pod: req.Pod, PodBound: req.PodBound, Payload: req.Payload, TTL: req.TTL, Levels: keys,
		Fence: d.Fence,
	}, true
}
