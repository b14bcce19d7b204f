package leasestore_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.mongodb.org/mongo-driver/v2/bson"
	"go.mongodb.org/mongo-driver/v2/mongo"
	"go.mongodb.org/mongo-driver/v2/mongo/options"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/testutil/wiresched"
)

// The interleaving checker (docs/robustness.md, "Interleaving checker"). Simulated processes,
// each a store with a client of its own, run a script of store calls; every command they
// send is held at the wire (wiresched) and a seeded scheduler picks which goes next, and
// whether it is delivered, lost before or after the server applied it, or is the last its
// process sends (a crash); a delivered write may be delivered once more later. After every
// step the checker reads the store directly and checks the invariants; after the script it
// checks that every level serves its full cap again within the recovery bound. A failure
// prints the schedule, shrunk: faults dropped and choices moved to the oldest command while
// the failure stays.
//
// The development store runs one command at a time, so the checker interleaves commands,
// not the reads inside one command: what a multi-document read sees of writes in flight is
// the robustness suite's part (on MongoDB, docs/robustness.md).

// checkerOpTimeout is the processes' operation timeout: the recovery bound is
// max(TTL, operation timeout) + recoverySlack after the last fault.
const (
	checkerOpTimeout = time.Second
	recoverySlack    = 2 * time.Second
)

// opKind is one store call of a script.
type opKind int

const (
	opAcquire opKind = iota // without waiting
	opWait                  // acquire that may wait in line
	opResume                // a waiter's look (renewal and one try)
	opRelease
	opHeal // the repair a refusal asks for, of the scenario's counters
	opSweep
	opSleep
)

var opNames = [...]string{"acquire", "wait", "resume", "release", "heal", "sweep", "sleep"}

type op struct {
	kind opKind
	who  string        // the holder the call is for (acquire, wait, resume, release)
	d    time.Duration // opSleep
}

func (o op) String() string {
	if o.kind == opSleep {
		return "sleep " + o.d.String()
	}
	if o.who == "" {
		return opNames[o.kind]
	}
	return opNames[o.kind] + " " + o.who
}

// scenario is a resource with its caps, holders set up one by one, the scripts of the
// processes whose commands are interleaved, and calls made one by one after them.
type scenario struct {
	name    string
	caps    []lease.LevelCap
	ttl     time.Duration
	waitTTL time.Duration
	// users of the holders (the holder's name when absent).
	users   map[string]string
	setup   []op
	procs   [][]op
	after   []op
	faults  faultPolicy
	crashAt *crashPoint // a crash at a fixed point (bounded-exhaustive over crash points)
	// resources are the scenario's resources, each with caps ("r" when empty); wants names
	// the resources a holder acquires (every holder "r" when absent): two or more make an
	// acquisition of several resources, named in the order given.
	resources []string
	wants     map[string][]string
	// finish: holders that must be answered held by the end of the scenario (no deadlock).
	finish []string
}

// resourceList is sc's resources.
func (sc scenario) resourceList() []string {
	if len(sc.resources) == 0 {
		return []string{"r"}
	}
	return sc.resources
}

type crashPoint struct {
	proc, cmd int // the cmd-th command (from 1) of proc
	after     bool
}

// faultPolicy: the chances of a fault at a step, and how many of each a run may have.
type faultPolicy struct {
	crash, lose, dup float64
	maxLose, maxDup  int
	noCrash          bool
}

// schedule is a run's decisions: for each step, the index into the held commands (taken
// modulo their number) and the fault, if any. A run reads its decisions from a recorded
// schedule first and draws the rest from its seed.
type decision struct {
	pick  int
	fault string // "", "crash-before", "crash-after", "lose-before", "lose-after", "dup:<i>"
}

type schedule []decision

func (s schedule) String() string {
	var b strings.Builder
	for i, d := range s {
		fmt.Fprintf(&b, "%d:%d", i, d.pick)
		if d.fault != "" {
			b.WriteString("/" + d.fault)
		}
		b.WriteString(" ")
	}
	return b.String()
}

// checker runs scenarios on the test server.
type checker struct {
	t       testing.TB
	uri     string
	backend string
}

func newChecker(t testing.TB) *checker {
	uri, _ := newDatabase(t)
	u, err := url.Parse(uri)
	if err != nil {
		t.Fatalf("test MongoDB URI: %v", err)
	}
	return &checker{t: t, uri: uri, backend: u.Host}
}

// outcome is what one run found: the first violation (empty: none), the trace, and the
// decisions it took.
type outcome struct {
	violation string
	trace     []string
	taken     schedule
	// crashed: a process of the run crashed (a scenario's crash point was reached).
	crashed bool
}

// run runs sc once with the decisions of fixed, then of seed.
func (c *checker) run(sc scenario, seed uint64, fixed schedule) outcome {
	r := &runner{c: c, sc: sc, rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), fixed: fixed}
	r.exec()
	return outcome{violation: r.violation, trace: r.trace, taken: r.taken, crashed: r.crashed}
}

// explore runs sc with seeds from first until a run finds a violation or n runs found none;
// a violation's schedule is shrunk and printed.
func (c *checker) explore(sc scenario, first uint64, n int) (outcome, int) {
	for i := range n {
		seed := first + uint64(i)
		o := c.run(sc, seed, nil)
		if o.violation != "" {
			return c.shrink(sc, seed, o), i + 1
		}
	}
	return outcome{}, n
}

// shrink drops faults and moves picks to 0 (the oldest held command) while the run still
// finds a violation.
func (c *checker) shrink(sc scenario, seed uint64, o outcome) outcome {
	best := o
	for changed, rounds := true, 0; changed && rounds < 3; rounds++ {
		changed = false
		for i := range best.taken {
			for _, try := range []func(d *decision) bool{
				func(d *decision) bool { ok := d.fault != ""; d.fault = ""; return ok },
				func(d *decision) bool { ok := d.pick != 0; d.pick = 0; return ok },
			} {
				s := slices.Clone(best.taken)
				if i >= len(s) || !try(&s[i]) {
					continue
				}
				if got := c.run(sc, seed, s); got.violation != "" {
					best, changed = got, true
				}
			}
		}
	}
	return best
}

func (c *checker) report(sc scenario, o outcome) string {
	return fmt.Sprintf("scenario %s: %s\nschedule: %s\n%s", sc.name, o.violation, o.taken, strings.Join(o.trace, "\n"))
}

// runner is one run of a scenario.
type runner struct {
	c     *checker
	sc    scenario
	rng   *rand.Rand
	fixed schedule
	taken schedule
	trace []string

	violation string

	db      string
	sched   *wiresched.Scheduler
	direct  *leasestore.Store
	raw     *mongo.Client
	stores  []*leasestore.Store
	tokens  map[string]string
	mu      sync.Mutex
	procs   []*procState
	held    map[string]bool // holders answered held and not released by their caller
	waiting map[string]bool
	// lastFault: when the last fault happened (zero: none); crashed: a process is dead.
	lastFault time.Time
	crashed   bool
	delivered []*wiresched.Command
	loses     int
	dups      int
	probes    int // the probe's acquisitions so far (each its own holder)
	cmdsOf    map[int]int
	// everHeld: holders answered held at some point; fences: per resource, the holder each
	// fence of a granted part went to.
	everHeld map[string]bool
	fences   map[string]map[int64]string
	// failed: holders whose acquisition answered a store error (their command held at the wire
	// past the operation timeout on a loaded machine): out of the line, owed no grant.
	failed map[string]bool
}

type procState struct {
	busy, sleeping, done, frozen bool
}

func (r *runner) logf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trace = append(r.trace, fmt.Sprintf(format, args...))
}

func (r *runner) fail(format string, args ...any) {
	if r.violation == "" {
		r.violation = fmt.Sprintf(format, args...)
		r.logf("VIOLATION: %s", r.violation)
		r.dump()
	}
}

// dump adds the store's documents to the trace.
func (r *runner) dump() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, coll := range []string{leasestore.CountersCollection, leasestore.HoldersCollection} {
		cur, err := r.raw.Database(r.db).Collection(coll).Find(ctx, bson.D{})
		if err != nil {
			r.logf("    %s: %v", coll, err)
			continue
		}
		var docs []bson.Raw
		_ = cur.All(ctx, &docs)
		for _, d := range docs {
			r.logf("    %s: %s", coll, d.String())
		}
	}
}

func (r *runner) exec() {
	t := r.c.t
	r.db = fmt.Sprintf("interleave-%d", time.Now().UnixNano())
	r.tokens, r.held, r.waiting, r.cmdsOf = map[string]string{}, map[string]bool{}, map[string]bool{}, map[int]int{}
	r.everHeld, r.fences, r.failed = map[string]bool{}, map[string]map[int64]string{}, map[string]bool{}
	var err error
	r.direct, err = leasestore.Connect(r.c.uri, r.db, leasestore.WithOpTimeout(checkerOpTimeout))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	r.raw, err = mongo.Connect(options.Client().ApplyURI(r.c.uri))
	if err != nil {
		t.Fatalf("connect: %v", err)
	}
	r.sched = wiresched.New(r.c.backend)
	defer func() {
		r.sched.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		for _, s := range r.stores {
			_ = s.Close(ctx)
		}
		_ = r.direct.Drop(ctx)
		_ = r.direct.Close(ctx)
		_ = r.raw.Disconnect(ctx)
	}()
	ctx := context.Background()
	if err := r.direct.EnsureIndexes(ctx); err != nil {
		t.Fatalf("indexes: %v", err)
	}
	for range r.sc.procs {
		addr, err := r.sched.Process(len(r.stores))
		if err != nil {
			t.Fatalf("listen: %v", err)
		}
		uri := "mongodb://" + addr + "/?directConnection=true&retryWrites=false&retryReads=false&serverMonitoringMode=poll"
		s, err := leasestore.Connect(uri, r.db, leasestore.WithOpTimeout(checkerOpTimeout))
		if err != nil {
			t.Fatalf("connect: %v", err)
		}
		r.stores = append(r.stores, s)
		r.procs = append(r.procs, &procState{})
	}
	for _, o := range r.sc.setup {
		r.call(r.direct, o)
	}
	r.check("setup")
	r.interleave()
	for _, o := range r.sc.after {
		if r.violation != "" {
			return
		}
		r.call(r.direct, o)
		r.check(o.String())
	}
	for _, who := range r.sc.finish {
		if r.violation == "" && !r.everHeld[who] && !r.failed[who] {
			r.fail("%s was never granted: the waiters are stuck (deadlock)", who)
		}
	}
	if r.violation == "" {
		r.recover()
	}
}

// interleave runs the processes' scripts, one held command at a time.
func (r *runner) interleave() {
	for i, script := range r.sc.procs {
		go func() {
			for _, o := range script {
				r.setProc(i, func(p *procState) { p.busy = true; p.sleeping = o.kind == opSleep })
				r.call(r.stores[i], o)
				r.setProc(i, func(p *procState) { p.busy, p.sleeping = false, false })
			}
			r.setProc(i, func(p *procState) { p.done = true })
		}()
	}
	for step := 0; r.violation == ""; step = len(r.taken) {
		if step > 400 {
			r.fail("no end after 400 steps")
			return
		}
		held, finished := r.settle()
		if len(held) == 0 {
			if finished {
				return
			}
			time.Sleep(5 * time.Millisecond) // real time: a process of the scenario sleeps (opSleep), nothing is held
			continue
		}
		d := r.decide(len(held))
		cmd := held[d.pick%len(held)]
		r.cmdsOf[cmd.Proc]++
		fate := wiresched.Deliver
		freezeAfter := false
		if cp := r.sc.crashAt; cp != nil && cp.proc == cmd.Proc && cp.cmd == r.cmdsOf[cmd.Proc] {
			d.fault = map[bool]string{false: "crash-before", true: "crash-after"}[cp.after]
		}
		switch d.fault {
		case "crash-before":
			fate = wiresched.Freeze
		case "crash-after":
			freezeAfter = true
		case "lose-before":
			fate = wiresched.LoseBefore
		case "lose-after":
			fate = wiresched.LoseAfter
		}
		r.taken = append(r.taken, d)
		r.logf("%3d %s %s", len(r.taken)-1, fate, cmd)
		if fate == wiresched.Freeze || freezeAfter {
			r.crashed = true
			r.setProc(cmd.Proc, func(p *procState) { p.frozen = true })
		}
		r.sched.Run(cmd, fate)
		if cmd.Broken() {
			r.logf("    (its process had given up on it: delivered late)")
		}
		if fate != wiresched.Deliver || freezeAfter || cmd.Broken() {
			r.lastFault = time.Now()
			if freezeAfter {
				r.logf("    p%d crashed", cmd.Proc)
			}
		}
		if fate == wiresched.Deliver && cmd.Write() {
			r.delivered = append(r.delivered, cmd)
		}
		if strings.HasPrefix(d.fault, "dup:") && len(r.delivered) > 0 {
			i, _ := strconv.Atoi(strings.TrimPrefix(d.fault, "dup:"))
			dup := r.delivered[i%len(r.delivered)]
			err := r.sched.Replay(dup)
			r.lastFault = time.Now()
			r.logf("    late duplicate of #%d: %v", dup.Seq, err)
		}
		r.check(fmt.Sprintf("step %d", step))
	}
}

// decide takes the next decision: the recorded one, or a fresh draw.
func (r *runner) decide(n int) decision {
	if i := len(r.taken); i < len(r.fixed) {
		return r.fixed[i]
	}
	if r.fixed != nil {
		return decision{} // a shrunk schedule goes on with the oldest command, without faults
	}
	d := decision{pick: r.rng.IntN(n)}
	f := r.sc.faults
	switch x := r.rng.Float64(); {
	case !f.noCrash && !r.crashed && x < f.crash:
		d.fault = []string{"crash-before", "crash-after"}[r.rng.IntN(2)]
	case r.loses < f.maxLose && x < f.crash+f.lose:
		r.loses++
		d.fault = []string{"lose-before", "lose-after"}[r.rng.IntN(2)]
	case r.dups < f.maxDup && x < f.crash+f.lose+f.dup:
		r.dups++
		d.fault = "dup:" + strconv.Itoa(r.rng.IntN(1000))
	}
	return d
}

func (r *runner) setProc(i int, f func(*procState)) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f(r.procs[i])
}

// settle waits until no live process is between two commands, and returns the held
// commands of live processes; finished: every live process has ended its script.
func (r *runner) settle() (held []*wiresched.Command, finished bool) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		pending := r.sched.Pending()
		r.mu.Lock()
		heldBy := map[int]bool{}
		held = held[:0]
		for _, c := range pending {
			if !r.procs[c.Proc].frozen {
				held = append(held, c)
				heldBy[c.Proc] = true
			}
		}
		slices.SortFunc(held, func(a, b *wiresched.Command) int {
			if a.Proc != b.Proc {
				return a.Proc - b.Proc
			}
			return a.Seq - b.Seq
		})
		quiet, finished := true, true
		for i, p := range r.procs {
			if p.frozen {
				continue
			}
			if !p.done {
				finished = false
			}
			if p.busy && !p.sleeping && !heldBy[i] {
				quiet = false
			}
		}
		r.mu.Unlock()
		if quiet {
			// A store's own goroutine may be about to send (a release mark's delete).
			time.Sleep(300 * time.Microsecond) // real time: a store's own goroutine may be about to send (no event says it will not)
			if len(r.sched.Pending()) == len(pending) {
				return held, finished && len(held) == 0
			}
			continue
		}
		if time.Now().After(deadline) {
			r.fail("a process neither sends nor ends")
			return nil, true
		}
		time.Sleep(100 * time.Microsecond) // real time: polling processes between two commands (bounded by the deadline)
	}
}

func (r *runner) user(who string) string {
	if u, ok := r.sc.users[who]; ok {
		return u
	}
	return who
}

func (r *runner) request(who string) leasestore.AcquireRequest {
	r.mu.Lock()
	tok, ok := r.tokens[who]
	if !ok {
		tok, _ = leasestore.NewToken()
		r.tokens[who] = tok
	}
	r.mu.Unlock()
	wants := r.sc.wants[who]
	if len(wants) == 0 {
		wants = r.sc.resourceList()[:1]
	}
	req := leasestore.AcquireRequest{
		LeaseName: wants[0], Resource: wants[0], Caps: r.sc.caps, Tenant: "t", Project: "p", User: r.user(who),
		Type: "job", HolderRef: who, TTL: r.sc.ttl, Token: tok,
		Pod: lease.PodRef{Namespace: "ns", Name: who, UID: "uid-" + who},
	}
	if len(wants) > 1 {
		req.LeaseName, req.Resource, req.Caps = "", "", nil
		for _, res := range wants {
			req.Parts = append(req.Parts, leasestore.Part{LeaseName: "l-" + res, Resource: res, Caps: r.sc.caps})
		}
	}
	return req
}

// call makes one store call and records what its caller was told.
func (r *runner) call(s *leasestore.Store, o op) {
	ctx := context.Background()
	var err error
	var h lease.Holder
	switch o.kind {
	case opSleep:
		time.Sleep(o.d) // real time: the scenario's pause, measured against the holders' real TTL
		return
	case opAcquire:
		h, err = s.Acquire(ctx, r.request(o.who))
	case opWait:
		req := r.request(o.who)
		req.WaitTTL = r.sc.waitTTL
		h, err = s.Acquire(ctx, req)
	case opResume:
		r.mu.Lock()
		w := r.waiting[o.who]
		r.mu.Unlock()
		if !w {
			return
		}
		req := r.request(o.who)
		req.WaitTTL = r.sc.waitTTL
		h, err = s.Resume(ctx, req, "", true)
	case opRelease:
		r.mu.Lock()
		tok, ok := r.tokens[o.who]
		held := r.held[o.who]
		r.mu.Unlock()
		if !ok || !held {
			return
		}
		if _, err = s.Release(ctx, tok); err == nil {
			r.mu.Lock()
			delete(r.held, o.who)
			r.mu.Unlock()
		}
		r.note(o, "released", err)
		return
	case opHeal:
		for _, k := range r.keys() {
			_, err = s.Repair(ctx, k)
		}
		r.note(o, "", err)
		return
	case opSweep:
		var rd leasestore.Round
		if rd, err = s.SweepRound(ctx); err == nil {
			_, err = s.ReconcileRound(ctx, rd)
		}
		r.note(o, "", err)
		return
	}
	var we *leasestore.WaitingError
	r.mu.Lock()
	switch {
	case err == nil && h.State == lease.StateHeld:
		r.held[o.who], r.waiting[o.who], r.everHeld[o.who] = true, false, true
	case errors.As(err, &we):
		r.waiting[o.who] = true
	case errors.Is(err, leasestore.ErrNotWaiting):
		r.waiting[o.who] = false
	case err != nil && !errors.Is(err, lease.ErrBusy) && (o.kind == opWait || o.kind == opAcquire):
		r.failed[o.who] = true
	}
	r.mu.Unlock()
	r.note(o, string(h.State), err)
}

func (r *runner) note(o op, what string, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		what = err.Error()
	}
	r.trace = append(r.trace, fmt.Sprintf("    %s: %s", o, what))
}

// keys are the scenario's counter keys of the users it names.
func (r *runner) keys() []string {
	var out []string
	seen := map[string]bool{}
	for _, c := range r.sc.caps {
		users := []string{""}
		if c.Level == lease.LevelUser {
			users = nil
			for _, o := range append(append(slices.Clone(r.sc.setup), r.sc.after...), slices.Concat(r.sc.procs...)...) {
				if o.who != "" {
					users = append(users, r.user(o.who))
				}
			}
		}
		for _, res := range r.sc.resourceList() {
			for _, u := range users {
				k := lease.CounterKey(res, c.Level, lease.ScopeOf(c.Level, "t", "p", u))
				if !seen[k] {
					seen[k] = true
					out = append(out, k)
				}
			}
		}
	}
	return out
}

func (r *runner) capOf(key string) int {
	for _, c := range r.sc.caps {
		if strings.Contains(key, "|"+string(c.Level)+"|") {
			return c.Cap
		}
	}
	return 0
}

// check reads the store and checks the invariants: no level is held by more holders than
// its cap, a held holder being one its caller was answered held for, has not released, and
// whose lease still answers (its document is HELD: Touch and Check succeed); and the
// model's own (checkModel).
func (r *runner) check(where string) {
	if r.violation != "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cur, err := r.raw.Database(r.db).Collection(leasestore.HoldersCollection).Find(ctx, bson.D{})
	if err != nil {
		r.fail("reading holders: %v", err)
		return
	}
	var holders []bson.M
	if err := cur.All(ctx, &holders); err != nil {
		r.fail("reading holders: %v", err)
		return
	}
	r.mu.Lock()
	told := map[string]bool{}
	for who, h := range r.held {
		if h {
			told[r.tokens[who]] = true
		}
	}
	r.mu.Unlock()
	heldAt := map[string][]string{}
	for _, h := range holders {
		if h["state"] != string(lease.StateHeld) {
			continue
		}
		if msg := r.checkWhole(ctx, h, told[fmt.Sprint(h["_id"])]); msg != "" {
			r.fail("after %s: %s", where, msg)
			return
		}
		if !told[fmt.Sprint(h["_id"])] {
			continue
		}
		for _, k := range heldKeys(h) {
			heldAt[k] = append(heldAt[k], fmt.Sprint(h["holderRef"]))
		}
	}
	for k, hs := range heldAt {
		if cp := r.capOf(k); len(hs) > cp {
			r.fail("after %s: %d held holders %v at %s, cap %d", where, len(hs), hs, k, cp)
			return
		}
	}
	if msg := checkModel(ctx, r.raw.Database(r.db), r.capOf, r.dups == 0); msg != "" {
		r.fail("after %s: %s", where, msg)
	}
}

// checkWhole checks a HELD holder document for all or nothing: one whose caller was told it
// is held (told) has an entry at every counter of its funnel, every part's (a holder named by a
// hand-over is HELD before its entry moves, and is told only after); one of several resources
// has a fence for every part that no other holder of that resource was given.
func (r *runner) checkWhole(ctx context.Context, h bson.M, told bool) string {
	keys, _ := h["keys"].(bson.A)
	pid := fmt.Sprint(h["pid"])
	for _, k := range keys {
		if !told {
			break
		}
		var c struct {
			Slots map[string]bson.Raw `bson:"slots"`
		}
		err := r.raw.Database(r.db).Collection(leasestore.CountersCollection).FindOne(ctx, bson.D{{Key: "_id", Value: k}}).Decode(&c)
		if _, ok := c.Slots[pid]; err != nil || !ok {
			return fmt.Sprintf("HELD holder %v has no entry at %v (%v): granted without every slot", h["holderRef"], k, err)
		}
	}
	parts, _ := h["parts"].(bson.A)
	for _, p := range parts {
		pm := bson.M{}
		if pd, ok := p.(bson.D); ok {
			for _, e := range pd {
				pm[e.Key] = e.Value
			}
		}
		res := fmt.Sprint(pm["resource"])
		fence, _ := pm["fence"].(int64)
		if fence < 1 {
			return fmt.Sprintf("HELD holder %v has no fence for part %s", h["holderRef"], res)
		}
		r.mu.Lock()
		if r.fences[res] == nil {
			r.fences[res] = map[int64]string{}
		}
		other, seen := r.fences[res][fence]
		if !seen {
			r.fences[res][fence] = pid
		}
		r.mu.Unlock()
		if seen && other != pid {
			return fmt.Sprintf("fence %d of %s given to two holders, %s and %s", fence, res, other, pid)
		}
	}
	return ""
}

// heldKeys are the counters a held holder document books.
func heldKeys(h bson.M) []string {
	var out []string
	if ls, ok := h["levels"].(bson.A); ok {
		for _, l := range ls {
			if k := fmt.Sprint(l); !slices.Contains(out, k) {
				out = append(out, k)
			}
		}
	}
	if g, ok := h["grantKey"].(string); ok && !slices.Contains(out, g) {
		out = append(out, g)
	}
	return out
}

// checkModel checks what the store's model promises beyond the held holders: here, that no
// counter counts more than its cap.
func checkModel(ctx context.Context, db *mongo.Database, capOf func(string) int, _ bool) string {
	cur, err := db.Collection(leasestore.CountersCollection).Find(ctx, bson.D{})
	if err != nil {
		return "reading counters: " + err.Error()
	}
	var cs []bson.M
	if err := cur.All(ctx, &cs); err != nil {
		return "reading counters: " + err.Error()
	}
	for _, c := range cs {
		n, _ := c["count"].(int32)
		if cp := capOf(fmt.Sprint(c["_id"])); int(n) > cp && !strings.Contains(fmt.Sprint(c["_id"]), "|tenant|") {
			return fmt.Sprintf("counter %v counts %d, cap %d", c["_id"], n, cp)
		}
	}
	return ""
}

// recover gives up what the live holders hold and checks that every level serves its full
// cap again within the bound after the last fault.
func (r *runner) recover() {
	ctx := context.Background()
	// A crashed process's holders stay: what they hold is what the bound is about.
	dead := map[string]bool{}
	for i, script := range r.sc.procs {
		if r.procs[i].frozen {
			for _, o := range script {
				dead[o.who] = true
			}
		}
	}
	r.mu.Lock()
	var mine []string
	for who, h := range r.held {
		if h && !dead[who] {
			mine = append(mine, r.tokens[who])
		}
	}
	for who, w := range r.waiting {
		if w && !dead[who] {
			mine = append(mine, r.tokens[who])
		}
	}
	r.mu.Unlock()
	for _, tok := range mine {
		ok, err := r.direct.Release(ctx, tok)
		r.logf("    recovery releases %s: %v %v", lease.HolderID(tok), ok, err)
	}
	from := r.lastFault
	if from.IsZero() {
		from = time.Now()
	}
	deadline := from.Add(max(r.sc.ttl, checkerOpTimeout) + recoverySlack)
	if os.Getenv("CHECKER_RUNS") == "" {
		// make test runs the packages side by side on a loaded machine, and recovery is
		// measured in real time: a second more before it fails. make test-robustness
		// (CHECKER_RUNS set) asserts the bound itself.
		deadline = deadline.Add(time.Second)
	}
	for attempt := 0; ; attempt++ {
		// A round of the sweep and a probe take some 10 commands: what counts is when the
		// round began (a round that began within the bound and found the level served is a
		// recovery within it).
		began := time.Now()
		rd, err := r.direct.SweepRound(ctx)
		if err == nil {
			_, _ = r.direct.ReconcileRound(ctx, rd)
		}
		busy := r.probe(attempt)
		if busy == "" {
			r.logf("    recovered %v after the last fault", began.Sub(from).Round(10*time.Millisecond))
			return
		}
		if began.After(deadline) {
			r.fail("%s: not served in full %v after the last fault (bound %v)", busy, time.Since(from).Round(10*time.Millisecond), deadline.Sub(from))
			return
		}
		time.Sleep(100 * time.Millisecond) // real time: recovery is measured against the real TTL and operation timeout
	}
}

// probe acquires every level's full cap with fresh holders and gives them back; it returns
// the first level that refused, "" when all served.
func (r *runner) probe(attempt int) string {
	for _, res := range r.sc.resourceList() {
		if b := r.probeResource(attempt, res); b != "" {
			return b
		}
	}
	return ""
}

// probeResource is probe of one resource.
func (r *runner) probeResource(attempt int, res string) string {
	ctx := context.Background()
	var got []string
	defer func() {
		for _, tok := range got {
			_, _ = r.direct.Release(ctx, tok)
		}
	}()
	try := func(user string) string {
		// A fresh token for every try: a token used before may still name its released
		// holder, whose delete comes off the release's path, and an acquisition with it
		// finds that holder instead of starting a new one.
		r.probes++
		req := r.request(fmt.Sprintf("probe-%d-%d", attempt, r.probes))
		req.LeaseName, req.Resource, req.Caps, req.Parts = res, res, r.sc.caps, nil
		req.User = user
		h, err := r.direct.Acquire(ctx, req)
		var busy *lease.BusyError
		switch {
		case errors.As(err, &busy):
			for _, k := range r.keys() {
				_, _ = r.direct.Repair(ctx, k)
			}
			return busy.Error()
		case err != nil:
			return err.Error()
		}
		got = append(got, h.Token)
		return ""
	}
	// The widest level's cap, with users of their own; then each user of the scenario.
	widest := slices.MaxFunc(r.sc.caps, func(a, b lease.LevelCap) int { return levelRank(a.Level) - levelRank(b.Level) })
	for i := range widest.Cap {
		if b := try(fmt.Sprintf("probe-user-%d", i)); b != "" {
			return b
		}
	}
	for _, tok := range got {
		_, _ = r.direct.Release(ctx, tok)
	}
	got = nil
	seen := map[string]bool{}
	for _, k := range r.keys() {
		if !strings.HasPrefix(k, res+"|user|") {
			continue
		}
		_, u, _ := strings.Cut(k[strings.LastIndex(k, "|")+1:], "/")
		if seen[u] {
			continue
		}
		seen[u] = true
		if b := try(u); b != "" {
			return b
		}
		for _, tok := range got {
			_, _ = r.direct.Release(ctx, tok)
		}
		got = nil
	}
	return ""
}

func levelRank(l lease.Level) int {
	return map[lease.Level]int{lease.LevelUser: 0, lease.LevelProject: 1, lease.LevelTenant: 2, lease.LevelGlobal: 3}[l]
}

// claimMeetsHandOver: a waiter claims room at a level while a release hands it a slot of
// the same level, and a repair runs between (the first interleaving of issue 41). The
// setup leaves W in line with room at its level: it lined up at a full level, lapsed (its
// renewals late), and a release found no live waiter and gave its slot to the counter.
func claimMeetsHandOver() scenario {
	return scenario{
		name: "claim-meets-hand-over",
		caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 2}},
		ttl:  30 * time.Second, waitTTL: 300 * time.Millisecond,
		setup: []op{
			{kind: opAcquire, who: "A"}, {kind: opAcquire, who: "B"}, {kind: opWait, who: "W"},
			{kind: opSleep, d: 400 * time.Millisecond}, {kind: opRelease, who: "B"},
		},
		procs: [][]op{
			{{kind: opResume, who: "W"}, {kind: opResume, who: "W"}},
			{{kind: opRelease, who: "A"}},
			{{kind: opHeal}, {kind: opHeal}},
		},
		after: []op{
			{kind: opResume, who: "W"}, {kind: opAcquire, who: "X"}, {kind: opAcquire, who: "Y"}, {kind: opAcquire, who: "Z"},
		},
		faults: faultPolicy{noCrash: true},
	}
}

// deadWaiterHandedASlot: a waiter dies right after it lines up; a release hands it the slot
// before its TTL ends (the second finding of issue 41).
func deadWaiterHandedASlot(crashCmd int) scenario {
	return scenario{
		name: fmt.Sprintf("dead-waiter-handed-a-slot(crash after command %d)", crashCmd),
		caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}},
		ttl:  3 * time.Second, waitTTL: 30 * time.Second,
		setup: []op{{kind: opAcquire, who: "A"}},
		procs: [][]op{
			{{kind: opWait, who: "W"}},
			{{kind: opSleep, d: 2500 * time.Millisecond}, {kind: opRelease, who: "A"}},
		},
		faults:  faultPolicy{noCrash: true},
		crashAt: &crashPoint{proc: 0, cmd: crashCmd, after: true},
	}
}

// oppositeOrders: two acquisitions of the same two resources, named in opposite orders,
// and a single acquisition of each resource, every one waiting in line; no faults. Both
// acquisitions of two must be granted in the end: none waits for a slot the other holds
// while holding one it needs.
func oppositeOrders() scenario {
	both := []string{"a", "b"}
	return scenario{
		name: "opposite-orders",
		caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}},
		ttl:  30 * time.Second, waitTTL: 30 * time.Second,
		resources: both,
		wants:     map[string][]string{"AB": both, "BA": {"b", "a"}, "SA": {"a"}, "SB": {"b"}},
		procs: [][]op{
			{{kind: opWait, who: "AB"}, {kind: opResume, who: "AB"}, {kind: opRelease, who: "AB"}},
			{{kind: opWait, who: "BA"}, {kind: opResume, who: "BA"}, {kind: opRelease, who: "BA"}},
			{{kind: opWait, who: "SA"}, {kind: opWait, who: "SB"}, {kind: opRelease, who: "SA"}, {kind: opRelease, who: "SB"}},
		},
		after:  rounds(5, "SA", "SB", "AB", "BA"),
		finish: []string{"AB", "BA", "SA", "SB"},
		faults: faultPolicy{noCrash: true},
	}
}

// rounds are n rounds in which every holder of who looks once (renewal and one try), then
// releases what it holds: whoever is still in line after the scripts is served as the others
// finish.
func rounds(n int, who ...string) []op {
	var out []op
	for range n {
		for _, w := range who {
			out = append(out, op{kind: opResume, who: w})
		}
		for _, w := range who {
			out = append(out, op{kind: opRelease, who: w})
		}
	}
	return out
}

// randomPartsScenario draws a small scenario over two resources: holders of one resource and
// of both (in either order), with faults of every kind.
func randomPartsScenario(rng *rand.Rand) scenario {
	sc := randomScenario(rng)
	sc.name = "random-parts"
	sc.resources = []string{"a", "b"}
	sc.wants = map[string][]string{}
	for _, n := range []string{"A", "B", "C", "D", "E", "F", "G"} {
		sc.wants[n] = [][]string{{"a"}, {"b"}, {"a", "b"}, {"b", "a"}}[rng.IntN(4)]
	}
	return sc
}

// randomScenario draws a small scenario: one or two levels, three processes with short
// scripts of every call, faults of every kind.
func randomScenario(rng *rand.Rand) scenario {
	caps := []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1 + rng.IntN(2)}}
	if rng.IntN(2) == 0 {
		caps = append(caps, lease.LevelCap{Level: lease.LevelUser, Cap: 1})
	}
	users := map[string]string{}
	names := []string{"A", "B", "C", "D", "E", "F", "G"}
	for _, n := range names {
		users[n] = []string{"u1", "u2", "u3"}[rng.IntN(3)]
	}
	sc := scenario{
		name: "random", caps: caps, users: users,
		ttl: 2 * time.Second, waitTTL: 30 * time.Second,
		setup:  []op{{kind: opAcquire, who: "A"}},
		faults: faultPolicy{crash: 0.03, lose: 0.04, dup: 0.03, maxLose: 2, maxDup: 1},
	}
	for p := range 3 {
		var script []op
		for i := range 2 + rng.IntN(2) {
			who := names[1+2*p+i%2]
			switch rng.IntN(6) {
			case 0:
				script = append(script, op{kind: opAcquire, who: who})
			case 1, 2:
				script = append(script, op{kind: opWait, who: who}, op{kind: opResume, who: who})
			case 3:
				script = append(script, op{kind: opRelease, who: []string{"A", who}[rng.IntN(2)]})
			case 4:
				script = append(script, op{kind: opHeal})
			case 5:
				script = append(script, op{kind: opSweep})
			}
		}
		for _, o := range script {
			if o.kind == opAcquire || o.kind == opWait {
				script = append(script, op{kind: opRelease, who: o.who})
			}
		}
		sc.procs = append(sc.procs, script)
	}
	return sc
}

// checkerRuns is how many random schedules a scenario gets: a bounded part in make test,
// CHECKER_RUNS (make test-robustness) for the longer part.
func checkerRuns(short int) int {
	if n, err := strconv.Atoi(os.Getenv("CHECKER_RUNS")); err == nil && n > 0 {
		return n
	}
	return short
}

func TestInterleavingsKeepTheCap(t *testing.T) {
	c := newChecker(t)
	sc := claimMeetsHandOver()
	o, n := c.explore(sc, 1, checkerRuns(60))
	if o.violation != "" {
		t.Fatalf("after %d schedules: %s", n, c.report(sc, o))
	}
	t.Logf("%s: %d schedules, no violation", sc.name, n)
}

func TestDeadWaiterRecoversWithinTheBound(t *testing.T) {
	c := newChecker(t)
	for cmd := 1; cmd <= 6; cmd++ {
		sc := deadWaiterHandedASlot(cmd)
		o := c.run(sc, 1, nil)
		if o.violation != "" {
			t.Errorf("%s", c.report(sc, o))
		}
	}
}

// TestOppositeOrdersNeverDeadlock: under every schedule explored, two acquisitions of the
// same two resources in opposite orders, with single acquisitions of each beside them, are
// all granted, and no level holds more than its cap.
func TestOppositeOrdersNeverDeadlock(t *testing.T) {
	c := newChecker(t)
	sc := oppositeOrders()
	o, n := c.explore(sc, 1, checkerRuns(20))
	if o.violation != "" {
		t.Fatalf("after %d schedules: %s", n, c.report(sc, o))
	}
	t.Logf("%s: %d schedules, no violation", sc.name, n)
}

// TestPartsCrashAtEveryCommand: an acquisition of two resources whose process dies after any
// of its commands (the holder written, each booking and record, each fence, the grant) leaves
// no holder granted without every slot, and both resources serve their caps again within the
// recovery bound; a single acquisition of one of them runs beside it.
func TestPartsCrashAtEveryCommand(t *testing.T) {
	c := newChecker(t)
	cmd := 1
	for ; ; cmd++ {
		sc := scenario{
			name: fmt.Sprintf("parts-crash(after command %d)", cmd),
			caps: []lease.LevelCap{{Level: lease.LevelGlobal, Cap: 1}},
			ttl:  time.Second, waitTTL: 30 * time.Second,
			resources: []string{"a", "b"},
			wants:     map[string][]string{"AB": {"b", "a"}, "S": {"b"}},
			procs: [][]op{
				{{kind: opWait, who: "AB"}, {kind: opResume, who: "AB"}},
				{{kind: opWait, who: "S"}, {kind: opResume, who: "S"}, {kind: opRelease, who: "S"}},
			},
			faults:  faultPolicy{noCrash: true},
			crashAt: &crashPoint{proc: 0, cmd: cmd, after: true},
		}
		o := c.run(sc, uint64(cmd), nil)
		if o.violation != "" {
			t.Errorf("%s", c.report(sc, o))
		}
		if !o.crashed { // past its last command: every crash point is done
			break
		}
	}
	if cmd < 8 {
		t.Fatalf("only %d crash points: the acquisition sends more commands than that", cmd-1)
	}
	t.Logf("%d crash points, no violation", cmd-1)
}

// TestOppositeOrdersDeadlockInRequestOrder shows that the checker finds the deadlock the order
// of resources prevents: with the parts booked in the order requested, some schedule leaves
// each acquisition holding the slot the other waits for.
func TestOppositeOrdersDeadlockInRequestOrder(t *testing.T) {
	defer leasestore.BookPartsInRequestOrder()()
	c := newChecker(t)
	sc := oppositeOrders()
	o, n := c.explore(sc, 1, 40)
	if !strings.Contains(o.violation, "deadlock") {
		t.Fatalf("no deadlock in %d schedules with the parts in request order: %q", n, o.violation)
	}
	t.Logf("found after %d schedules: %s", n, o.violation)
}

func TestRandomPartsInterleavingsWithFaults(t *testing.T) {
	c := newChecker(t)
	runs := checkerRuns(10)
	for i := range runs {
		seed := uint64(5000 + i)
		sc := randomPartsScenario(rand.New(rand.NewPCG(seed, 7)))
		o := c.run(sc, seed, nil)
		if o.violation != "" {
			o = c.shrink(sc, seed, o)
			t.Fatalf("seed %d: %s", seed, c.report(sc, o))
		}
	}
	t.Logf("%d random scenarios over two resources, no violation", runs)
}

func TestRandomInterleavingsWithFaults(t *testing.T) {
	c := newChecker(t)
	runs := checkerRuns(20)
	for i := range runs {
		seed := uint64(1000 + i)
		sc := randomScenario(rand.New(rand.NewPCG(seed, 7)))
		o := c.run(sc, seed, nil)
		if o.violation != "" {
			o = c.shrink(sc, seed, o)
			t.Fatalf("seed %d: %s", seed, c.report(sc, o))
		}
	}
	t.Logf("%d random scenarios, no violation", runs)
}
