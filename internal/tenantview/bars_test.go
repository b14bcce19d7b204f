package tenantview

import (
	"html"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
)

var (
	levelRE = regexp.MustCompile(`(?s)<li class="level[^"]*" data-level="([^"]+)" data-scope="([^"]+)">(.*?)</li>`)
	meterRE = regexp.MustCompile(`<meter min="0" max="(\d+)"[^>]*value="(\d+)"[^>]*aria-label="([^"]*)"`)
	tagRE   = regexp.MustCompile(`<[^>]+>`)
)

// TestOccupancyBars: a level with a published cap is drawn as a bar with its text
// equivalent ("N of CAP"); an ambiguous cap, a level no definition caps and an unknown cap
// draw no bar and say so; the global level is not shown; a level with a line says how many
// wait in it.
func TestOccupancyBars(t *testing.T) {
	src := newFake()
	src.counters = []Counter{
		{Resource: "tex", Level: "tenant", Scope: "acme", Count: 2, Booked: 2, Cap: 3, UpdatedAt: testNow},
		{Resource: "tex", Level: "project", Scope: "acme/thesis", Count: 1, Booked: 1, Waiting: 4, Cap: 1, UpdatedAt: testNow},
		{Resource: "tex", Level: "global", Scope: "*", Count: 5, Booked: 5, Cap: 6, UpdatedAt: testNow},
		{Resource: "shared", Level: "tenant", Scope: "acme", Count: 2, Booked: 2, CapReason: livev1alpha1.CapReasonAmbiguous,
			CapNote: "ambiguous: lease a in acme/p (cap 3); lease b in acme/p (cap 5) share this counter", UpdatedAt: testNow},
		{Resource: "shared", Level: "project", Scope: "acme/p", Count: 2, Booked: 2, CapReason: livev1alpha1.CapReasonUncapped,
			CapNote: "the current definition of lease a in acme/p does not cap the project level", UpdatedAt: testNow},
		{Resource: "shared", Level: "user", Scope: "acme/ann", Count: 1, Booked: 0, CapReason: livev1alpha1.CapReasonNotBooked,
			CapNote: "no holder books this counter", UpdatedAt: testNow},
	}
	status, body := get(t, browserlessClient(t), serve(t, src)+"/")
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	type level struct {
		Level, Scope, Meter, Text string
	}
	var got []level
	for _, m := range levelRE.FindAllStringSubmatch(body, -1) {
		l := level{Level: m[1], Scope: m[2], Text: strings.Join(strings.Fields(html.UnescapeString(tagRE.ReplaceAllString(m[3], " "))), " ")}
		if mm := meterRE.FindStringSubmatch(m[3]); mm != nil {
			l.Meter = mm[2] + "/" + mm[1] + " " + mm[3]
		}
		got = append(got, l)
	}
	want := []level{
		{Level: "tenant", Scope: "acme", Text: "tenant acme 2 in use cap ambiguous ambiguous: lease a in acme/p (cap 3); lease b in acme/p (cap 5) share this counter"},
		{Level: "project", Scope: "acme/p", Text: "project acme/p 2 in use (not capped)"},
		{Level: "user", Scope: "acme/ann", Text: "user acme/ann 1 in use (cap unknown) drift +1 no holder books this counter"},
		{Level: "tenant", Scope: "acme", Meter: "2/3 tex tenant acme: 2 of 3 slots in use", Text: "tenant acme 2 of 3"},
		{Level: "project", Scope: "acme/thesis", Meter: "1/1 tex project acme/thesis: 1 of 1 slots in use", Text: "project acme/thesis 1 of 1 full 4 waiting"},
	}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("occupancy levels (-want +got):\n%s", d)
	}
}
