// Package revocation sends reaped and revoked holders to the handler of their lease type
// (docs/design.md): the dispatch matrix as a pure function (Decide), the Dispatcher that
// applies it asynchronously, and the handler registry. The shipped handlers live in
// revocation/handlers, the forwarder to an agent and the agent's receiver in agentlink.
//
// A regular release never comes here: the holder cleans up its resource itself. Only a
// reap (idle, pod) or an operator's revoke does.
package revocation

// Action is what the dispatcher does with one revoked holder.
type Action string

// The actions of the dispatch matrix.
const (
	// ActionLocal: the holder's pod is this process's pod; run the type's handler here, in
	// the holder pod (SiteHolderPod).
	ActionLocal Action = "local"
	// ActionForward: the holder's pod is alive elsewhere; POST the revocation to its agent,
	// which runs the handler there. A failed POST counts as unreachable (see Input).
	ActionForward Action = "forward"
	// ActionReleaseOnly: the holder's pod is dead and the resource was pod-bound; it died
	// with the pod, the slot is already free, nothing runs.
	ActionReleaseOnly Action = "release-only"
	// ActionReaper: the holder's pod is dead and the resource lives elsewhere (e.g. a remote
	// MCP session); run the type's handler here, on the reaper, with the holder's payload
	// (SiteReaper).
	ActionReaper Action = "reaper"
)

// Input is what the matrix decides on.
type Input struct {
	// Self: the holder's pod is the pod of this process.
	Self bool
	// Alive: the holder's pod is alive by the liveness predicate (podwatch.Liveness).
	Alive bool
	// PodBound: the resource lives in the holder's pod and dies with it (from the holder).
	PodBound bool
	// Unreachable: a forward to the holder's pod was tried and failed; the pod is then
	// treated as dead.
	Unreachable bool
	// Unknown: the liveness of the holder's pod could not be confirmed (the API server
	// could not be read, or this process may not read pods: the agent). Nothing
	// destructive is decided on a guess: the slot is released, no handler runs.
	Unknown bool
}

// Decide is the dispatch matrix (docs/design.md, "Revocation and the dispatch matrix"):
//
//	holder pod alive, this pod        → handler locally
//	holder pod alive, another pod     → forward to its agent (failure → as dead)
//	holder pod dead,  podBound        → release only
//	holder pod dead,  not podBound    → handler on the reaper with the payload
//	holder pod liveness unknown       → release only (the remote resource expires itself)
//
// This process's pod is alive by definition, whatever the other fields say.
func Decide(in Input) Action {
	switch {
	case in.Self:
		return ActionLocal
	case in.Alive && !in.Unreachable:
		return ActionForward
	case in.PodBound, in.Unknown && !in.Alive:
		return ActionReleaseOnly
	default:
		return ActionReaper
	}
}
