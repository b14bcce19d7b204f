package robustness

import (
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// The operations a caller sends (docs/api.md, "Admission API").
const (
	OpAcquire = "acquire"
	OpCheck   = "check"
	OpRelease = "release"
)

// Call is what a caller asked: one HTTP request of the admission API.
type Call struct {
	// Client is the caller's number in the run; Process the process it called (0 the
	// manager, 1 and 2 the agents).
	Client  int    `json:"client"`
	Process int    `json:"process"`
	Op      string `json:"op"`
	// Resource is the resource of the lease: the one the acquisition named, or the one
	// the token was granted on.
	Resource string `json:"resource"`
	// Token names the lease of a check or a release.
	Token string `json:"token,omitempty"`
	// WaitMs is the acquisition's waitMs; DeadlineMs the caller's own deadline for the call.
	WaitMs     int64 `json:"waitMs,omitempty"`
	DeadlineMs int64 `json:"deadlineMs"`
	// Probe marks the calls of the recovery probe (not the churn).
	Probe bool `json:"probe,omitempty"`
}

// Answer is what came back. Status 0 means no HTTP answer: NotSent when the request
// provably never reached a server (the connection was refused), else the outcome is unknown
// (a cut deadline, a reset connection): the server may have applied the call, or may still.
type Answer struct {
	Status int `json:"status"`
	// Code is the error code of an error answer (LEASE_BUSY, LEASE_LOST…).
	Code string `json:"code,omitempty"`
	// Message is the error answer's message, for people (the busy diagnosis).
	Message string `json:"message,omitempty"`
	// Token is the granted lease of a 200 acquire; Outcome the outcome of a 200 check or
	// release (ok, already-released).
	Token   string `json:"token,omitempty"`
	Outcome string `json:"outcome,omitempty"`
	NotSent bool   `json:"notSent,omitempty"`
	Err     string `json:"err,omitempty"`
}

// Unknown reports whether the call may or may not have taken effect.
func (a Answer) Unknown() bool { return a.Status == 0 && !a.NotSent }

// Entry is one call of the history with its answer, its start and end in nanoseconds of the
// monotonic clock since the run began.
type Entry struct {
	Call
	Answer Answer `json:"answer"`
	Start  int64  `json:"start"`
	End    int64  `json:"end"`
}

// Fault is one injected fault: what, and when its effect began and ended (ns since the run
// began). For a store stop, Start is the SIGSTOP and End the SIGCONT; for a killed process,
// both are the kill and Ready the moment the restarted process was ready.
type Fault struct {
	Kind    string `json:"kind"`
	Target  string `json:"target,omitempty"`
	Start   int64  `json:"start"`
	End     int64  `json:"end"`
	Ready   int64  `json:"ready,omitempty"`
	Episode int    `json:"episode"`
}

// History is what a run recorded, written as JSON when the run fails.
type History struct {
	Seed     int64             `json:"seed"`
	Fairness string            `json:"fairness"`
	TTL      time.Duration     `json:"ttl"`
	Caps     map[string]int    `json:"caps"`
	Entries  []Entry           `json:"entries"`
	Faults   []Fault           `json:"faults"`
	Episodes map[string]string `json:"episodes"` // resource → fault kind
}

// WriteJSON writes h to path.
func (h *History) WriteJSON(path string) error {
	data, err := json.MarshalIndent(h, "", " ")
	if err != nil {
		return fmt.Errorf("encoding the history: %w", err)
	}
	return os.WriteFile(path, data, 0o644)
}
