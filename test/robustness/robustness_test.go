//go:build robustness

package robustness

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/vancetope/lease-operator/internal/testutil/testenv"
)

// The suite's knobs: flags (go test -tags robustness ./test/robustness -args -seed 7), each
// defaulting to an environment variable that the Makefile sets.
var (
	flagSeed     = flag.Int64("seed", envInt("ROBUSTNESS_SEED", 1), "first seed (ROBUSTNESS_SEED); a failing run prints the seed that reproduces it")
	flagSeeds    = flag.Int("seeds", int(envInt("ROBUSTNESS_SEEDS", 1)), "number of seeds from -seed on (ROBUSTNESS_SEEDS)")
	flagChurn    = flag.Duration("churn", envDuration("ROBUSTNESS_CHURN", 4*time.Second), "churn of each episode (ROBUSTNESS_CHURN)")
	flagCallers  = flag.Int("callers", int(envInt("ROBUSTNESS_CALLERS", 6)), "callers per process (ROBUSTNESS_CALLERS)")
	flagFairness = flag.String("fairness", envString("ROBUSTNESS_FAIRNESS", "process,global"), "fairness policies to run (ROBUSTNESS_FAIRNESS)")
	flagFaults   = flag.String("faults", envString("ROBUSTNESS_FAULTS", strings.Join(FaultKinds, ",")), "fault kinds, one episode each (ROBUSTNESS_FAULTS)")
	flagAssert   = flag.Bool("assert-recovery", envString("ROBUSTNESS_ASSERT_RECOVERY", "on") != "off", "fail a run whose recovery exceeds TTL + 2 s (ROBUSTNESS_ASSERT_RECOVERY=off to only report)")
	flag503      = flag.Bool("assert-false-503", envString("ROBUSTNESS_ASSERT_FALSE_503", "on") != "off", "fail a run with a 503 while the store ran (ROBUSTNESS_ASSERT_FALSE_503=off to only report)")
	flagStuck    = flag.Duration("give-up", envDuration("ROBUSTNESS_GIVE_UP", 10*time.Second), "how long past TTL + 2 s the probe keeps trying before it calls a level stuck (ROBUSTNESS_GIVE_UP)")
	flagOut      = flag.String("out", os.Getenv("ROBUSTNESS_OUT"), "where failing runs leave their history (default $TMPDIR); each seed gets robustness-<seed> in it (ROBUSTNESS_OUT)")
)

func envString(key, def string) string {
	if v := os.Getenv(key); v != "" {
		return v
	}
	return def
}

func envInt(key string, def int64) int64 {
	if v, err := strconv.ParseInt(os.Getenv(key), 10, 64); err == nil {
		return v
	}
	return def
}

func envDuration(key string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(key)); err == nil {
		return v
	}
	return def
}

const (
	levelCap   = 2
	ttlSeconds = 5
	ttl        = ttlSeconds * time.Second
	// target is the recovery the issue asks for (docs/robustness.md): TTL + 2 s.
	target = ttl + 2*time.Second
)

// episodeResult is what one episode (one fault kind under one fairness policy) measured.
type episodeResult struct {
	Seed     int64  `json:"seed"`
	Fairness string `json:"fairness"`
	Fault    string `json:"fault"`
	Resource string `json:"resource"`
	Faults   int    `json:"faults"`
	// Answers counts the churn's acquisitions; Grants those granted.
	Answers int `json:"answers"`
	Grants  int `json:"grants"`
	// AboveCap counts grants that began while the cap was held (client-side intervals).
	AboveCap int `json:"aboveCap"`
	// Model is porcupine's verdict on the episode's history.
	Model string `json:"model"`
	// False503 counts 503s while the store ran; All503 every 503.
	False503 int `json:"false503"`
	All503   int `json:"all503"`
	// Recovery is from the last fault to a probe that took the full cap on every process
	// and was refused one more; Stuck when that never happened within the bound. When a
	// holder its caller never released was renewed after the last fault (a check answered
	// 200), Recovery runs from that renewal, RenewedAfter after the fault.
	Recovery     time.Duration   `json:"recovery"`
	RenewedAfter time.Duration   `json:"renewedAfter,omitempty"`
	PerProcess   []time.Duration `json:"perProcess"`
	Stuck        bool            `json:"stuck"`
	StuckState   string          `json:"stuckState,omitempty"`
	Wedged       bool            `json:"wedged"`
}

var (
	resultsMu sync.Mutex
	results   []episodeResult
)

func TestRobustness(t *testing.T) {
	assets := testenv.AssetsOrSkip(t)
	ctx := context.Background()
	c := startCluster(ctx, t, assets)
	faults := strings.Split(*flagFaults, ",")
	for _, fairness := range strings.Split(*flagFairness, ",") {
		for seed := *flagSeed; seed < *flagSeed+int64(*flagSeeds); seed++ {
			t.Run(fmt.Sprintf("fairness=%s/seed=%d", fairness, seed), func(t *testing.T) {
				if err := c.ensureRunning(ctx); err != nil {
					t.Fatal(err)
				}
				runSeed(ctx, t, c, fairness, seed, faults)
			})
		}
	}
	summarize(t)
}

// runSeed runs one episode per fault kind, in an order the seed chooses, on a lease of its
// own each, then checks the whole history.
func runSeed(ctx context.Context, t *testing.T, c *cluster, fairness string, seed int64, kinds []string) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x5eed))
	kinds = slices.Clone(kinds)
	rng.Shuffle(len(kinds), func(i, j int) { kinds[i], kinds[j] = kinds[j], kinds[i] })
	rec := &recorder{origin: time.Now()}
	hist := &History{Seed: seed, Fairness: fairness, TTL: ttl, Caps: map[string]int{}, Episodes: map[string]string{}}
	var eps []episodeResult
	for n, kind := range kinds {
		resource := fmt.Sprintf("rb-%s-%d-%d-%d", fairness, seed, n, time.Now().UnixNano()%100000)
		hist.Caps[resource], hist.Episodes[resource] = levelCap, kind
		if err := c.define(ctx, resource, fairness, levelCap, ttlSeconds); err != nil {
			t.Fatal(err)
		}
		if err := waitDefined(ctx, c, rec, resource); err != nil {
			t.Fatal(err)
		}
		res := runEpisode(ctx, t, c, rec, rng, fairness, seed, n, kind, resource)
		eps = append(eps, res)
		if res.Wedged || !allRunning(c) {
			if err := c.ensureRunning(ctx); err != nil {
				t.Fatal(err)
			}
		}
	}

	rec.mu.Lock()
	hist.Entries, hist.Faults = slices.Clone(rec.calls), slices.Clone(rec.faults)
	rec.mu.Unlock()
	model := NewModel(hist.Caps, ttl, 100*time.Millisecond)
	ops := ModelOperations(hist.Entries)
	verdict, info := porcupine.CheckOperationsVerbose(model, ops, 2*time.Minute)
	overlaps := HoldingOverlaps(hist.Entries, hist.Caps)
	false503 := FalseUnavailable(hist.Entries, hist.Faults)
	failed := false
	for i := range eps {
		r := &eps[i]
		var epOps []porcupine.Operation
		for _, op := range ops {
			if op.Input.(ModelInput).Resource == r.Resource {
				epOps = append(epOps, op)
			}
		}
		r.Model = string(porcupine.CheckOperationsTimeout(model, epOps, time.Minute))
		for _, o := range overlaps {
			if o.Resource == r.Resource {
				r.AboveCap++
			}
		}
		for _, e := range false503 {
			if e.Resource == r.Resource {
				r.False503++
			}
		}
		for _, e := range hist.Entries {
			if e.Resource != r.Resource {
				continue
			}
			if e.Answer.Status == http.StatusServiceUnavailable {
				r.All503++
			}
			if e.Op == OpAcquire && !e.Probe {
				r.Answers++
				if e.Answer.Status == http.StatusOK {
					r.Grants++
				}
			}
		}
		t.Logf("episode %d %-15s: %d faults, %d acquisitions, %d grants, above cap %d, model %s, 503s %d (false %d), recovery %s%s%s",
			i, r.Fault, r.Faults, r.Answers, r.Grants, r.AboveCap, r.Model, r.All503, r.False503, fmtRecovery(*r),
			map[bool]string{true: ", STORE WEDGED"}[r.Wedged], map[bool]string{true: "\n" + r.StuckState}[r.Stuck])
		switch {
		case r.AboveCap > 0:
			t.Errorf("%s: %d grants above the cap of %d (client-side holding intervals)", r.Fault, r.AboveCap, levelCap)
			failed = true
		case r.Model == string(porcupine.Illegal):
			t.Errorf("%s: the history violates the model", r.Fault)
			failed = true
		}
		if r.Wedged {
			t.Errorf("%s: the development store wedged", r.Fault)
			failed = true
		}
		if *flagAssert && (r.Stuck || r.Recovery > target) {
			t.Errorf("%s: recovery %s, the target is at most TTL + 2 s = %v", r.Fault, fmtRecovery(*r), target)
			failed = true
		}
		if *flag503 && r.False503 > 0 {
			t.Errorf("%s: %d answers 503 LEASE_UNAVAILABLE while the store ran", r.Fault, r.False503)
			failed = true
		}
	}
	if verdict == porcupine.Unknown {
		t.Logf("porcupine did not decide the whole history within its bound")
	}
	resultsMu.Lock()
	results = append(results, eps...)
	resultsMu.Unlock()
	if failed || os.Getenv("ROBUSTNESS_KEEP") != "" {
		dir := outDir(seed)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := hist.WriteJSON(filepath.Join(dir, fairness+"-history.json")); err != nil {
			t.Error(err)
		}
		annotate(&info, hist)
		if err := porcupine.VisualizePath(model, info, filepath.Join(dir, fairness+"-porcupine.html")); err != nil {
			t.Error(err)
		}
		t.Logf("robustness: history and visualisation in %s; reproduce with ROBUSTNESS_SEED=%d ROBUSTNESS_FAIRNESS=%s make test-robustness-short (or -seed %d -fairness %s)",
			dir, seed, fairness, seed, fairness)
	}
}

// outDir is where a seed's failing runs leave their history.
func outDir(seed int64) string {
	base := *flagOut
	if base == "" {
		base = os.TempDir()
	}
	return filepath.Join(base, fmt.Sprintf("robustness-%d", seed))
}

// annotate adds the faults to the visualisation.
func annotate(info *porcupine.LinearizationInfo, h *History) {
	var as []porcupine.Annotation
	for _, f := range h.Faults {
		end := max(f.End, f.Ready, f.Start+1)
		as = append(as, porcupine.Annotation{Tag: "faults", Start: f.Start, End: end,
			Description: f.Kind + " " + f.Target, BackgroundColor: "#f4cccc"})
	}
	info.AddAnnotations(as)
}

func fmtRecovery(r episodeResult) string {
	if r.Stuck {
		return fmt.Sprintf("STUCK (> %v)", r.Recovery.Round(100*time.Millisecond))
	}
	if r.RenewedAfter > 0 {
		return fmt.Sprintf("%s (from a holder's renewal %s after the last fault; %s from the fault)",
			r.Recovery.Round(10*time.Millisecond), r.RenewedAfter.Round(10*time.Millisecond),
			(r.Recovery + r.RenewedAfter).Round(10*time.Millisecond))
	}
	return r.Recovery.Round(10 * time.Millisecond).String()
}

func allRunning(c *cluster) bool {
	if !c.store.running() {
		return false
	}
	for i := range 3 {
		if !c.process(i).running() {
			return false
		}
	}
	return true
}

// waitDefined waits until every process grants the new lease (its definition reached them).
func waitDefined(ctx context.Context, c *cluster, rec *recorder, resource string) error {
	deadline := time.Now().Add(30 * time.Second)
	for p := range 3 {
		cl := newCaller(200+p, p, c.apiAddrs[p], callerIP, rec)
		for {
			// Not recorded: these calls come before the episode's history.
			callCtx, cancel := context.WithTimeout(ctx, requestTimeout)
			a := cl.send(callCtx, http.MethodPost, "/v1/leases", []byte(fmt.Sprintf(
				`{"type":"tex","lease":%q,"project":"p%d","waitMs":0}`, resource, p)))
			cancel()
			// A lease the process does not know yet may answer {"noop":true}: no token.
			if a.Status == http.StatusOK && a.Token != "" {
				callCtx, cancel := context.WithTimeout(ctx, requestTimeout)
				r := cl.send(callCtx, http.MethodDelete, "/v1/leases/"+a.Token, nil)
				cancel()
				if r.Status != http.StatusOK {
					return fmt.Errorf("releasing the first lease of %s on process %d: %+v", resource, p, r)
				}
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("process %d does not grant %s within 30 s: %+v", p, resource, a)
			}
			time.Sleep(100 * time.Millisecond) // real time: the definition reaches the process
		}
	}
	return nil
}

// runEpisode churns with faults of one kind at moments the seed chooses, then measures the
// recovery.
func runEpisode(ctx context.Context, t *testing.T, c *cluster, rec *recorder, rng *rand.Rand,
	fairness string, seed int64, n int, kind, resource string) episodeResult {
	res := episodeResult{Seed: seed, Fairness: fairness, Fault: kind, Resource: resource}
	var callers []*caller
	for p := range 3 {
		for range *flagCallers {
			callers = append(callers, newCaller(len(callers), p, c.apiAddrs[p], callerIP, rec))
		}
	}
	churnCtx, stopChurn := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for _, cl := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl.churn(churnCtx, resource, uint64(seed)<<8|uint64(n))
		}()
	}
	begin := time.Now()
	plan := planFaults(rng, kind, *flagChurn)
	lastFault := int64(0)
	for _, f := range plan {
		pause(ctx, time.Until(begin.Add(f.at)))
		fault := inject(ctx, t, c, rec, rng, f)
		fault.Episode = n
		rec.fault(fault)
		res.Faults++
		// The moment from which the level must recover: the kill, the SIGCONT, the end of
		// the cut deadlines.
		lastFault = max(lastFault, fault.End)
	}
	pause(ctx, time.Until(begin.Add(*flagChurn)))
	stopChurn()
	wg.Wait()
	// A holder whose caller checked it after the last fault, and then stopped without
	// releasing it (its release had failed, the churn ended), is reaped a TTL after that
	// check: the bound runs from the later of the two.
	from := lastFault
	if life := rec.lastLife(resource); life > lastFault {
		from, res.RenewedAfter = life, time.Duration(life-lastFault)
	}
	recoverLevel(ctx, t, c, rec, &res, from)
	return res
}

// plannedFault is one fault of an episode's plan.
type plannedFault struct {
	at   time.Duration // since the churn began
	kind string
	dur  time.Duration // a store stop's length, a window of cut deadlines
}

// planFaults chooses when the faults of an episode happen: within the churn, leaving its
// last 1.5 s free so that the churn goes on after the last fault.
func planFaults(rng *rand.Rand, kind string, churn time.Duration) []plannedFault {
	window := max(churn-2*time.Second, 500*time.Millisecond)
	at := func() time.Duration { return 500*time.Millisecond + time.Duration(rng.Int64N(int64(window))) }
	var plan []plannedFault
	switch kind {
	case FaultStoreStop:
		// Three to six stops of 0.2–0.6 s, one after the other.
		next := 300 * time.Millisecond
		for range 3 + rng.IntN(4) {
			d := time.Duration(200+rng.IntN(401)) * time.Millisecond
			next += time.Duration(rng.Int64N(int64(window / 4)))
			plan = append(plan, plannedFault{at: next, kind: kind, dur: d})
			next += d
		}
	case FaultDeadline:
		plan = append(plan, plannedFault{at: at(), kind: kind, dur: time.Duration(1000+rng.IntN(1001)) * time.Millisecond})
	case FaultAgentKill:
		for range 1 + rng.IntN(2) {
			plan = append(plan, plannedFault{at: at(), kind: kind})
		}
	default:
		plan = append(plan, plannedFault{at: at(), kind: kind})
	}
	slices.SortFunc(plan, func(a, b plannedFault) int { return int(a.at - b.at) })
	return plan
}

// inject injects one fault and returns it as recorded.
func inject(ctx context.Context, t *testing.T, c *cluster, rec *recorder, rng *rand.Rand, f plannedFault) Fault {
	switch f.kind {
	case FaultStoreStop:
		start := rec.now()
		if err := c.store.signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		time.Sleep(f.dur) // real time: the store stays stopped this long
		if err := c.store.signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		return Fault{Kind: f.kind, Target: "mongodev", Start: start, End: rec.now()}
	case FaultDeadline:
		start := rec.now()
		rec.shortUntil.Store(start + int64(f.dur))
		return Fault{Kind: f.kind, Target: "callers", Start: start, End: start + int64(f.dur)}
	case FaultAgentKill, FaultManagerRestart:
		i := 0
		sig := syscall.SIGKILL
		if f.kind == FaultAgentKill {
			i = 1 + rng.IntN(2)
		} else if rng.IntN(2) == 0 {
			sig = syscall.SIGTERM
		}
		p := c.process(i)
		at := rec.now()
		if err := p.kill(sig); err != nil {
			t.Error(err)
		}
		killed := rec.now()
		pause(ctx, time.Duration(200+rng.IntN(800))*time.Millisecond)
		if err := p.start(); err != nil {
			t.Fatal(err)
		}
		if err := c.waitReady(ctx, i, 90*time.Second); err != nil {
			t.Fatal(err)
		}
		end := at
		if sig == syscall.SIGTERM {
			end = killed // a graceful stop may still release until it exits
		}
		return Fault{Kind: f.kind, Target: p.name + " " + sig.String(), Start: at, End: end, Ready: rec.now()}
	}
	t.Fatalf("unknown fault kind %q", f.kind)
	return Fault{}
}

// recoverLevel measures the time from from (the last fault, or a later renewal of a holder
// its caller never released) until every process can take the full cap at once (waitMs 0)
// and is refused one more (409), giving up at TTL + 2 s plus the give-up bound.
func recoverLevel(ctx context.Context, t *testing.T, c *cluster, rec *recorder, res *episodeResult, from int64) {
	for i := range 3 {
		if err := c.waitReady(ctx, i, 90*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	probers := make([]*caller, 3)
	for p := range probers {
		probers[p] = newCaller(100+p, p, c.apiAddrs[p], callerIP, rec)
	}
	res.PerProcess = make([]time.Duration, 3)
	passed := make([]bool, 3)
	giveUp := from + int64(target+*flagStuck)
	storeLog := logSize(c.store.logPath)
	var last []Answer
	for {
		last = last[:0]
		for p, pr := range probers {
			ok, answers := probe(ctx, pr, res.Resource)
			last = append(last, answers...)
			if ok && !passed[p] {
				passed[p] = true
				res.PerProcess[p] = time.Duration(rec.now() - from)
			}
			if !ok {
				passed[p] = false
			}
		}
		if !slices.Contains(passed, false) {
			res.Recovery = slices.Max(res.PerProcess)
			return
		}
		if rec.now() > giveUp {
			break
		}
		time.Sleep(100 * time.Millisecond) // real time: the level heals by the store's clock (TTL)
	}
	res.Stuck = true
	res.Recovery = time.Duration(rec.now() - from)
	unavailable := 0
	for _, a := range last {
		if a.Status == http.StatusServiceUnavailable {
			unavailable++
		}
	}
	locked := strings.Contains(logSince(c.store.logPath, storeLog), "database is locked")
	for _, p := range []*proc{c.manager, c.agents[0], c.agents[1]} {
		locked = locked || strings.Contains(logSince(p.logPath, 0), "database is locked")
	}
	res.Wedged = unavailable > 0 && locked
	var b strings.Builder
	for _, a := range last {
		fmt.Fprintf(&b, "  last probe answer: %d %s\n", a.Status, a.Message)
	}
	res.StuckState = b.String() + c.dumpStore(res.Resource)
}

// probe takes the full cap on one process with waitMs 0, asks for one more (which must be
// refused 409) and releases what it took.
func probe(ctx context.Context, pr *caller, resource string) (bool, []Answer) {
	var tokens []string
	var answers []Answer
	ok := true
	for range levelCap + 1 {
		a := pr.do(ctx, Call{Op: OpAcquire, Resource: resource, WaitMs: 0, Probe: true}, requestTimeout)
		answers = append(answers, a)
		if a.Status == http.StatusOK {
			tokens = append(tokens, a.Token)
		}
	}
	if len(tokens) != levelCap || answers[levelCap].Status != http.StatusConflict {
		ok = false
	}
	for _, tok := range tokens {
		pr.do(ctx, Call{Op: OpRelease, Resource: resource, Token: tok, Probe: true}, requestTimeout)
	}
	return ok, answers
}

// summarize prints the table of fault × fairness over every run of this invocation and
// writes it as JSON beside the histories.
func summarize(t *testing.T) {
	resultsMu.Lock()
	defer resultsMu.Unlock()
	if len(results) == 0 {
		return
	}
	type key struct{ fault, fairness string }
	type row struct {
		runs, aboveCap, violations, undecided, false503, answers, stuck, wedged int
		maxRecovery                                                             time.Duration
	}
	rows := map[key]*row{}
	for _, r := range results {
		k := key{r.Fault, r.Fairness}
		if rows[k] == nil {
			rows[k] = &row{}
		}
		x := rows[k]
		x.runs++
		x.aboveCap += r.AboveCap
		if r.Model == string(porcupine.Illegal) {
			x.violations++
		}
		if r.Model == string(porcupine.Unknown) {
			x.undecided++
		}
		x.false503 += r.False503
		x.answers += r.Answers
		if r.Stuck {
			x.stuck++
		}
		if r.Wedged {
			x.wedged++
		}
		x.maxRecovery = max(x.maxRecovery, r.Recovery)
	}
	var b strings.Builder
	b.WriteString("| fault | fairness | runs | grants above cap | model violations | false 503s (of acquisitions) | recovery max | stuck | store wedges |\n|---|---|---|---|---|---|---|---|---|\n")
	for _, f := range FaultKinds {
		for _, fair := range []string{"process", "global"} {
			x := rows[key{f, fair}]
			if x == nil {
				continue
			}
			rmax := x.maxRecovery.Round(100 * time.Millisecond).String()
			if x.stuck > 0 {
				rmax = "> " + rmax
			}
			fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d (of %d) | %s | %d of %d | %d |\n",
				f, fair, x.runs, x.aboveCap, x.violations, x.false503, x.answers, rmax, x.stuck, x.runs, x.wedged)
		}
	}
	t.Logf("robustness summary (target: recovery ≤ %v):\n%s", target, b.String())
	base := *flagOut
	if base == "" {
		base = os.TempDir()
	}
	data, _ := json.MarshalIndent(results, "", " ")
	path := filepath.Join(base, "robustness-summary.json")
	if err := os.WriteFile(path, data, 0o644); err == nil {
		t.Logf("robustness: every episode's figures in %s", path)
	}
}
