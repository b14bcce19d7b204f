package leasestore

import (
	"context"
	"errors"
	"fmt"
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
// revocation, a waiter giving up) hands it to the oldest live waiter of that key instead of
// decrementing the counter (giveBack): the count stays, the waiter's holder books the slot
// (grantKey), and its process is woken by the waiter's holder ID. There is no second record
// of the line that could drift from it: the waiting holders are the line, and the counter
// that stays at its cap while they wait is the barrier that keeps newcomers behind them.

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
	// The increment of l was refused, so the holder stops naming it (IncKey).
	res, err := s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StatePending)}},
		bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: bson.D{{Key: "incKey", Value: ""}}}, {Key: "$currentDate", Value: dates}})
	switch {
	case err != nil:
		return false, s.abandon(ctx, token, nil, unavailable("queueing for "+l.key, err))
	case res.MatchedCount == 0:
		return false, unavailable("queueing for "+l.key, fmt.Errorf("holder %s was reaped while booking", lease.HolderID(token)))
	}
	if err := s.fault(StepQueued, l.key); err != nil {
		return false, s.abandon(ctx, token, nil, unavailable("queueing for "+l.key, err))
	}
	b.doc.State, b.doc.WaitKey, b.doc.WaitCap, b.doc.IncKey = string(lease.StateWaiting), l.key, l.Cap, ""
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
		return lease.Holder{}, s.abandon(ctx, b.doc.ID, nil, unavailable("queueing for "+l.key, err))
	}
	busy := &lease.BusyError{Resource: b.doc.Resource, Level: l.Level, Scope: l.scope, Count: l.Cap, Cap: l.Cap}
	claimed, err := b.inLine(ctx, l, busy)
	switch {
	case err != nil || !claimed:
		return lease.Holder{}, err
	case len(b.levels) == 1:
		return b.doc.holder(), nil
	}
	return b.from(ctx, 1)
}

// claim takes a free slot of l for a holder waiting at it: the level is marked lined and
// read, and only with room does the holder name l as the counter it increments (IncKey), then
// comes the conditional increment, then the holder leaves the line with the key booked (HELD if
// l is its last level). A holder that left the line meanwhile (a slot was handed to it, or it
// was reaped) counts the slot it just took nowhere: Heal frees it.
//
// count is the level's count as the try saw it, -1 when it did not get that far.
func (b *funnelRun) claim(ctx context.Context, l funnelLevel) (ok bool, count int, err error) {
	s, token := b.store, b.doc.ID
	// Mark the level lined (giveBack then hands its slots over) and see whether it has room.
	// A counter that is gone (reconcile deletes an unused one) is created again: a waiter
	// that queued without an increment of its own (queue) must still find room.
	var c counterDoc
	mark := bson.D{{Key: "$set", Value: bson.D{{Key: "lined", Value: true}}}}
	if p := b.prio(); p > 0 {
		mark = append(mark, bson.E{Key: "$max", Value: bson.D{{Key: "linedPrio", Value: p}}})
	}
	for attempt := 0; ; attempt++ {
		err = s.counters.FindOneAndUpdate(ctx, bson.D{{Key: "_id", Value: l.key}}, mark,
			options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&c)
		if !errors.Is(err, mongo.ErrNoDocuments) || attempt > 0 {
			break
		}
		if err := s.createCounter(ctx, l, b.doc.Resource, b.doc.Tenant); err != nil {
			return false, -1, err
		}
	}
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return false, -1, nil
	case err != nil:
		return false, -1, unavailable("reading counter "+l.key, err)
	}
	s.sawLined(l.key)
	i, limit, borrowed := b.index(l.key), l.Cap, false
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
	inLine := bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StateWaiting)}, {Key: "waitKey", Value: l.key}}
	res, err := s.holders.UpdateOne(ctx, inLine, bson.D{{Key: "$set", Value: bson.D{{Key: "incKey", Value: l.key}}}})
	switch {
	case err != nil:
		return false, -1, unavailable("claiming "+l.key, err)
	case res.MatchedCount == 0:
		return false, -1, nil // out of the line already: Resume reads why
	}
	res, err = s.counters.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: l.key}, {Key: "count", Value: bson.D{{Key: "$lt", Value: limit}}}}, countBy(1))
	if err != nil {
		return false, -1, unavailable("incrementing "+l.key, err) // IncKey stays: Heal counts the slot as maybe taken
	}
	if res.MatchedCount == 0 {
		_, err := s.holders.UpdateOne(ctx, bson.D{{Key: "_id", Value: token}, {Key: "incKey", Value: l.key}},
			bson.D{{Key: "$unset", Value: bson.D{{Key: "incKey", Value: ""}}}})
		if err != nil {
			return false, -1, unavailable("claiming "+l.key, err)
		}
		return false, l.Cap, nil
	}
	if err := s.fault(StepClaimIncremented, l.key); err != nil {
		return false, -1, unavailable("claiming "+l.key, err)
	}
	if c.LinedPrio > b.prio() && !borrowed { // a borrowed slot is owed to nobody
		// A waiter of higher priority tried this level lately: the room is its, and goes
		// to it by a hand-over, as a freed slot would.
		if passed, err := b.passUp(ctx, l); passed || err != nil {
			return false, l.Cap, err
		}
	}
	state, fence := lease.StatePending, int64(0)
	if i == len(b.levels)-1 {
		state = lease.StateHeld
		if fence, err = s.takeFences(ctx, b.doc.Resource, 1, holdSample{}); err != nil {
			return false, -1, err // IncKey stays: Heal counts the slot as maybe taken
		}
	}
	update := append(b.booking(i, state, fence), bson.E{Key: "$push", Value: bson.D{{Key: "levels", Value: l.key}}})
	update = unsetting(update, "waitKey", "waitCap", "waitExp", "grantState")
	if borrowed {
		update = b.borrowing(update, i)
	}
	res, err = s.holders.UpdateOne(ctx, inLine, update)
	if err != nil {
		// Ambiguous: the holder may have left the line with the key. Either way it counts
		// the slot (levels or IncKey), and Resume's read finds out which.
		return false, -1, unavailable("claiming "+l.key, err)
	}
	if res.MatchedCount == 0 {
		s.undoClaim(ctx, token, l.key)
		return false, -1, nil
	}
	b.doc.State, b.doc.WaitKey, b.doc.GrantState, b.doc.Fence = string(state), "", "", fence
	b.doc.Levels = append(b.doc.Levels, l.key)
	return true, c.Count + 1, nil
}

// passUp hands the slot a claim has just incremented (the holder names it in IncKey) to the
// first live waiter of l's line of a priority above the holder's, and then drops the
// holder's IncKey. passed is false when no such waiter stands (the hint was stale): the
// claim goes on and books the slot itself.
func (b *funnelRun) passUp(ctx context.Context, l funnelLevel) (passed bool, err error) {
	s := b.store
	rest, err := s.handOverOf(ctx, b.doc.Resource, []string{l.key}, holdSample{},
		bson.E{Key: "priority", Value: bson.D{{Key: "$gt", Value: b.prio()}}})
	switch {
	case err != nil:
		return false, err // IncKey stays: Heal counts the slot as maybe taken
	case len(rest) > 0:
		return false, nil
	}
	if _, err := s.holders.UpdateOne(ctx, bson.D{{Key: "_id", Value: b.doc.ID}, {Key: "incKey", Value: l.key}},
		bson.D{{Key: "$unset", Value: bson.D{{Key: "incKey", Value: ""}}}}); err != nil {
		return true, unavailable("claiming "+l.key, err) // IncKey stays: Heal counts it
	}
	return true, nil
}

// undoClaim follows a claim whose increment of key applied but whose holder had left the
// line meanwhile. Handed a slot of key at the same time (grantKey), the holder now has two
// and its document counts one: it drops its intent and gives its own increment back. Reaped
// or withdrawn, it counts none: Heal frees the increment.
func (s *Store) undoClaim(ctx context.Context, token, key string) {
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	res, err := s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "grantKey", Value: key}, {Key: "incKey", Value: key}, notReleased},
		bson.D{{Key: "$unset", Value: bson.D{{Key: "incKey", Value: ""}}}})
	if err == nil && res.MatchedCount == 1 {
		if s.giveBack(ctx, []string{key}, holdSample{}) == nil {
			return
		}
	}
	s.healAfter(ctx, key)
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
// the funnel's last level, where the hand-over completes the acquisition, else PENDING.
func (b *funnelRun) grantState(key string) lease.HolderState {
	if b.index(key) == len(b.levels)-1 {
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
// waiter's, a healed counter's, a raised cap's); the answer is then a *WaitingError again. A
// slot was handed to it (grantKey): the key is booked and the funnel goes on from the next
// level, where it may queue again. granted names the key a wake-up said was handed over: then
// the state is not read first (one round trip less for the usual case). ErrNotWaiting: the
// holder is gone.
func (s *Store) Resume(ctx context.Context, req AcquireRequest, granted string, look bool) (lease.Holder, error) {
	if err := validateAcquire(req); err != nil {
		return lease.Holder{}, err
	}
	levels, err := funnel(req.Resource, req.Caps, req.Tenant, req.Project, req.User)
	if err != nil {
		return lease.Holder{}, err
	}
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	b := &funnelRun{store: s, levels: levels, waitTTL: req.WaitTTL, priority: req.Priority, borrow: req.Borrow}
	renew := bson.D{{Key: "waitExp", Value: time.Now().Add(req.WaitTTL)}}
	if req.Priority > 0 { // raised past the age bound, or as it was: its place in the line
		renew = append(renew, bson.E{Key: "priority", Value: req.Priority})
	}
	if granted != "" {
		if i := b.index(granted); i >= 0 {
			if i == len(levels)-1 {
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
		return lease.Holder{}, unavailable("renewing the wait for "+req.Resource, err)
	}
	switch {
	case b.doc.GrantKey != "" && b.doc.State == string(lease.StateHeld):
		return b.doc.holder(), nil // handed its last level
	case b.doc.GrantKey != "":
		if i := b.index(b.doc.GrantKey); i >= 0 {
			h, done, err := b.takeGrant(ctx, req.Token, i)
			if done || err != nil {
				return h, err
			}
		}
		return lease.Holder{}, ErrNotWaiting
	case b.doc.State == string(lease.StateHeld):
		return b.doc.holder(), nil
	case b.doc.State != string(lease.StateWaiting):
		return lease.Holder{}, ErrNotWaiting
	}
	i := b.index(b.doc.WaitKey)
	if i < 0 { // the definition changed under the waiter: it starts over
		return lease.Holder{}, ErrNotWaiting
	}
	l := b.levels[i]
	waiting := &WaitingError{Busy: &lease.BusyError{Resource: req.Resource, Level: l.Level, Scope: l.scope, Count: l.Cap, Cap: l.Cap}, Token: req.Token}
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
	case i == len(levels)-1:
		return b.doc.holder(), nil
	}
	return b.from(ctx, i+1)
}

// takeGrant books the key handed to the holder (the funnel's level i) and goes on with the
// funnel. done is false when the holder had no grant of that key (the wake-up was stale).
func (b *funnelRun) takeGrant(ctx context.Context, token string, i int) (h lease.Holder, done bool, err error) {
	s, l := b.store, b.levels[i]
	if i == len(b.levels)-1 {
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
	// Not the last level (that one's hand-over made the holder HELD, above): no grant yet.
	update := append(b.booking(i, lease.StatePending, 0), bson.E{Key: "$push", Value: bson.D{{Key: "levels", Value: l.key}}},
		bson.E{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}})
	update = unsetting(update, "grantKey")
	err = s.holders.FindOneAndUpdate(ctx,
		bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StatePending)}, {Key: "grantKey", Value: l.key}},
		update, options.FindOneAndUpdate().SetReturnDocument(options.After)).Decode(&b.doc)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return lease.Holder{}, false, nil
	case err != nil:
		// Ambiguous; the holder books the key either way (grantKey or levels), and a
		// Resume that reads the state finds out which.
		return lease.Holder{}, false, unavailable("taking the slot handed over on "+l.key, err)
	}
	h, err = b.from(ctx, i+1)
	return h, true, err
}

// Withdraw takes a waiting acquisition out of the line for good (its deadline came, its
// caller left): the holder is deleted whatever its state, and every slot it booked (its
// narrower levels, a slot handed to it meanwhile) is given back, to the next waiter first.
// It runs to its end whatever ctx, within the store's operation timeout.
func (s *Store) Withdraw(ctx context.Context, token string) error {
	_, _, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: token}}, nil, "")
	return err
}

// booked lists the counter keys the holder books: its levels, and a slot handed to it that
// it has not taken yet.
func (d holderDoc) booked() []string {
	if d.GrantKey == "" || slices.Contains(d.Levels, d.GrantKey) {
		return d.Levels
	}
	return append(slices.Clip(d.Levels), d.GrantKey)
}

// giveBack returns one slot of each key: to the oldest live waiter of that key if there is
// one (the counter keeps its count; the waiter's holder books the slot as grantKey and its
// process is woken), else to the counter (decrement).
//
// A counter with waiters carries the flag lined (set by every waiter when it tries the
// level, cleared by a give-back that finds no live waiter). The flag is only a hint of where
// to look first: a key this store saw lined in the last second is handed over first (one
// round trip when a waiter takes it); any other key is decremented first, on the condition
// that it is not lined, so that a release where nobody waits costs what it did without a line
// (the decrements, sent together: decrementCold). A key that condition kept is handed over
// after all. A
// wrong hint costs a round trip, never a slot: a flag cleared while a waiter had just set it is
// set again at that waiter's next look, and until then the slot goes to the counter, where the
// waiter's look takes it.
func (s *Store) giveBack(ctx context.Context, keys []string, hold holdSample) error {
	if len(keys) == 0 {
		return nil
	}
	var hot, cold []string
	for _, k := range keys {
		if s.linedRecently(k) {
			hot = append(hot, k)
		} else {
			cold = append(cold, k)
		}
	}
	var left []string
	if len(hot) > 0 {
		rest, err := s.handOver(ctx, hot, hold)
		if err != nil {
			return err
		}
		left = rest
	}
	if len(cold) > 0 {
		kept, err := s.decrementCold(ctx, cold)
		if err != nil {
			return err
		}
		if err := s.fault(StepColdDecremented, cold[0]); err != nil {
			return unavailable(fmt.Sprintf("decrementing %v", cold), err)
		}
		for _, k := range kept {
			s.sawLined(k)
		}
		rest, err := s.handOver(ctx, kept, hold)
		if err != nil {
			return err
		}
		left = append(left, rest...)
	}
	return s.decrementUnlined(ctx, left)
}

// decrementCold decrements each of keys on the condition that it is not lined, and returns
// those the condition kept (lined: a waiter is handed their slot). One command per key, sent
// together: one decrement of all keys would not say which it kept, and the lined flags read
// afterwards cannot tell either, since other processes change them in between (a flag set at
// the decrement may have been cleared since, one clear then set since), so a hand-over by
// them could give a slot twice, above its cap, or not at all (TestPartialDecrement...).
func (s *Store) decrementCold(ctx context.Context, keys []string) (kept []string, err error) {
	decrement := func(k string) (bool, error) {
		res, err := s.counters.UpdateOne(ctx, bson.D{
			{Key: "_id", Value: k},
			{Key: "count", Value: bson.D{{Key: "$gt", Value: 0}}},
			{Key: "lined", Value: bson.D{{Key: "$ne", Value: true}}},
		}, countBy(-1))
		if err != nil {
			return false, unavailable("decrementing "+k, err)
		}
		return res.MatchedCount == 1, nil
	}
	if len(keys) == 1 {
		ok, err := decrement(keys[0])
		if err != nil || ok {
			return nil, err
		}
		return keys, nil
	}
	done := make([]bool, len(keys))
	errs := make([]error, len(keys))
	var wg sync.WaitGroup
	for i, k := range keys {
		wg.Go(func() { done[i], errs[i] = decrement(k) })
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		// What was decremented stays so; the rest is healed (the caller's error path).
		return nil, err
	}
	for i, k := range keys {
		if !done[i] {
			kept = append(kept, k)
		}
	}
	return kept, nil
}

// handOver hands one slot of each key to its oldest live waiter and returns the keys that
// had none: one round trip per slot handed over and one that finds nobody, after one that
// takes the fences of the grants (fence.go).
func (s *Store) handOver(ctx context.Context, keys []string, hold holdSample) ([]string, error) {
	var rest []string
	for resource, keys := range byResource(keys) {
		r, err := s.handOverOf(ctx, resource, keys, hold)
		if err != nil {
			return nil, err
		}
		rest = append(rest, r...)
	}
	return rest, nil
}

// handOverOf is handOver of keys of one resource.
//
// more narrows the waiters it may hand to (passUp: those of a higher priority).
func (s *Store) handOverOf(ctx context.Context, resource string, keys []string, hold holdSample, more ...bson.E) ([]string, error) {
	return s.handOverMarked(ctx, resource, keys, hold, nil, more...)
}

// handOverMarked is handOverOf that also sets mark on the waiter it hands to (a borrowed
// slot's borrowKey and borrowCap: borrow.go).
func (s *Store) handOverMarked(ctx context.Context, resource string, keys []string, hold holdSample, mark bson.D, more ...bson.E) ([]string, error) {
	rest := slices.Clone(keys)
	var grants []Grant
	var origins []string
	defer func() { s.granted(grants, origins) }()
	// The fences are taken while this release still holds the slots; a hand-over that
	// completes a waiter's acquisition records the next one, another leaves a gap.
	fence, err := s.takeFences(ctx, resource, len(rest), hold)
	if err != nil {
		return nil, err // the slots of rest stay booked by their counters until healed (Heal)
	}
	for ; len(rest) > 0; fence++ {
		var d holderDoc
		err := s.holders.FindOneAndUpdate(ctx,
			append(bson.D{
				{Key: "state", Value: string(lease.StateWaiting)},
				{Key: "waitKey", Value: bson.D{{Key: "$in", Value: rest}}},
				{Key: "waitExp", Value: bson.D{{Key: "$gt", Value: time.Now()}}},
				{Key: "grantState", Value: bson.D{{Key: "$exists", Value: true}}},
			}, more...),
			bson.D{
				// The waiter's state becomes the one it asked for when it queued: HELD
				// at its last level, whose acquisition this write completes.
				{Key: "$rename", Value: bson.D{{Key: "waitKey", Value: "grantKey"}, {Key: "grantState", Value: "state"}}},
				{Key: "$set", Value: append(bson.D{{Key: "fence", Value: fence}}, mark...)},
				{Key: "$unset", Value: bson.D{{Key: "waitExp", Value: ""}, {Key: "waitCap", Value: ""}}},
				{Key: "$currentDate", Value: bson.D{{Key: "lastSeenAt", Value: true}}},
			},
			options.FindOneAndUpdate().
				SetSort(lineOrder).
				SetReturnDocument(options.After)).Decode(&d)
		if errors.Is(err, mongo.ErrNoDocuments) {
			return rest, nil
		}
		if err != nil {
			// The slots of rest stay booked by their counters until healed (Heal).
			return nil, unavailable(fmt.Sprintf("handing over %v", rest), err)
		}
		held := d.State == string(lease.StateHeld)
		if held && d.Origin == s.origin {
			s.keepHanded(d)
		}
		g := Grant{ID: d.PID, Key: d.GrantKey, Held: held, To: d.Origin}
		if held {
			g.Fence = d.Fence
		}
		grants = append(grants, g)
		origins = append(origins, d.Origin)
		s.sawLined(d.GrantKey)
		rest = slices.DeleteFunc(rest, func(k string) bool { return k == d.GrantKey })
		if err := s.fault(StepHandedOver, d.GrantKey); err != nil {
			return nil, unavailable("handing over "+d.GrantKey, err)
		}
	}
	return nil, nil
}

// lineOrder is the order of a line: highest priority first (a missing priority sorts after
// every number, and is 0), then oldest place, then _id. With no priority written it is the
// order of before priorities: queuedAt, _id.
var lineOrder = bson.D{{Key: "priority", Value: -1}, {Key: "queuedAt", Value: 1}, {Key: "_id", Value: 1}}

// decrementUnlined returns one slot of each key, which has no live waiter, to its counter and
// clears the counter's lined flag (and its priority hint), in one round trip.
func (s *Store) decrementUnlined(ctx context.Context, keys []string) error {
	if len(keys) == 0 {
		return nil
	}
	_, err := s.counters.UpdateMany(ctx,
		bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}, {Key: "count", Value: bson.D{{Key: "$gt", Value: 0}}}},
		countBy(-1, bson.E{Key: "$set", Value: bson.D{{Key: "lined", Value: false}}},
			bson.E{Key: "$unset", Value: bson.D{{Key: "linedPrio", Value: ""}}}))
	if err != nil {
		return unavailable(fmt.Sprintf("decrementing %v", keys), err)
	}
	return nil
}

// linedHint is how long this store hands a key over first after it saw the key lined.
const linedHint = time.Second

func (s *Store) sawLined(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.lined == nil || len(s.lined) >= maxLined {
		s.lined = map[string]time.Time{}
	}
	s.lined[key] = time.Now()
}

func (s *Store) linedRecently(key string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	at, ok := s.lined[key]
	return ok && time.Since(at) < linedHint
}

// Heal compares one counter with the holders that count its slots and corrects it at once,
// without waiting for the scheduled reconcile. Every slot of a counter is counted by a holder
// document from before its increment (IncKey, written first) until after it is given back (the
// release mark, deleted last), so:
//
//   - a count above the holders that book the key, are handed it, are about to increment it or
//     are being released is a slot nobody will ever give back (a crash, a write whose
//     answer was lost): it is lowered to that number;
//   - a count below the holders that surely book it (recorded in levels or handed over, not
//     being released) is raised to that number (never unsafe).
//
// Both writes are a compare-and-set on the counter's rev as it was read before the holders:
// a count that moved in between makes it miss. It costs two reads, three when it corrects
// (a second count before lowering, one of those who surely book before raising); callers
// rate-limit it per key (a level that refuses). It returns how many slots it freed.
func (s *Store) Heal(ctx context.Context, key string) (int, error) {
	ctx, cancel := s.bound(ctx)
	defer cancel()
	var c counterDoc
	err := s.counters.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&c)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, nil
	case err != nil:
		return 0, unavailable("reading counter "+key, err)
	}
	maybe, err := s.mayBook(ctx, key)
	if err != nil {
		return 0, err
	}
	if c.Count > maybe {
		// A count is no snapshot: a slot moving while it runs (handed from one holder to
		// another, or from grantKey to levels) can be missed. Lowering takes the larger of two
		// counts, so a slot is lowered away only if both miss it.
		again, err := s.mayBook(ctx, key)
		if err != nil {
			return 0, err
		}
		maybe = max(maybe, again)
	}
	want := maybe
	if c.Count <= want {
		sure, err := s.holders.CountDocuments(ctx, bson.D{
			{Key: "$or", Value: bson.A{bson.D{{Key: "levels", Value: key}}, bson.D{{Key: "grantKey", Value: key}}}},
			notReleased,
		})
		if err != nil {
			return 0, unavailable("counting the holders of "+key, err)
		}
		if c.Count >= int(sure) {
			return 0, nil
		}
		want = int(sure)
	}
	cas := bson.D{{Key: "_id", Value: key}, {Key: "count", Value: c.Count}, {Key: "updatedAt", Value: c.UpdatedAt}}
	if c.Rev != 0 {
		cas = append(cas, bson.E{Key: "rev", Value: c.Rev})
	} else { // a counter written before revisions, or not since its creation
		cas = append(cas, bson.E{Key: "rev", Value: bson.D{{Key: "$in", Value: bson.A{nil, 0}}}})
	}
	res, err := s.counters.UpdateOne(ctx, cas, bson.D{
		{Key: "$set", Value: bson.D{{Key: "count", Value: want}}},
		{Key: "$inc", Value: bson.D{{Key: "rev", Value: 1}}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	})
	switch {
	case err != nil:
		return 0, unavailable("healing counter "+key, err)
	case res.MatchedCount == 0 || want > c.Count:
		return 0, nil
	}
	return c.Count - want, nil
}

// mayBook counts the holders that book key, are handed it, are about to increment it or are
// being released: an upper bound of the slots the counter holds for someone.
func (s *Store) mayBook(ctx context.Context, key string) (int, error) {
	n, err := s.holders.CountDocuments(ctx, bson.D{{Key: "$or", Value: bson.A{
		bson.D{{Key: "levels", Value: key}}, bson.D{{Key: "grantKey", Value: key}}, bson.D{{Key: "incKey", Value: key}},
	}}})
	if err != nil {
		return 0, unavailable("counting the holders of "+key, err)
	}
	return int(n), nil
}

// healAfter runs Heal on key for a path that has just left a slot there that no holder
// counts (a holder released under its increment). It is best effort: a Heal that fails or
// misses is repeated by the next refusal of that level.
func (s *Store) healAfter(ctx context.Context, key string) {
	_, _ = s.Heal(context.WithoutCancel(ctx), key)
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
