package robustness

import (
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/google/go-cmp/cmp"
)

// ms is a point in a test history, in nanoseconds.
func ms(n int64) int64 { return n * int64(time.Millisecond) }

// grant, check, release and their kin build history entries for the model's tests.
func grant(client int, token string, start, end int64) Entry {
	return Entry{Call: Call{Client: client, Op: OpAcquire, Resource: "r"}, Answer: Answer{Status: 200, Token: token}, Start: ms(start), End: ms(end)}
}

func refused(client, status int, code string, start, end int64) Entry {
	return Entry{Call: Call{Client: client, Op: OpAcquire, Resource: "r"}, Answer: Answer{Status: status, Code: code}, Start: ms(start), End: ms(end)}
}

func withToken(client int, op, token string, a Answer, start, end int64) Entry {
	return Entry{Call: Call{Client: client, Op: op, Resource: "r", Token: token}, Answer: a, Start: ms(start), End: ms(end)}
}

var (
	ok       = Answer{Status: 200, Outcome: "ok"}
	already  = Answer{Status: 200, Outcome: "already-released"}
	lost     = Answer{Status: 410, Code: "LEASE_LOST"}
	cutShort = Answer{Err: "context deadline exceeded"}
)

func TestModel(t *testing.T) {
	caps := map[string]int{"r": 2}
	const ttl = 5 * time.Second
	cases := map[string]struct {
		history []Entry
		want    porcupine.CheckResult
	}{
		"two holders, released, then two more": {
			history: []Entry{
				grant(0, "a", 0, 10), grant(1, "b", 0, 10),
				withToken(0, OpRelease, "a", ok, 20, 30), withToken(1, OpRelease, "b", ok, 20, 30),
				grant(0, "c", 40, 50), grant(1, "d", 40, 50),
			},
			want: porcupine.Ok,
		},
		"a third grant while two surely hold": {
			history: []Entry{
				grant(0, "a", 0, 10), grant(1, "b", 0, 10), grant(2, "c", 20, 30),
				withToken(0, OpRelease, "a", ok, 40, 50),
			},
			want: porcupine.Illegal,
		},
		"a third grant concurrent with a release": {
			history: []Entry{
				grant(0, "a", 0, 10), grant(1, "b", 0, 10),
				withToken(0, OpRelease, "a", ok, 20, 40), grant(2, "c", 30, 50),
			},
			want: porcupine.Ok,
		},
		"refusals change nothing": {
			history: []Entry{
				grant(0, "a", 0, 10), refused(1, 409, "LEASE_BUSY", 0, 300), refused(2, 503, "LEASE_UNAVAILABLE", 0, 20),
				withToken(0, OpCheck, "a", ok, 20, 30),
			},
			want: porcupine.Ok,
		},
		"a third grant once an abandoned holder's TTL ran out": {
			history: []Entry{
				grant(0, "a", 0, 10), grant(1, "b", 0, 10),
				withToken(0, OpRelease, "a", cutShort, 20, 30),
				grant(2, "c", 5100, 5110),
			},
			want: porcupine.Ok,
		},
		"a third grant before the TTL of a checked holder ran out": {
			history: []Entry{
				grant(0, "a", 0, 10), grant(1, "b", 0, 10),
				withToken(0, OpCheck, "a", ok, 4000, 4010), withToken(1, OpCheck, "b", ok, 4000, 4010),
				grant(2, "c", 5100, 5110),
			},
			want: porcupine.Illegal,
		},
		"a lease lost before its TTL": {
			history: []Entry{grant(0, "a", 0, 10), withToken(0, OpCheck, "a", lost, 1000, 1010)},
			want:    porcupine.Illegal,
		},
		"a lease lost after its TTL": {
			history: []Entry{grant(0, "a", 0, 10), withToken(0, OpCheck, "a", lost, 5100, 5110)},
			want:    porcupine.Ok,
		},
		"a lost lease answers 200 again": {
			history: []Entry{
				grant(0, "a", 0, 10), withToken(0, OpCheck, "a", lost, 5100, 5110),
				withToken(0, OpCheck, "a", ok, 5200, 5210),
			},
			want: porcupine.Illegal,
		},
		"a released lease answers 200": {
			history: []Entry{
				grant(0, "a", 0, 10), withToken(0, OpRelease, "a", ok, 20, 30),
				withToken(0, OpCheck, "a", ok, 40, 50),
			},
			want: porcupine.Illegal,
		},
		"a released lease answers 410": {
			history: []Entry{
				grant(0, "a", 0, 10), withToken(0, OpRelease, "a", ok, 20, 30),
				withToken(0, OpCheck, "a", lost, 40, 50),
			},
			want: porcupine.Ok,
		},
		"a release whose answer was lost may have applied": {
			history: []Entry{
				grant(0, "a", 0, 10), withToken(0, OpRelease, "a", cutShort, 20, 30),
				withToken(0, OpCheck, "a", lost, 40, 50), withToken(0, OpRelease, "a", already, 60, 70),
			},
			want: porcupine.Ok,
		},
		"already released before its TTL, with no release": {
			history: []Entry{grant(0, "a", 0, 10), withToken(0, OpRelease, "a", already, 20, 30)},
			want:    porcupine.Illegal,
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			got := porcupine.CheckOperationsTimeout(NewModel(caps, ttl, 0), ModelOperations(tc.history), 10*time.Second)
			if got != tc.want {
				t.Errorf("check = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestHoldingOverlaps(t *testing.T) {
	caps := map[string]int{"r": 1}
	history := []Entry{
		grant(0, "a", 0, 10), withToken(0, OpRelease, "a", ok, 20, 30),
		grant(1, "b", 15, 20), withToken(1, OpRelease, "b", ok, 25, 30), // overlaps a in [20, 20]? no: a ends at 20
		grant(2, "c", 21, 22), withToken(2, OpRelease, "c", ok, 40, 50), // overlaps b over [22, 25]
		withToken(0, OpCheck, "a", lost, 60, 70), // after its release: not held
	}
	got := HoldingOverlaps(history, caps)
	want := []Overlap{{Resource: "r", At: ms(22), Holding: 2, Cap: 1}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("overlaps (-want +got):\n%s", diff)
	}
}

func TestFalseUnavailable(t *testing.T) {
	onProcess := func(p int, e Entry) Entry { e.Process = p; return e }
	history := []Entry{
		refused(0, 503, "LEASE_UNAVAILABLE", 0, 100),   // the store stopped during it
		refused(1, 503, "LEASE_UNAVAILABLE", 300, 400), // it did not, and answered process 0 within it
		refused(2, 409, "LEASE_BUSY", 300, 400),
		grant(3, "t1", 320, 350),                                     // process 0's answer within the 503
		grant(4, "t2", 20, 60),                                       // within the first 503, but the store stopped
		onProcess(1, refused(5, 503, "LEASE_UNAVAILABLE", 500, 600)), // only another process was answered meanwhile
		grant(6, "t3", 510, 590),                                     // (process 0)
		onProcess(2, refused(7, 503, "LEASE_UNAVAILABLE", 700, 800)), // its process's answer began before it
		onProcess(2, withToken(8, OpRelease, "t4", Answer{Status: 200}, 690, 720)),
	}
	faults := []Fault{{Kind: FaultStoreStop, Start: ms(50), End: ms(250)}, {Kind: FaultAgentKill, Start: ms(350), End: ms(350)}}
	got := FalseUnavailable(history, faults)
	if diff := cmp.Diff([]Entry{history[1]}, got); diff != "" {
		t.Errorf("false 503s (-want +got):\n%s", diff)
	}
}
