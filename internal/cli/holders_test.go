package cli_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/vancetope/lease-operator/internal/cli"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// seeded holds three holders: acme/ann on pod-a (tex2pdf, tex), acme on pod-a's recreated
// pod (browser, mcp, no user) and globex/bob on pod-b (tex2pdf, tex).
type seeded struct {
	s                    testStore
	ann, browser, globex lease.Holder
}

func seed(t *testing.T) seeded {
	t.Helper()
	s := newStore(t)
	ann := mustAcquire(t, s.Store, request("tex2pdf", "acme", "ann", podA, caps(1, 2, 3, 6)))
	bReq := request("browser", "acme", "", podA2, []lease.LevelCap{{Level: lease.LevelProject, Cap: 2}})
	bReq.Type, bReq.LeaseName, bReq.PodBound = "mcp", "browser", false
	bReq.Payload = map[string]string{"endpoint": "http://mcp:8080/mcp", "sessionId": "s-1"}
	browser := mustAcquire(t, s.Store, bReq)
	globex := mustAcquire(t, s.Store, request("tex2pdf", "globex", "bob", podB, caps(1, 2, 3, 6)))
	return seeded{s: s, ann: ann, browser: browser, globex: globex}
}

func TestListFilters(t *testing.T) {
	sd := seed(t)
	annRow := []string{sd.ann.ID, "tex", "tex2pdf", "acme", "p", "ann", "ns/pod-a", "HELD", "1h"}
	browserRow := []string{sd.browser.ID, "mcp", "browser", "acme", "p", "<none>", "ns/pod-a", "HELD", "1h"}
	globexRow := []string{sd.globex.ID, "tex", "tex2pdf", "globex", "p", "bob", "other/pod-b", "HELD", "1h"}
	cases := []struct {
		name  string
		flags []string
		want  [][]string
	}{
		{name: "all", want: [][]string{annRow, browserRow, globexRow}},
		{name: "tenant", flags: []string{"--tenant", "acme"}, want: [][]string{annRow, browserRow}},
		{name: "resource", flags: []string{"--resource", "tex2pdf"}, want: [][]string{annRow, globexRow}},
		{name: "type", flags: []string{"--type", "mcp"}, want: [][]string{browserRow}},
		{name: "pod of any uid", flags: []string{"--pod", "ns/pod-a"}, want: [][]string{annRow, browserRow}},
		{name: "combined", flags: []string{"--tenant", "acme", "--resource", "tex2pdf"}, want: [][]string{annRow}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := mustRun(t, operatorEnv(), args(sd.s, append([]string{"list"}, tc.flags...)...)...)
			got := columns(t, r.stdout, "ID", "TYPE", "RESOURCE", "TENANT", "PROJECT", "USER", "POD", "STATE", "TTL")
			if diff := cmp.Diff(tc.want, got, cmpopts.SortSlices(func(a, b []string) bool { return a[0] < b[0] })); diff != "" {
				t.Errorf("list %v (-want +got):\n%s", tc.flags, diff)
			}
			if r.stderr != "" {
				t.Errorf("stderr %q, want none", r.stderr)
			}
		})
	}

	t.Run("nothing matches", func(t *testing.T) {
		r := mustRun(t, operatorEnv(), args(sd.s, "list", "--tenant", "initech")...)
		if r.stdout != "" {
			t.Errorf("stdout %q, want none", r.stdout)
		}
		if want := "No lease holders found in the namespaces you may list for tenant initech."; !strings.Contains(r.stderr, want) {
			t.Errorf("stderr %q, want %q", r.stderr, want)
		}
	})
	t.Run("bad pod", func(t *testing.T) {
		mustFail(t, operatorEnv(), args(sd.s, "list", "--pod", "pod-a"), `--pod: "pod-a" is not NAMESPACE/NAME`)
	})
	t.Run("bad output", func(t *testing.T) {
		mustFail(t, operatorEnv(), args(sd.s, "list", "-o", "yaml"), `--output "yaml": want table or json`)
	})
}

// holderJSON mirrors the plugin's JSON holder, decoded strictly.
type holderJSON struct {
	ID         string            `json:"id"`
	State      string            `json:"state"`
	Lease      string            `json:"lease"`
	Resource   string            `json:"resource"`
	Type       string            `json:"type"`
	Tenant     string            `json:"tenant"`
	Project    string            `json:"project"`
	User       string            `json:"user"`
	HolderRef  string            `json:"holderRef"`
	Pod        string            `json:"pod"`
	PodUID     string            `json:"podUID"`
	PodBound   bool              `json:"podBound"`
	Payload    map[string]string `json:"payload"`
	Levels     []string          `json:"levels"`
	AcquiredAt string            `json:"acquiredAt"`
	LastSeenAt string            `json:"lastSeenAt"`
	Fence      int64             `json:"fence"`
	TTLSeconds float64           `json:"ttlSeconds"`
}

func decodeStrict[T any](t testing.TB, s string) T {
	t.Helper()
	var v T
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("decoding %T from %q: %v", v, s, err)
	}
	return v
}

var ignoreTimes = cmpopts.IgnoreFields(holderJSON{}, "AcquiredAt", "LastSeenAt")

func TestListJSON(t *testing.T) {
	sd := seed(t)
	r := mustRun(t, operatorEnv(), args(sd.s, "list", "--type", "mcp", "-o", "json")...)
	got := decodeStrict[[]holderJSON](t, r.stdout)
	want := []holderJSON{{
		ID: sd.browser.ID, State: "HELD", Lease: "browser", Resource: "browser", Type: "mcp",
		Tenant: "acme", Project: "p", HolderRef: "job-1", Pod: "ns/pod-a", PodUID: "uid-a2",
		Payload: map[string]string{"endpoint": "http://mcp:8080/mcp", "sessionId": "s-1"},
		Levels:  []string{"browser|project|acme/p"}, TTLSeconds: 3600, Fence: sd.browser.Fence,
	}}
	if diff := cmp.Diff(want, got, ignoreTimes); diff != "" {
		t.Errorf("list -o json (-want +got):\n%s", diff)
	}
	if len(got) == 1 && (got[0].AcquiredAt == "" || got[0].LastSeenAt == "") {
		t.Errorf("holder without its server times: %+v", got[0])
	}

	r = mustRun(t, operatorEnv(), args(sd.s, "list", "--tenant", "initech", "-o", "json")...)
	if strings.TrimSpace(r.stdout) != "[]" {
		t.Errorf("empty list as JSON = %q, want []", r.stdout)
	}
}

func TestShow(t *testing.T) {
	sd := seed(t)
	h := sd.ann

	t.Run("table", func(t *testing.T) {
		r := mustRun(t, operatorEnv(), args(sd.s, "show", h.ID)...)
		for _, want := range []string{
			"ID:          " + h.ID + "\n",
			"State:       HELD\n",
			"Lease:       tex\n",
			"Resource:    tex2pdf\n",
			"Type:        tex\n",
			"Tenant:      acme\n",
			"Project:     p\n",
			"User:        ann\n",
			"Holder ref:  job-1\n",
			"Pod:         ns/pod-a (uid uid-a)\n",
			"Pod bound:   true\n",
			"TTL:         1h\n",
			"Payload:\n  jobId: 42\n",
		} {
			if !strings.Contains(r.stdout, want) {
				t.Errorf("show output lacks %q:\n%s", want, r.stdout)
			}
		}
		// The levels with their counters: globex/bob books the global counter too.
		levels := r.stdout[strings.Index(r.stdout, "Levels:\n")+len("Levels:\n") : strings.Index(r.stdout, "Payload:")]
		got := columns(t, levels, "LEVEL", "SCOPE", "COUNTER", "COUNT", "BOOKED", "DRIFT")
		want := [][]string{
			{"user", "acme/ann", "tex2pdf|user|acme/ann", "1", "1", "-"},
			{"project", "acme/p", "tex2pdf|project|acme/p", "1", "1", "-"},
			{"tenant", "acme", "tex2pdf|tenant|acme", "1", "1", "-"},
			{"global", "*", "tex2pdf|global|*", "2", "2", "-"},
		}
		if diff := cmp.Diff(want, got, cmpopts.SortSlices(func(a, b []string) bool { return a[2] < b[2] })); diff != "" {
			t.Errorf("levels of show (-want +got):\n%s", diff)
		}
	})

	t.Run("json", func(t *testing.T) {
		r := mustRun(t, operatorEnv(), args(sd.s, "show", h.ID, "-o", "json")...)
		got := decodeStrict[holderJSON](t, r.stdout)
		want := holderJSON{
			ID: h.ID, State: "HELD", Lease: "tex", Resource: "tex2pdf", Type: "tex",
			Tenant: "acme", Project: "p", User: "ann", HolderRef: "job-1", Pod: "ns/pod-a", PodUID: "uid-a",
			PodBound: true, Payload: map[string]string{"jobId": "42"}, TTLSeconds: 3600, Fence: h.Fence,
			Levels: []string{"tex2pdf|user|acme/ann", "tex2pdf|project|acme/p", "tex2pdf|tenant|acme", "tex2pdf|global|*"},
		}
		if diff := cmp.Diff(want, got, ignoreTimes); diff != "" {
			t.Errorf("show -o json (-want +got):\n%s", diff)
		}
	})

	t.Run("gone", func(t *testing.T) {
		if _, err := sd.s.Release(ctxT(t), sd.globex.Token); err != nil {
			t.Fatal(err)
		}
		mustFail(t, operatorEnv(), args(sd.s, "show", sd.globex.ID), "no holder "+sd.globex.ID, "released, reaped or revoked")
	})
	t.Run("not a token", func(t *testing.T) {
		mustFail(t, operatorEnv(), args(sd.s, "show", "XYZ"), `"XYZ" is not a holder ID`)
	})
	t.Run("no token", func(t *testing.T) {
		mustFail(t, operatorEnv(), args(sd.s, "show"), "accepts 1 arg(s), received 0", "See 'kubectl lease show --help'")
	})
}

// unsafeOutput returns the characters in s that act on a terminal: controls other than
// newline and tab (ESC, BEL, CR, DEL, C1), bidirectional overrides, bytes that are not UTF-8.
func unsafeOutput(s string) []string {
	var bad []string
	for i, r := range s {
		switch {
		case r == utf8.RuneError:
			if _, size := utf8.DecodeRuneInString(s[i:]); size <= 1 {
				bad = append(bad, fmt.Sprintf("byte %#x at %d", s[i], i))
			}
		case r == '\n' || r == '\t':
		case unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			bad = append(bad, fmt.Sprintf("%U at %d", r, i))
		}
	}
	return bad
}

// A tenant writes the payload, the user ID and the holder reference: printed raw, an escape
// sequence there would act on the operator's terminal, and a newline would forge a line.
func TestOutputEscapesWhatTenantsWrote(t *testing.T) {
	s := newStore(t)
	req := request("tex2pdf", "acme", "eve\u202egnp.exe", podA, caps(1, 2, 3, 6))
	req.HolderRef = "job\x1b[2J\x1b[H"
	req.Payload = map[string]string{
		"title\x1b]0;pwned\x07": "a\x1b[31mred\x1b[0m\rFake: yes\nForged: line\u009b1m",
	}
	h := mustAcquire(t, s.Store, req)

	show := mustRun(t, operatorEnv(), args(s, "show", h.Token)...).stdout
	list := mustRun(t, operatorEnv(), args(s, "list")...).stdout
	asJSON := mustRun(t, operatorEnv(), args(s, "show", h.Token, "-o", "json")...).stdout
	for name, out := range map[string]string{"show": show, "list": list, "show -o json": asJSON} {
		if bad := unsafeOutput(out); len(bad) > 0 {
			t.Errorf("%s prints %v raw:\n%q", name, bad, out)
		}
	}
	for _, want := range []string{
		`User:        eve\u202egnp.exe` + "\n",
		`Holder ref:  job\x1b[2J\x1b[H` + "\n",
		`  title\x1b]0;pwned\x07: a\x1b[31mred\x1b[0m\rFake: yes\nForged: line\u009b1m` + "\n",
	} {
		if !strings.Contains(show, want) {
			t.Errorf("show lacks %q:\n%s", want, show)
		}
	}
	if strings.Contains(show, "\nForged:") {
		t.Errorf("a payload value forged a line of show:\n%s", show)
	}
	if rows := tableRows(list); len(rows) != 2 {
		t.Errorf("list has %d lines, want a header and one row:\n%s", len(rows), list)
	}
	// -o json stays JSON that decodes to what the tenant wrote.
	got := decodeStrict[holderJSON](t, asJSON)
	if got.User != req.User || got.HolderRef != req.HolderRef || got.Payload["title\x1b]0;pwned\x07"] != req.Payload["title\x1b]0;pwned\x07"] {
		t.Errorf("show -o json decodes to user %q, holderRef %q, payload %q", got.User, got.HolderRef, got.Payload)
	}
}

// syncBuffer is an output the test reads while the command writes it.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// TestListWatchPrintsChanges: `list -w` prints the list, then each grant and release as a row
// after its event, until interrupted; -o json prints one object per change.
func TestListWatchPrintsChanges(t *testing.T) {
	m := newManager(t, newStore(t).Store)
	s := liveStore.get().(*leasestore.Store)
	first := mustAcquire(t, s, request("tex2pdf", "acme", "ann", podA, caps(5, 5, 5, 5)))
	for _, format := range []string{"table", "json"} {
		t.Run(format, func(t *testing.T) {
			var out, errOut syncBuffer
			ctx, cancel := context.WithCancel(ctxT(t))
			done := make(chan int, 1)
			go func() {
				done <- cli.Run(ctx, []string{"list", "-w", "-n", "acme", "-o", format},
					cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut},
					cli.WithEnv(func(k string) string { return m.env()[k] }))
			}()
			waitFor := func(what string, ok func(string) bool) {
				t.Helper()
				for deadline := time.Now().Add(20 * time.Second); !ok(out.String()); {
					if time.Now().After(deadline) {
						t.Fatalf("no %s in 20 s; stdout:\n%s\nstderr:\n%s", what, out.String(), errOut.String())
					}
					time.Sleep(20 * time.Millisecond) // real time: the command runs apart
				}
			}
			waitFor("list", func(o string) bool { return strings.Contains(o, first.ID) })
			h := mustAcquire(t, s, request("tex2pdf", "acme", "bob", podA, caps(5, 5, 5, 5)))
			var row func(event string) func(string) bool
			if format == "json" {
				row = func(event string) func(string) bool {
					return func(o string) bool {
						for _, l := range strings.Split(o, "\n") {
							var e struct {
								Type   string
								Holder struct{ ID string }
							}
							if json.Unmarshal([]byte(l), &e) == nil && e.Type == event && e.Holder.ID == h.ID {
								return true
							}
						}
						return false
					}
				}
			} else {
				row = func(event string) func(string) bool {
					return func(o string) bool {
						for _, l := range strings.Split(o, "\n") {
							if f := strings.Fields(l); len(f) > 2 && f[0] == event && f[1] == h.ID && f[2] == "tex" {
								return true
							}
						}
						return false
					}
				}
			}
			waitFor("ADDED row", row("ADDED"))
			if _, err := s.Release(ctxT(t), h.Token); err != nil {
				t.Fatal(err)
			}
			waitFor("DELETED row", row("DELETED"))
			cancel()
			if code := <-done; code != 0 {
				t.Errorf("list -w interrupted: exit %d, stderr:\n%s", code, errOut.String())
			}
		})
	}
	mustFail(t, m.env(), []string{"list", "-w", "--force"}, "--watch follows the live API")
}
