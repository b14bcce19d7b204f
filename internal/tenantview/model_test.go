package tenantview

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestIdleState(t *testing.T) {
	cases := map[string]struct {
		idle, ttl time.Duration
		want      IdleState
	}{
		"fresh":                  {idle: 0, ttl: time.Minute, want: IdleOK},
		"just under the mark":    {idle: 44 * time.Second, ttl: time.Minute, want: IdleOK},
		"at three quarters":      {idle: 45 * time.Second, ttl: time.Minute, want: IdleNear},
		"one second before TTL":  {idle: 59 * time.Second, ttl: time.Minute, want: IdleNear},
		"at the TTL":             {idle: time.Minute, ttl: time.Minute, want: IdleOver},
		"long past the TTL":      {idle: time.Hour, ttl: time.Minute, want: IdleOver},
		"no TTL is never marked": {idle: time.Hour, ttl: 0, want: IdleOK},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			if got := idleState(tc.idle, tc.ttl); got != tc.want {
				t.Errorf("idleState(%s, %s) = %s, want %s", tc.idle, tc.ttl, got, tc.want)
			}
		})
	}
}

func TestBuildPageCounters(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	counters := []Counter{
		{Resource: "tex", Level: "user", Scope: "acme/ann", Count: 1, Booked: 1, Cap: 1, UpdatedAt: now.Add(-time.Minute)},
		{Resource: "tex", Level: "global", Scope: "*", Count: 5, Booked: 5, Cap: 6, UpdatedAt: now},
		{Resource: "tex", Level: "tenant", Scope: "acme", Count: 3, Booked: 2, Cap: 3, UpdatedAt: now},
		{Resource: "tex", Level: "project", Scope: "acme/thesis", Count: 1, Booked: 1, UpdatedAt: now},
		{Resource: "browser", Level: "tenant", Scope: "acme", Count: 4, Booked: 4, Cap: 2, UpdatedAt: now},
		{Resource: "tex", Level: "bogus", Scope: "acme", Count: 1, Booked: 1, UpdatedAt: now},
		{Resource: "tex", Level: "project", Scope: "acme/idle", Count: 0, Booked: 0, Cap: 1, UpdatedAt: now},
		{Resource: "pdf", Level: "tenant", Scope: "acme", Count: 2, Booked: 2, CapReason: "Ambiguous", UpdatedAt: now},
		{Resource: "pdf", Level: "project", Scope: "acme/thesis", Count: 2, Booked: 2, CapReason: "Uncapped", UpdatedAt: now},
	}
	p := buildPage("acme", now, nil, counters, nil, false)
	type row struct {
		Resource, Level, Scope, Drift string
		Cap                           CapState
		Occupancy                     string
		Percent                       int
		Full                          bool
	}
	var got []row
	for _, g := range p.Resources {
		for _, c := range g.Counters {
			got = append(got, row{c.Resource, c.Level, c.Scope, c.DriftText, c.CapState, c.Occupancy, c.Percent, c.Full})
		}
	}
	want := []row{
		{"browser", "tenant", "acme", "", CapKnown, "4 of 2", 100, true},
		{"pdf", "tenant", "acme", "", CapAmbiguous, "2 in use", 0, false},
		{"pdf", "project", "acme/thesis", "", CapNone, "2 in use", 0, false},
		{"tex", "tenant", "acme", "+1", CapKnown, "3 of 3", 100, true},
		{"tex", "project", "acme/idle", "", CapKnown, "0 of 1", 0, false},
		{"tex", "project", "acme/thesis", "", CapUnknown, "1 in use", 0, false},
		{"tex", "user", "acme/ann", "", CapKnown, "1 of 1", 100, true},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("counters (-want +got):\n%s", diff)
	}
	var inUse []string
	for _, g := range p.Resources {
		for _, c := range g.InUse {
			inUse = append(inUse, c.Resource+" "+c.Level)
		}
	}
	if diff := cmp.Diff([]string{"browser tenant", "pdf tenant", "pdf project", "tex tenant", "tex project", "tex user"}, inUse); diff != "" {
		t.Errorf("counters in use (-want +got):\n%s", diff)
	}
	if p.DriftCount != 1 || !p.Resources[2].Drift || p.Resources[0].Drift {
		t.Errorf("drift: count %d, browser %v, tex %v; want 1, false, true", p.DriftCount, p.Resources[0].Drift, p.Resources[2].Drift)
	}
}

func TestBuildPageHolders(t *testing.T) {
	now := time.Date(2026, 12, 3, 10, 0, 0, 0, time.UTC)
	holders := []Holder{
		{Name: "b", Resource: "tex", Project: "web", User: "bob", TTL: 2 * time.Minute,
			AcquiredAt: now.Add(-90 * time.Minute), LastSeenAt: now.Add(-100 * time.Second)},
		{Name: "a", Resource: "tex", Project: "thesis", User: "ann", TTL: 2 * time.Minute,
			AcquiredAt: now.Add(-3 * time.Minute), LastSeenAt: now.Add(-10 * time.Second)},
		{Name: "c", Resource: "browser", Project: "thesis", User: "ann", TTL: time.Minute,
			AcquiredAt: now.Add(-26 * time.Hour), LastSeenAt: now.Add(-5 * time.Minute)},
		// The store's clock may be slightly ahead of this process's.
		{Name: "d", Resource: "tex", Project: "web", User: "cy", TTL: time.Minute,
			AcquiredAt: now.Add(time.Second), LastSeenAt: now.Add(time.Second)},
	}
	p := buildPage("acme", now, holders, nil, nil, true)
	type row struct {
		Name, Age, Idle, TTL string
		State                IdleState
		Percent              int
	}
	var got []row
	for _, h := range p.Holders {
		got = append(got, row{h.Name, h.Age, h.Idle, h.TTLText, h.IdleState, h.IdlePercent})
	}
	want := []row{
		{"c", "1d2h", "5m", "1m", IdleOver, 100},
		{"a", "3m", "10s", "2m", IdleOK, 8},
		{"b", "1h30m", "1m40s", "2m", IdleNear, 83},
		{"d", "0s", "0s", "1m", IdleOK, 0},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("holders (-want +got):\n%s", diff)
	}
}

func TestBuildPageWaiters(t *testing.T) {
	now := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	waiters := []Waiter{
		{Name: "lh-b", Resource: "tex", Level: "tenant", Scope: "acme", Position: 1, EstimatedWait: 1500 * time.Millisecond, Since: now.Add(-5 * time.Second)},
		{Name: "lh-a", Resource: "tex", Level: "global", Scope: "*", Position: 0, Since: now.Add(-10 * time.Second)},
		{Name: "lh-c", Resource: "tex", Level: "tenant", Scope: "acme", Position: 2, EstimatedWait: 300 * time.Millisecond, Since: now.Add(-time.Second), Lapsed: true},
		// An urgent waiter stands before older ones of a lower priority (docs/waiting.md, "Priority").
		{Name: "lh-d", Resource: "tex", Level: "tenant", Scope: "acme", Position: 0, Since: now.Add(-2 * time.Second), Priority: 5},
	}
	p := buildPage("acme", now, nil, nil, waiters, false)
	var got []string
	for _, w := range p.Waiters {
		got = append(got, w.Name+" "+w.Waiting+" "+w.Estimate)
	}
	want := []string{"lh-d 2s unknown", "lh-a 10s unknown", "lh-b 5s about 1s", "lh-c 1s about 300ms"}
	if strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("waiter rows %q, want %q (highest priority first, then oldest)", got, want)
	}
}
