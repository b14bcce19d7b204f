package leasestore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// funnelLevel is one capped level with its counter key.
type funnelLevel struct {
	lease.LevelCap
	key   string
	scope string
	// resource is the level's resource; lease the part's lease name in an acquisition of
	// several resources ("" for one of a single resource).
	resource string
	lease    string
}

// busy is the diagnosis of l found full with count in use.
func (l funnelLevel) busy(count int) *lease.BusyError {
	return &lease.BusyError{Lease: l.lease, Resource: l.resource, Level: l.Level, Scope: l.scope, Count: count, Cap: l.Cap}
}

// funnelOf is the funnel of an acquisition: the capped levels of its resource narrow to wide,
// or for one of several resources (Parts) the funnels of its parts one after another, in the
// order of their resources. Every acquisition, of one resource or several, books its slots
// in that order, and a waiter holds only slots that come before the one it waits for: no two
// waiters can each hold what the other waits for (docs/waiting.md, "Several resources at
// once").
func funnelOf(req AcquireRequest) ([]funnelLevel, error) {
	if len(req.Parts) == 0 {
		return funnel(req.Resource, req.Caps, req.Tenant, req.Project, req.User)
	}
	var out []funnelLevel
	for _, p := range sortedParts(req.Parts) {
		levels, err := funnel(p.Resource, p.Caps, req.Tenant, req.Project, req.User)
		if err != nil {
			return nil, err
		}
		for i := range levels {
			levels[i].lease = p.LeaseName
		}
		out = append(out, levels...)
	}
	return out, nil
}

// sortedParts are parts in the order they are booked: the order of their resources.
func sortedParts(parts []Part) []Part {
	out := slices.Clone(parts)
	if !inRequestOrder {
		slices.SortFunc(out, func(a, b Part) int { return strings.Compare(a.Resource, b.Resource) })
	}
	return out
}

// inRequestOrder books the parts in the order requested: a test hook (BookPartsInRequestOrder)
// that shows what the order of resources prevents.
var inRequestOrder bool

// funnel orders the capped levels narrow to wide and names their counters.
func funnel(resource string, caps []lease.LevelCap, tenant, project, user string) ([]funnelLevel, error) {
	rank := map[lease.Level]int{lease.LevelUser: 0, lease.LevelProject: 1, lease.LevelTenant: 2, lease.LevelGlobal: 3}
	seen := map[lease.Level]bool{}
	out := make([]funnelLevel, 0, len(caps))
	for _, c := range caps {
		if _, ok := rank[c.Level]; !ok {
			return nil, fmt.Errorf("%w: unknown level %q", lease.ErrInvalid, c.Level)
		}
		if c.Cap < 1 {
			return nil, fmt.Errorf("%w: cap of level %s is %d, must be at least 1", lease.ErrInvalid, c.Level, c.Cap)
		}
		if seen[c.Level] {
			return nil, fmt.Errorf("%w: level %s given twice", lease.ErrInvalid, c.Level)
		}
		seen[c.Level] = true
		scope := lease.ScopeOf(c.Level, tenant, project, user)
		out = append(out, funnelLevel{LevelCap: c, key: lease.CounterKey(resource, c.Level, scope), scope: scope, resource: resource})
	}
	sort.Slice(out, func(i, j int) bool { return rank[out[i].Level] < rank[out[j].Level] })
	return out, nil
}

func validateAcquire(req AcquireRequest) error {
	if len(req.Parts) > 0 {
		return validateParts(req)
	}
	switch {
	case req.Resource == "":
		return fmt.Errorf("%w: resource is empty", lease.ErrInvalid)
	case len(req.Caps) == 0:
		return fmt.Errorf("%w: no capped level (a NOOP lease needs no store)", lease.ErrInvalid)
	case req.TTL <= 0:
		return fmt.Errorf("%w: ttl must be positive", lease.ErrInvalid)
	case req.Tenant == "":
		return fmt.Errorf("%w: tenant is empty", lease.ErrInvalid)
	}
	return validateScopes(req, req.Caps)
}

func validateScopes(req AcquireRequest, caps []lease.LevelCap) error {
	for _, c := range caps {
		if c.Level == lease.LevelUser && req.User == "" {
			return fmt.Errorf("%w: the user level is capped but user is empty", lease.ErrInvalid)
		}
		if c.Level == lease.LevelProject && req.Project == "" {
			return fmt.Errorf("%w: the project level is capped but project is empty", lease.ErrInvalid)
		}
	}
	return nil
}

// validateParts checks an acquisition of several resources: at most MaxParts, each with a
// resource of its own and a capped level, and no borrowing (docs/borrowing.md).
func validateParts(req AcquireRequest) error {
	switch {
	case len(req.Parts) > MaxParts:
		return fmt.Errorf("%w: %d parts, at most %d", lease.ErrInvalid, len(req.Parts), MaxParts)
	case req.Borrow != nil:
		return fmt.Errorf("%w: an acquisition of several resources does not borrow", lease.ErrInvalid)
	case req.TTL <= 0:
		return fmt.Errorf("%w: ttl must be positive", lease.ErrInvalid)
	case req.Tenant == "":
		return fmt.Errorf("%w: tenant is empty", lease.ErrInvalid)
	}
	seen := map[string]string{}
	for _, p := range req.Parts {
		switch {
		case p.Resource == "":
			return fmt.Errorf("%w: part %s: resource is empty", lease.ErrInvalid, p.LeaseName)
		case len(p.Caps) == 0:
			return fmt.Errorf("%w: part %s: no capped level", lease.ErrInvalid, p.LeaseName)
		case seen[p.Resource] != "":
			return fmt.Errorf("%w: parts %s and %s book the same resource %s", lease.ErrInvalid, seen[p.Resource], p.LeaseName, p.Resource)
		}
		seen[p.Resource] = p.LeaseName
		if err := validateScopes(req, p.Caps); err != nil {
			return err
		}
	}
	return nil
}

// Acquire makes one attempt to book a slot at every capped level of the request, narrow to
// wide (docs/design.md): the holder is written first (PENDING, naming every counter of its
// funnel), then per level its entry is added to the counter by a conditional update
// (slots.go) and the level recorded on the holder; the last record also makes the holder
// HELD with its fence. A store error rolls the attempt back. A full level rolls it back too
// and returns a *lease.BusyError, unless the request may wait (WaitTTL): then the holder
// waits in that level's line, keeping the narrower levels it booked, and Acquire returns a
// *WaitingError (wait.go). Once started, an attempt is not cut short by the caller's
// cancellation or deadline, only by the store's operation timeout: a write cut mid-flight
// may still apply, and the rollback gives back whatever it booked.
func (s *Store) Acquire(ctx context.Context, req AcquireRequest) (lease.Holder, error) {
	return s.rememberHeld(s.acquire(ctx, req))
}

func (s *Store) acquire(ctx context.Context, req AcquireRequest) (lease.Holder, error) {
	if err := validateAcquire(req); err != nil {
		return lease.Holder{}, err
	}
	levels, err := funnelOf(req)
	if err != nil {
		return lease.Holder{}, err
	}
	token := req.Token
	if token == "" {
		if token, err = NewToken(); err != nil {
			return lease.Holder{}, err
		}
	}
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()

	f := funnelRun{store: s, doc: newHolderDoc(token, req, levels), levels: levels, waitTTL: req.WaitTTL, priority: req.Priority, borrow: req.Borrow, multi: len(req.Parts) > 0}
	// While the first level has a line, a newcomer that may wait joins it at once: its
	// booking would be refused (the level stays full while anyone waits), and the write that
	// queues it would follow.
	queue := req.WaitTTL > 0 && s.linedRecently(levels[0].key)
	if queue {
		f.doc.State = string(lease.StateWaiting)
		f.doc.WaitKey, f.doc.WaitCap, f.doc.WaitExp, f.doc.Origin = levels[0].key, levels[0].Cap, time.Now().Add(req.WaitTTL), s.origin
		f.doc.GrantState = string(f.grantState(levels[0].key))
		f.doc.QueuedAt = time.Now() // set by the server; a wider level keeps it
	}
	if err := s.createHolder(ctx, f.doc); err != nil {
		return lease.Holder{}, err
	}
	if err := s.fault(StepHolderCreated, token); err != nil {
		return lease.Holder{}, s.abandon(ctx, f.doc, unavailable("acquiring "+f.doc.resources(), err))
	}
	if queue {
		return f.queue(ctx)
	}
	return f.from(ctx, 0)
}

// newHolderDoc is the document of a new holder of req, PENDING, naming its funnel's counters.
func newHolderDoc(token string, req AcquireRequest, levels []funnelLevel) holderDoc {
	keys := make([]string, len(levels))
	for i, l := range levels {
		keys[i] = l.key
	}
	doc := holderDoc{
		ID:         token,
		PID:        lease.HolderID(token),
		State:      string(lease.StatePending),
		LeaseName:  req.LeaseName,
		Resource:   req.Resource,
		Type:       req.Type,
		Tenant:     req.Tenant,
		Project:    req.Project,
		User:       req.User,
		HolderRef:  req.HolderRef,
		Pod:        podDoc{Namespace: req.Pod.Namespace, Name: req.Pod.Name, UID: req.Pod.UID},
		PodBound:   req.PodBound,
		Payload:    req.Payload,
		TTLSeconds: req.TTL.Seconds(),
		Levels:     []string{},
		Keys:       keys,
		Priority:   req.Priority,
	}
	if doc.Payload == nil {
		doc.Payload = map[string]string{}
	}
	if len(req.Parts) > 0 {
		parts := sortedParts(req.Parts)
		doc.LeaseName, doc.Resource = parts[0].LeaseName, parts[0].Resource
		for _, p := range parts {
			doc.Parts = append(doc.Parts, partDoc{Lease: p.LeaseName, Resource: p.Resource})
		}
	}
	return doc
}

// funnelRun is the funnel of one holder, run from some level on: by Acquire from the first,
// by Resume from the level after the one it waited for.
type funnelRun struct {
	store   *Store
	doc     holderDoc
	levels  []funnelLevel
	waitTTL time.Duration
	// priority is the request's (raised past the age bound by the waiting process).
	priority int
	// borrow: the acquisition may book its tenant level above the cap (borrow.go).
	borrow *Borrow
	// multi: the acquisition books several resources (AcquireRequest.Parts): no hand-over
	// completes it, and it takes its fences itself once every slot is booked (complete).
	multi bool
}

// prio is the holder's priority in a line: the request's, or the one its document carries
// if higher (a raise written by an earlier renewal).
func (b *funnelRun) prio() int { return max(b.priority, b.doc.Priority) }

// from books levels i, i+1, ... and makes the holder HELD with the last one. A full level
// queues the holder (WaitTTL) or rolls it back; a store error rolls it back.
func (b *funnelRun) from(ctx context.Context, i int) (lease.Holder, error) {
	for ; i < len(b.levels); i++ {
		l := b.levels[i]
		booked, count, err := b.bookLevel(ctx, i)
		if err != nil {
			return lease.Holder{}, b.store.abandon(ctx, b.doc, err)
		}
		if booked == bookedNot && b.waitTTL > 0 && b.borrowable(i-1) {
			// A holder above its tenant cap does not wait at the global level: it waits at
			// its tenant level (borrow.go).
			again, kept, err := b.unborrow(ctx, i-1)
			switch {
			case kept:
			case err != nil || !again:
				return lease.Holder{}, err
			default:
				i -= 1 // the tenant level is booked again (within its cap): the global level next
				continue
			}
		}
		if booked == bookedNot {
			busy := l.busy(count)
			if b.waitTTL <= 0 {
				return lease.Holder{}, b.refuse(ctx, i, busy)
			}
			claimed, err := b.wait(ctx, l, busy)
			if err != nil || !claimed {
				return lease.Holder{}, err
			}
			continue
		}
		if err := b.store.fault(StepBooked, l.key); err != nil {
			return lease.Holder{}, b.store.abandon(ctx, b.doc, unavailable("acquiring "+l.resource, err))
		}
		if err := b.record(ctx, i, booked == bookedBorrowed); err != nil {
			return lease.Holder{}, err
		}
	}
	if b.multi {
		return b.complete(ctx)
	}
	b.doc.State = string(lease.StateHeld)
	return b.doc.holder(), nil
}

// complete grants an acquisition of several resources whose every slot is booked and
// recorded (a PENDING holder with all its levels): one fence per part, taken now that every
// slot is the holder's, then the write that makes it HELD with them. A holder released
// meanwhile (reaped, its pod gone) gives back what it booked, and the answer is busy.
func (b *funnelRun) complete(ctx context.Context) (lease.Holder, error) {
	s := b.store
	parts := slices.Clone(b.doc.Parts)
	for i := range parts {
		fence, err := s.takeFences(ctx, parts[i].Resource, 1, holdSample{})
		if err != nil {
			return lease.Holder{}, s.abandon(ctx, b.doc, err)
		}
		parts[i].Fence = fence
	}
	if err := s.fault(StepPartsFenced, b.doc.ID); err != nil {
		return lease.Holder{}, s.abandon(ctx, b.doc, unavailable("acquiring "+b.doc.resources(), err))
	}
	keys := make([]string, len(b.levels))
	for i, l := range b.levels {
		keys[i] = l.key
	}
	res, err := s.holders.UpdateOne(ctx,
		bson.D{{Key: "_id", Value: b.doc.ID}, {Key: "state", Value: string(lease.StatePending)}, {Key: "levels", Value: bson.D{{Key: "$all", Value: keys}}}},
		bson.D{{Key: "$set", Value: bson.D{{Key: "state", Value: string(lease.StateHeld)}, {Key: "parts", Value: parts}, {Key: "fence", Value: parts[0].Fence}}}})
	switch {
	case err != nil:
		return lease.Holder{}, s.abandon(ctx, b.doc, unavailable("granting "+b.doc.resources(), err))
	case res.MatchedCount == 0:
		last := b.levels[len(b.levels)-1]
		return lease.Holder{}, s.abandon(ctx, b.doc, last.busy(last.Cap))
	}
	b.doc.State, b.doc.Parts, b.doc.Fence = string(lease.StateHeld), parts, parts[0].Fence
	return b.doc.holder(), nil
}

// booking is what bookLevel did at a level.
type booking int

const (
	bookedNot booking = iota
	bookedWithin
	bookedBorrowed
)

// bookLevel adds the holder's entry to level i, within its cap, or above it by borrowing
// (borrow.go); count is the count of a refusal.
func (b *funnelRun) bookLevel(ctx context.Context, i int) (booking, int, error) {
	l := b.levels[i]
	ok, count, err := b.store.book(ctx, l, l.resource, b.doc.Tenant, b.doc.PID, l.Cap, slotDoc{})
	switch {
	case err != nil:
		return bookedNot, 0, err
	case ok:
		return bookedWithin, 0, nil
	case !b.borrowable(i):
		return bookedNot, count, nil
	}
	borrowed, err := b.borrowAt(ctx, i)
	switch {
	case err != nil:
		return bookedNot, 0, err
	case borrowed:
		return bookedBorrowed, 0, nil
	}
	return bookedNot, count, nil
}

// record writes level i, whose entry the holder has, on the holder: the level is pushed to
// its levels and, at the last level, the holder becomes HELD with the fence taken now that
// every slot is booked (fence.go).
func (b *funnelRun) record(ctx context.Context, i int, borrowed bool) error {
	s, l := b.store, b.levels[i]
	state, fence, err := b.grantOf(ctx, i)
	if err != nil {
		return s.abandon(ctx, b.doc, err)
	}
	update := bson.D{{Key: "$set", Value: b.stateSet(state, fence)}, {Key: "$addToSet", Value: bson.D{{Key: "levels", Value: l.key}}}}
	if borrowed {
		update = b.borrowing(update, i)
	}
	res, err := s.holders.UpdateOne(ctx, bson.D{{Key: "_id", Value: b.doc.ID}, {Key: "state", Value: string(lease.StatePending)}}, update)
	if err != nil {
		return s.abandon(ctx, b.doc, unavailable("booking "+l.key, err))
	}
	if res.MatchedCount == 0 {
		// Released under the booking (reaped, its pod gone): its give-back may have run
		// before the entry was written, so the entry goes here, and the attempt is refused.
		return s.abandon(ctx, b.doc, l.busy(l.Cap))
	}
	b.doc.Levels, b.doc.Fence = append(b.doc.Levels, l.key), fence
	if err := s.fault(StepLevelPushed, l.key); err != nil {
		return s.abandon(ctx, b.doc, unavailable("acquiring "+l.resource, err))
	}
	return nil
}

// grantOf is the state a holder takes when it records level i: PENDING before the funnel's
// last level; at it HELD, with the fence taken now that every slot is booked (fence.go). An
// acquisition of several resources stays PENDING: complete takes its fences and grants it.
func (b *funnelRun) grantOf(ctx context.Context, i int) (lease.HolderState, int64, error) {
	if i < len(b.levels)-1 || b.multi {
		return lease.StatePending, 0, nil // several resources: complete grants them
	}
	fence, err := b.store.takeFences(ctx, b.levels[i].resource, 1, holdSample{})
	return lease.StateHeld, fence, err
}

// stateSet is the $set of a write that records a level: the holder's new state, with the
// fence of a grant.
func (b *funnelRun) stateSet(state lease.HolderState, fence int64) bson.D {
	set := bson.D{{Key: "state", Value: string(state)}}
	if fence > 0 {
		set = append(set, bson.E{Key: "fence", Value: fence})
	}
	return set
}

// refuse ends an attempt refused at level i that may not wait: the holder goes, and with
// it what it booked. One refused at its first level booked nothing: its document is deleted,
// one write.
func (b *funnelRun) refuse(ctx context.Context, i int, busy *lease.BusyError) error {
	if i == 0 && b.store.dropUnbooked(ctx, b.doc.ID) {
		return busy
	}
	return b.store.abandon(ctx, b.doc, busy)
}

// createHolder writes the holder by upsert, PENDING or already WAITING in its first level's
// line, so that acquiredAt, lastSeenAt (and queuedAt) are the server's time ($currentDate)
// from the start.
func (s *Store) createHolder(ctx context.Context, doc holderDoc) error {
	set := bson.D{
		{Key: "pid", Value: doc.PID},
		{Key: "state", Value: doc.State},
		{Key: "leaseName", Value: doc.LeaseName},
		{Key: "resource", Value: doc.Resource},
		{Key: "type", Value: doc.Type},
		{Key: "tenant", Value: doc.Tenant},
		{Key: "project", Value: doc.Project},
		{Key: "user", Value: doc.User},
		{Key: "holderRef", Value: doc.HolderRef},
		{Key: "pod", Value: doc.Pod},
		{Key: "podBound", Value: doc.PodBound},
		{Key: "payload", Value: doc.Payload},
		{Key: "ttlSeconds", Value: doc.TTLSeconds},
		{Key: "levels", Value: doc.Levels},
		{Key: "keys", Value: doc.Keys},
	}
	if len(doc.Parts) > 0 {
		set = append(set, bson.E{Key: "parts", Value: doc.Parts})
	}
	dates := bson.D{{Key: "acquiredAt", Value: true}, {Key: "lastSeenAt", Value: true}}
	if doc.WaitKey != "" { // created in a line (Acquire's queue)
		set = append(set, bson.E{Key: "waitKey", Value: doc.WaitKey}, bson.E{Key: "waitCap", Value: doc.WaitCap}, bson.E{Key: "waitExp", Value: doc.WaitExp},
			bson.E{Key: "origin", Value: doc.Origin}, bson.E{Key: "grantState", Value: doc.GrantState})
		if doc.Priority > 0 { // absent is 0 (lineOrder)
			set = append(set, bson.E{Key: "priority", Value: doc.Priority})
		}
		dates = append(dates, bson.E{Key: "queuedAt", Value: true})
	}
	update := bson.D{
		{Key: "$setOnInsert", Value: set},
		{Key: "$currentDate", Value: dates},
	}
	_, err := s.holders.UpdateOne(ctx, bson.D{{Key: "_id", Value: doc.ID}}, update, options.UpdateOne().SetUpsert(true))
	if err != nil {
		// The insert may have applied: remove the holder (it books nothing yet), or it
		// would be idle-reaped later as a lease nobody received.
		if _, derr := s.holders.DeleteOne(ctx, bson.D{{Key: "_id", Value: doc.ID}}); derr != nil {
			err = errors.Join(err, derr)
		}
		return unavailable("creating holder for "+doc.resources(), err)
	}
	return nil
}

// abandon rolls back a failed attempt: the holder is released and every entry it has is
// given back (releaseHolder; each removal is conditional on the entry, so what a reaper gave
// back already is not given twice). A simulated crash abandons nothing. It returns cause, or
// the rollback's own error joined to it.
func (s *Store) abandon(ctx context.Context, doc holderDoc, cause error) error {
	if errors.Is(cause, ErrCrash) {
		return cause
	}
	// Roll back even if the caller's context is done: a half-booked holder would block a
	// slot for a whole TTL.
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	_, ok, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: doc.ID}}, nil)
	if !ok && err == nil {
		// Released already, by a reaper whose give-back may have run before this attempt's
		// last entry was written: that entry goes now.
		err = s.giveBack(ctx, doc.Keys, doc.PID, holdSample{}, false)
	}
	if err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// dropUnbooked deletes the holder of an attempt refused at its first level, which booked
// nothing: one delete. false when the holder is no longer as created (then abandon
// releases it).
func (s *Store) dropUnbooked(ctx context.Context, token string) bool {
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	res, err := s.holders.DeleteOne(ctx, bson.D{
		{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StatePending)},
		{Key: "levels", Value: bson.D{{Key: "$in", Value: bson.A{nil, bson.A{}}}}},
		{Key: "grantKey", Value: bson.D{{Key: "$exists", Value: false}}},
	})
	return err == nil && res.DeletedCount == 1
}

func union(a, b []string) []string {
	seen := make(map[string]bool, len(a)+len(b))
	out := make([]string, 0, len(a)+len(b))
	for _, k := range append(append([]string{}, a...), b...) {
		if !seen[k] {
			seen[k] = true
			out = append(out, k)
		}
	}
	return out
}

// Probe reads the funnel's counters in one round trip and returns the first level, narrow
// to wide, that is visibly full, or nil. It writes nothing: waiting acquirers poll with it
// and go down the write path only when every level shows room.
func (s *Store) Probe(ctx context.Context, resource string, caps []lease.LevelCap, tenant, project, user string) (*lease.BusyError, error) {
	levels, err := funnel(resource, caps, tenant, project, user)
	if err != nil {
		return nil, err
	}
	keys := make([]string, len(levels))
	for i, l := range levels {
		keys[i] = l.key
	}
	ctx, cancel := s.bound(ctx)
	defer cancel()
	cur, err := s.counters.Find(ctx, bson.D{{Key: "_id", Value: bson.D{{Key: "$in", Value: keys}}}})
	if err != nil {
		return nil, unavailable("probing "+resource, err)
	}
	var docs []counterDoc
	if err := cur.All(ctx, &docs); err != nil {
		return nil, unavailable("probing "+resource, err)
	}
	counts := make(map[string]int, len(docs))
	for _, d := range docs {
		counts[d.ID] = d.Count
	}
	for _, l := range levels {
		if n := counts[l.key]; n >= l.Cap {
			return &lease.BusyError{Resource: resource, Level: l.Level, Scope: l.scope, Count: n, Cap: l.Cap}, nil
		}
	}
	return nil, nil
}
