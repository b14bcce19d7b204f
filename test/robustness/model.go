package robustness

import (
	"cmp"
	"fmt"
	"hash/fnv"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/anishathalye/porcupine"
)

// The model of the lease system that every history is checked against (docs/robustness.md,
// "The model"). Its state is the set of holders a caller may still hold, each with the
// earliest moment its last touch (the grant, or a check that answered 200) can have happened.
//
//   - A grant is legal only when fewer than the cap of its resource's holders are surely
//     live at that point: a holder surely lives until its release, unless its TTL since its
//     last touch may have run out (the idle reap may then have taken it).
//   - A check that answers 200 needs its holder in the state; it touches it. One that answers
//     410 LEASE_LOST is legal only when the holder is gone, may have expired, or had a release
//     whose answer was lost; the holder is then gone for good.
//   - A release that answers "ok" needs its holder in the state; "already-released" the same
//     as a 410.
//
// Calls whose answer cannot change the state are left out of what the checker sees: refusals
// (409, 503, 4xx) of an acquisition, and acquisitions whose answer was lost or never sent (a
// lost grant books a slot that no caller names: leaving it out can hide an overbooking, never
// invent one). A check or a release whose answer was lost, or that answered 503, may have
// taken effect: a release marks its holder "maybe gone" (no longer counted, 410 allowed); a
// check changes nothing the model relies on.

// ModelInput is one call as the model sees it: the operation, its resource and token, and
// the call's own interval (ns), which the TTL rules need.
type ModelInput struct {
	Op       string
	Resource string
	Token    string
	Call     int64
	Return   int64
	Client   int
}

// ModelOutput is the answer as the model sees it.
type ModelOutput struct {
	// Kind is granted, ok, already-released, lost, or unknown (a check or release that may or
	// may not have taken effect).
	Kind  string
	Token string
}

// Output kinds.
const (
	OutGranted         = "granted"
	OutOK              = "ok"
	OutAlreadyReleased = "already-released"
	OutLost            = "lost"
	OutUnknown         = "unknown"
)

// holder is one lease of the model's state.
type holder struct {
	Token    string
	Resource string
	// TouchLo is the earliest the last touch can have been: the call time of the grant or of
	// the last check that answered 200.
	TouchLo int64
	// MaybeGone is set by a release whose answer was lost.
	MaybeGone bool
}

// modelState is the sorted (by token) list of holders; steps never mutate it.
type modelState []holder

// NewModel returns the porcupine model for caps (resource → cap) and ttl. slack widens the
// TTL rule, for the distance between the store's clock and the test's.
func NewModel(caps map[string]int, ttl, slack time.Duration) porcupine.Model {
	expiry := int64(ttl - slack)
	mayHaveExpired := func(h holder, at int64) bool { return at-h.TouchLo >= expiry }
	find := func(s modelState, token string) int {
		i, ok := slices.BinarySearchFunc(s, token, func(h holder, t string) int { return strings.Compare(h.Token, t) })
		if !ok {
			return -1
		}
		return i
	}
	without := func(s modelState, i int) modelState {
		return slices.Delete(slices.Clone(s), i, i+1)
	}
	with := func(s modelState, i int, h holder) modelState {
		c := slices.Clone(s)
		c[i] = h
		return c
	}
	// gone is the step of an answer saying the holder is not there (410, already-released).
	gone := func(s modelState, in ModelInput) (bool, modelState) {
		i := find(s, in.Token)
		if i < 0 {
			return true, s
		}
		if h := s[i]; h.MaybeGone || mayHaveExpired(h, in.Return) {
			return true, without(s, i)
		}
		return false, s
	}
	step := func(state, input, output any) (bool, any) {
		s, in, out := state.(modelState), input.(ModelInput), output.(ModelOutput)
		switch in.Op {
		case OpAcquire:
			if out.Kind != OutGranted {
				return true, s
			}
			if find(s, out.Token) >= 0 {
				return false, s // a token granted twice
			}
			live := 0
			for _, h := range s {
				if h.Resource == in.Resource && !h.MaybeGone && !mayHaveExpired(h, in.Return) {
					live++
				}
			}
			if live >= caps[in.Resource] {
				return false, s
			}
			c := append(slices.Clone(s), holder{Token: out.Token, Resource: in.Resource, TouchLo: in.Call})
			sort.Slice(c, func(a, b int) bool { return c[a].Token < c[b].Token })
			return true, c
		case OpCheck:
			switch out.Kind {
			case OutOK:
				i := find(s, in.Token)
				if i < 0 {
					return false, s // a lost or released lease answered 200
				}
				h := s[i]
				h.TouchLo = max(h.TouchLo, in.Call)
				return true, with(s, i, h)
			case OutLost:
				ok, next := gone(s, in)
				return ok, next
			default:
				return true, s
			}
		case OpRelease:
			switch out.Kind {
			case OutOK:
				i := find(s, in.Token)
				if i < 0 {
					return false, s // released something that was gone
				}
				return true, without(s, i)
			case OutAlreadyReleased:
				ok, next := gone(s, in)
				return ok, next
			case OutUnknown:
				i := find(s, in.Token)
				if i < 0 {
					return true, s
				}
				h := s[i]
				h.MaybeGone = true
				return true, with(s, i, h)
			default:
				return true, s
			}
		}
		return false, s
	}
	return porcupine.Model{
		Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
			byResource := map[string][]porcupine.Operation{}
			for _, op := range history {
				r := op.Input.(ModelInput).Resource
				byResource[r] = append(byResource[r], op)
			}
			keys := make([]string, 0, len(byResource))
			for k := range byResource {
				keys = append(keys, k)
			}
			slices.Sort(keys)
			parts := make([][]porcupine.Operation, 0, len(keys))
			for _, k := range keys {
				parts = append(parts, byResource[k])
			}
			return parts
		},
		Init: func() any { return modelState(nil) },
		Step: step,
		Equal: func(a, b any) bool {
			return slices.Equal(a.(modelState), b.(modelState))
		},
		Hash: func(state any) uint64 {
			h := fnv.New64a()
			for _, x := range state.(modelState) {
				_, _ = fmt.Fprintf(h, "%s/%d/%t;", x.Token, x.TouchLo, x.MaybeGone)
			}
			return h.Sum64()
		},
		DescribeOperation: func(input, output any) string {
			in, out := input.(ModelInput), output.(ModelOutput)
			if in.Op == OpAcquire {
				return fmt.Sprintf("acquire(%s) → %s %s", in.Resource, out.Kind, short(out.Token))
			}
			return fmt.Sprintf("%s(%s) → %s", in.Op, short(in.Token), out.Kind)
		},
		DescribeState: func(state any) string {
			s := state.(modelState)
			parts := make([]string, 0, len(s))
			for _, h := range s {
				p := short(h.Token)
				if h.MaybeGone {
					p += " (maybe gone)"
				}
				parts = append(parts, p)
			}
			return fmt.Sprintf("%d holders: %s", len(s), strings.Join(parts, ", "))
		},
	}
}

// short abbreviates a token for the visualisation.
func short(token string) string {
	if len(token) > 8 {
		return token[:8]
	}
	return token
}

// ModelOperations turns the history into what the checker sees (see the comment at the top).
func ModelOperations(entries []Entry) []porcupine.Operation {
	var ops []porcupine.Operation
	for _, e := range entries {
		in := ModelInput{Op: e.Op, Resource: e.Resource, Token: e.Token, Call: e.Start, Return: e.End, Client: e.Client}
		var out ModelOutput
		a := e.Answer
		switch e.Op {
		case OpAcquire:
			if a.Status != 200 || a.Token == "" {
				continue
			}
			out = ModelOutput{Kind: OutGranted, Token: a.Token}
		case OpCheck:
			switch a.Status {
			case 200:
				out = ModelOutput{Kind: OutOK}
			case 410:
				out = ModelOutput{Kind: OutLost}
			default:
				continue
			}
		case OpRelease:
			switch {
			case a.Status == 200 && a.Outcome == "already-released":
				out = ModelOutput{Kind: OutAlreadyReleased}
			case a.Status == 200:
				out = ModelOutput{Kind: OutOK}
			case a.Unknown() || a.Status >= 500:
				// A release's delete runs to its end whatever the caller does, and a 503
				// may come after the delete (a failed decrement): it may have applied.
				in.Return = maxReturn(entries)
				out = ModelOutput{Kind: OutUnknown}
			default:
				continue
			}
		default:
			continue
		}
		ops = append(ops, porcupine.Operation{ClientId: e.Client, Input: in, Call: e.Start, Output: out, Return: in.Return})
	}
	return ops
}

// maxReturn is past the end of every call: a release whose answer was lost may take effect
// at any time after its call.
func maxReturn(entries []Entry) int64 {
	var m int64
	for _, e := range entries {
		m = max(m, e.End)
	}
	return m + 1
}

// Overlap is a moment when more callers held leases of one resource, by their own account,
// than its cap.
type Overlap struct {
	Resource string `json:"resource"`
	At       int64  `json:"at"`
	Holding  int    `json:"holding"`
	Cap      int    `json:"cap"`
}

// HoldingOverlaps checks the holding intervals directly, without the checker: a caller
// surely holds a lease from the answer of its grant to the call of its release (or, never
// released, its last call with that token; checks after the release do not count). More such intervals at once than the cap is a grant above the cap.
// It returns one Overlap per grant that began while the cap was already reached.
func HoldingOverlaps(entries []Entry, caps map[string]int) []Overlap {
	type edge struct {
		at    int64
		delta int
	}
	granted := map[string]int64{} // token → answer of the grant
	resource := map[string]string{}
	last := map[string]int64{}     // token → start of its last call
	released := map[string]int64{} // token → start of its first release
	for _, e := range entries {
		switch {
		case e.Op == OpAcquire && e.Answer.Status == 200 && e.Answer.Token != "":
			granted[e.Answer.Token] = e.End
			resource[e.Answer.Token] = e.Resource
		case e.Op == OpRelease:
			if at, ok := released[e.Token]; !ok || e.Start < at {
				released[e.Token] = e.Start
			}
		case e.Token != "":
			last[e.Token] = max(last[e.Token], e.Start)
		}
	}
	edges := map[string][]edge{}
	for token, from := range granted {
		to, ok := released[token]
		if !ok {
			to, ok = last[token]
		}
		if !ok || to <= from {
			continue
		}
		r := resource[token]
		edges[r] = append(edges[r], edge{from, +1}, edge{to, -1})
	}
	var overlaps []Overlap
	for r, es := range edges {
		// Ends before starts at the same instant: touching intervals do not overlap.
		slices.SortFunc(es, func(a, b edge) int {
			return cmp.Or(cmp.Compare(a.at, b.at), cmp.Compare(a.delta, b.delta))
		})
		n := 0
		for _, e := range es {
			n += e.delta
			if e.delta > 0 && n > caps[r] {
				overlaps = append(overlaps, Overlap{Resource: r, At: e.at, Holding: n, Cap: caps[r]})
			}
		}
	}
	slices.SortFunc(overlaps, func(a, b Overlap) int { return cmp.Compare(a.At, b.At) })
	return overlaps
}

// FalseUnavailable returns the calls answered 503 LEASE_UNAVAILABLE while the store answered
// the same process: no store stop overlapped the call, and a call of the same process that
// needed the store (answered 200 or 410) was made and answered within it. The service's own
// rule is stricter: it answers 503 only after a store call of the process failed with no
// answer since, or went unanswered for longer than the store's timeout (docs/waiting.md,
// "Deadlines and outages"). A 503 during a stall of the development store as a whole (every
// process unanswered for longer than a cut deadline, no stop injected) is not counted: the
// check cannot tell it from an outage.
func FalseUnavailable(entries []Entry, faults []Fault) []Entry {
	var out []Entry
	for _, e := range entries {
		if e.Answer.Status != 503 || e.Answer.Code != "LEASE_UNAVAILABLE" {
			continue
		}
		stopped := false
		for _, f := range faults {
			if f.Kind == FaultStoreStop && f.Start <= e.End && e.Start <= f.End {
				stopped = true
				break
			}
		}
		answered := slices.ContainsFunc(entries, func(o Entry) bool {
			return o.Process == e.Process && (o.Answer.Status == 200 || o.Answer.Status == 410) &&
				e.Start <= o.Start && o.End <= e.End
		})
		if !stopped && answered {
			out = append(out, e)
		}
	}
	return out
}

// The fault kinds (docs/robustness.md, "Faults").
const (
	FaultAgentKill      = "agent-kill"
	FaultStoreStop      = "store-stop"
	FaultDeadline       = "short-deadline"
	FaultManagerRestart = "manager-restart"
)

// FaultKinds lists every fault kind, in the order of the docs' table.
var FaultKinds = []string{FaultAgentKill, FaultStoreStop, FaultDeadline, FaultManagerRestart}
