package leasestore

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/vancetope/lease-operator/internal/lease"
	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"
)

// funnelLevel is one capped level with its counter key.
type funnelLevel struct {
	lease.LevelCap
	key   string
	scope string
}

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
		out = append(out, funnelLevel{LevelCap: c, key: lease.CounterKey(resource, c.Level, scope), scope: scope})
	}
	sort.Slice(out, func(i, j int) bool { return rank[out[i].Level] < rank[out[j].Level] })
	return out, nil
}

func validateAcquire(req AcquireRequest) error {
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
	for _, c := range req.Caps {
		if c.Level == lease.LevelUser && req.User == "" {
			return fmt.Errorf("%w: the user level is capped but user is empty", lease.ErrInvalid)
		}
		if c.Level == lease.LevelProject && req.Project == "" {
			return fmt.Errorf("%w: the project level is capped but project is empty", lease.ErrInvalid)
		}
	}
	return nil
}

// Acquire makes one attempt to book a slot at every capped level of the request, narrow to
// wide (docs/design.md): the holder is written first (PENDING); per level the counter is
// incremented by a conditional update and then the key is pushed to the holder; the last
// push also marks the holder HELD. A store error rolls the attempt back. A full level rolls
// it back too and returns a *lease.BusyError, unless the request may wait (WaitTTL): then the
// holder waits in that level's line, keeping the narrower levels it booked, and Acquire
// returns a *WaitingError (wait.go). Once started, an attempt is not cut short by the
// caller's cancellation or deadline, only by the store's operation timeout: a write cut
// mid-flight may still apply, and an increment nobody knows of would block its slot until it
// is healed.
func (s *Store) Acquire(ctx context.Context, req AcquireRequest) (lease.Holder, error) {
	if err := validateAcquire(req); err != nil {
		return lease.Holder{}, err
	}
	levels, err := funnel(req.Resource, req.Caps, req.Tenant, req.Project, req.User)
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
		IncKey:     levels[0].key,
		Priority:   req.Priority,
	}
	if doc.Payload == nil {
		doc.Payload = map[string]string{}
	}
	f := funnelRun{store: s, doc: doc, levels: levels, waitTTL: req.WaitTTL, priority: req.Priority, borrow: req.Borrow}
	// While the first level has a line, a newcomer that may wait joins it at once: its
	// increment would be refused (the count stays at the cap while anyone waits), and the
	// write that queues it would follow.
	queue := req.WaitTTL > 0 && s.linedRecently(levels[0].key)
	if queue {
		f.doc.State, f.doc.IncKey = string(lease.StateWaiting), ""
		f.doc.WaitKey, f.doc.WaitCap, f.doc.WaitExp, f.doc.Origin = levels[0].key, levels[0].Cap, time.Now().Add(req.WaitTTL), s.origin
		f.doc.GrantState = string(f.grantState(levels[0].key))
		f.doc.QueuedAt = time.Now() // set by the server; a wider level keeps it
	}
	if err := s.createHolder(ctx, f.doc); err != nil {
		return lease.Holder{}, err
	}
	if err := s.fault(StepHolderCreated, token); err != nil {
		return lease.Holder{}, s.abandon(ctx, token, nil, unavailable("acquiring "+req.Resource, err))
	}
	if queue {
		return f.queue(ctx)
	}
	return f.from(ctx, 0)
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
}

// prio is the holder's priority in a line: the request's, or the one its document carries
// if higher (a raise written by an earlier renewal).
func (b *funnelRun) prio() int { return max(b.priority, b.doc.Priority) }

// from books levels i, i+1, ... and marks the holder HELD with the last one. A full level
// queues the holder (WaitTTL) or rolls it back; a store error rolls it back.
func (b *funnelRun) from(ctx context.Context, i int) (lease.Holder, error) {
	s, token, resource := b.store, b.doc.ID, b.doc.Resource
	for ; i < len(b.levels); i++ {
		l := b.levels[i]
		ok, count, err := s.increment(ctx, l, resource, b.doc.Tenant)
		if err != nil {
			return lease.Holder{}, s.abandon(ctx, token, nil, err)
		}
		borrowed := false
		if !ok && b.borrowable(i) {
			if borrowed, err = b.borrowAt(ctx, i); err != nil {
				return lease.Holder{}, s.abandon(ctx, token, nil, err)
			}
			ok = borrowed
		}
		if !ok && b.waitTTL > 0 && i > 0 && b.borrowable(i-1) {
			// A holder above its tenant cap does not wait at the global level: it waits
			// at its tenant level.
			claimed, kept, err := b.unborrow(ctx, i-1)
			switch {
			case kept:
			case err != nil || !claimed:
				return lease.Holder{}, err
			default:
				i -= 1 // the tenant level is booked again (within its cap): the global level next
				continue
			}
		}
		if !ok {
			busy := &lease.BusyError{Resource: resource, Level: l.Level, Scope: l.scope, Count: count, Cap: l.Cap}
			if b.waitTTL <= 0 {
				if i == 0 && s.dropUnbooked(ctx, token) {
					return lease.Holder{}, busy
				}
				return lease.Holder{}, s.abandonAt(ctx, token, nil, l.key, busy)
			}
			claimed, err := b.wait(ctx, l, busy)
			if err != nil || !claimed {
				return lease.Holder{}, err
			}
			if i == len(b.levels)-1 {
				break
			}
			continue
		}
		if err := s.fault(StepCounterIncremented, l.key); err != nil {
			return lease.Holder{}, s.abandon(ctx, token, []string{l.key}, unavailable("acquiring "+resource, err))
		}
		state, fence := lease.StatePending, int64(0)
		if i == len(b.levels)-1 {
			// Every slot is held now: the fence the write below grants with (fence.go).
			state = lease.StateHeld
			if fence, err = s.takeFences(ctx, resource, 1, holdSample{}); err != nil {
				return lease.Holder{}, s.abandon(ctx, token, []string{l.key}, err)
			}
		}
		update := append(b.booking(i, state, fence), bson.E{Key: "$push", Value: bson.D{{Key: "levels", Value: l.key}}})
		if borrowed {
			update = b.borrowing(update, i)
		}
		res, err := s.holders.UpdateOne(ctx,
			bson.D{{Key: "_id", Value: token}, {Key: "state", Value: string(lease.StatePending)}}, update)
		if err != nil {
			// The push may or may not have been applied: the key is given back only if
			// this attempt still releases the holder.
			return lease.Holder{}, s.abandon(ctx, token, []string{l.key}, unavailable("booking "+l.key, err))
		}
		if res.MatchedCount == 0 {
			// A reaper released the holder (and gave back its pushed levels) between two
			// steps; the slot incremented just now is counted by no holder: Heal frees it.
			s.healAfter(ctx, l.key)
			return lease.Holder{}, unavailable("acquiring "+resource, fmt.Errorf("holder %s was reaped while booking", lease.HolderID(token)))
		}
		b.doc.Levels, b.doc.Fence = append(b.doc.Levels, l.key), fence
		if err := s.fault(StepLevelPushed, l.key); err != nil {
			return lease.Holder{}, s.abandon(ctx, token, nil, unavailable("acquiring "+resource, err))
		}
	}
	b.doc.State = string(lease.StateHeld)
	return b.doc.holder(), nil
}

// booking is the $set (and $unset) of the write that records level i of the funnel on the
// holder: its new state (with the fence of a grant), and the next level as the counter it
// increments next (IncKey), or no IncKey after the last level.
func (b *funnelRun) booking(i int, state lease.HolderState, fence int64) bson.D {
	set := bson.D{{Key: "state", Value: string(state)}}
	if fence > 0 {
		set = append(set, bson.E{Key: "fence", Value: fence})
	}
	if i+1 < len(b.levels) {
		b.doc.IncKey = b.levels[i+1].key
		return bson.D{{Key: "$set", Value: append(set, bson.E{Key: "incKey", Value: b.doc.IncKey})}}
	}
	b.doc.IncKey = ""
	return bson.D{{Key: "$set", Value: set}, {Key: "$unset", Value: bson.D{{Key: "incKey", Value: ""}}}}
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
	}
	dates := bson.D{{Key: "acquiredAt", Value: true}, {Key: "lastSeenAt", Value: true}}
	if doc.IncKey != "" {
		set = append(set, bson.E{Key: "incKey", Value: doc.IncKey})
	}
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
		return unavailable("creating holder for "+doc.Resource, err)
	}
	return nil
}

// incrementAttempts bounds how often one level retries its conditional update when it
// missed but the counter then showed room (a concurrent release or first use in between).
const incrementAttempts = 3

// increment books one slot of a counter: a conditional $inc without upsert. On a miss it
// reads the counter: a counter at its cap is busy (count is returned for the diagnosis); a
// missing counter is created with a pure _id upsert (count 0), and the conditional update
// runs again, as it does when the counter shows room after all. A duplicate key on the
// upsert means a concurrent first use created it: that is "exists", never busy.
func (s *Store) increment(ctx context.Context, l funnelLevel, resource, tenant string) (ok bool, count int, err error) {
	filter := bson.D{{Key: "_id", Value: l.key}, {Key: "count", Value: bson.D{{Key: "$lt", Value: l.Cap}}}}
	update := countBy(1)
	for range incrementAttempts {
		res, err := s.counters.UpdateOne(ctx, filter, update)
		if err != nil {
			return false, 0, unavailable("incrementing "+l.key, err)
		}
		if res.MatchedCount == 1 {
			return true, 0, nil
		}
		var c counterDoc
		err = s.counters.FindOne(ctx, bson.D{{Key: "_id", Value: l.key}}).Decode(&c)
		switch {
		case err == nil:
			if c.Count >= l.Cap {
				return false, c.Count, nil
			}
			continue
		case !errors.Is(err, mongo.ErrNoDocuments):
			return false, 0, unavailable("reading counter "+l.key, err)
		}
		if err := s.createCounter(ctx, l, resource, tenant); err != nil {
			return false, 0, err
		}
	}
	// Room seen but every attempt missed (heavy churn): report busy with the last count, so
	// the caller waits and tries again rather than spinning here.
	c, err := s.count(ctx, l.key)
	return false, c, err
}

// createCounter creates a missing counter with count 0 by a pure _id upsert.
func (s *Store) createCounter(ctx context.Context, l funnelLevel, resource, tenant string) error {
	counterTenant := tenant
	if l.Level == lease.LevelGlobal {
		counterTenant = ""
	}
	create := bson.D{
		{Key: "$setOnInsert", Value: bson.D{
			{Key: "resource", Value: resource},
			{Key: "level", Value: string(l.Level)},
			{Key: "scope", Value: l.scope},
			{Key: "tenant", Value: counterTenant},
			{Key: "count", Value: 0},
			{Key: "rev", Value: 0},
		}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	}
	_, err := s.counters.UpdateOne(ctx, bson.D{{Key: "_id", Value: l.key}}, create, options.UpdateOne().SetUpsert(true))
	if err != nil && !mongo.IsDuplicateKeyError(err) {
		return unavailable("creating counter "+l.key, err)
	}
	return nil
}

// countBy is the update that moves a counter's count by n: its rev goes up with it, and its
// updatedAt is the server's time.
func countBy(n int, more ...bson.E) bson.D {
	u := bson.D{
		{Key: "$inc", Value: bson.D{{Key: "count", Value: n}, {Key: "rev", Value: 1}}},
		{Key: "$currentDate", Value: bson.D{{Key: "updatedAt", Value: true}}},
	}
	return append(u, more...)
}

func (s *Store) count(ctx context.Context, key string) (int, error) {
	var c counterDoc
	err := s.counters.FindOne(ctx, bson.D{{Key: "_id", Value: key}}).Decode(&c)
	switch {
	case errors.Is(err, mongo.ErrNoDocuments):
		return 0, nil
	case err != nil:
		return 0, unavailable("reading counter "+key, err)
	}
	return c.Count, nil
}

// abandon rolls back a failed attempt: it releases the holder and, only if it was the one
// that released it, gives back the levels the holder had registered plus the keys incremented
// but not (surely) pushed. If a reaper released the holder first, the reaper gave back the
// registered levels; a pending key, which no holder counts any more, is left to Heal (asked
// here). A simulated crash abandons nothing. It returns cause, or the rollback's own error
// joined to it.
func (s *Store) abandon(ctx context.Context, token string, pending []string, cause error) error {
	return s.abandonAt(ctx, token, pending, "", cause)
}

// abandonAt is abandon of an attempt whose last increment, of the counter settled, was
// refused: that counter needs no Heal.
func (s *Store) abandonAt(ctx context.Context, token string, pending []string, settled string, cause error) error {
	if errors.Is(cause, ErrCrash) {
		return cause
	}
	// Roll back even if the caller's context is done: a half-booked holder would block a
	// slot for a whole TTL.
	ctx, cancel := s.bound(context.WithoutCancel(ctx))
	defer cancel()
	_, ok, err := s.releaseHolder(ctx, bson.D{{Key: "_id", Value: token}}, pending, settled)
	if !ok && err == nil {
		for _, k := range pending {
			s.healAfter(ctx, k)
		}
	}
	if err != nil {
		return errors.Join(cause, err)
	}
	return cause
}

// dropUnbooked deletes the holder of an attempt refused at its first level, which counts no
// slot and so needs no release mark: one delete, as a refusal cost before marks. false when
// the holder is no longer as created (then abandonAt releases it).
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
