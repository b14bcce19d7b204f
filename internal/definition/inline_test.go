package definition

import (
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/lease"
)

func TestInline(t *testing.T) {
	cases := map[string]struct {
		tenant, project string
		json            string // the request's inline object
		want            Definition
		wantField       string // the field the *lease.InvalidError names
	}{
		"project-private resource and owned fields": {
			tenant: "acme", project: "web",
			json: `{"name":"browser","levels":{"project":2,"user":1},"ttlSeconds":300,"waitMs":0}`,
			want: Definition{Name: "browser", Resource: "mcp-inline:acme/web/browser", Caps: Caps{Project: 2, User: 1},
				TTL: 5 * time.Minute, Wait: 0, Inline: true, Fairness: FairProcess},
		},
		"no caps is a NOOP with defaults": {
			tenant: "acme", project: "web", json: `{"name":"browser"}`,
			want: Definition{Name: "browser", Resource: "mcp-inline:acme/web/browser", TTL: DefaultTTL, Wait: DefaultWait, Inline: true, Fairness: FairProcess},
		},
		"name is mandatory":         {tenant: "acme", project: "web", json: `{"levels":{"user":1}}`, wantField: "inline.name"},
		"name must be valid":        {tenant: "acme", project: "web", json: `{"name":"a/b"}`, wantField: "inline.name"},
		"resource is rejected":      {tenant: "acme", project: "web", json: `{"name":"b","resource":"tex2pdf"}`, wantField: "inline.resource"},
		"levels.global is rejected": {tenant: "acme", project: "web", json: `{"name":"b","levels":{"global":100}}`, wantField: "inline.levels.global"},
		"levels.tenant is rejected": {tenant: "acme", project: "web", json: `{"name":"b","levels":{"tenant":1}}`, wantField: "inline.levels.tenant"},
		"fairness is rejected":      {tenant: "acme", project: "web", json: `{"name":"b","fairness":"global"}`, wantField: "inline.fairness"},
		"cap below 1":               {tenant: "acme", project: "web", json: `{"name":"b","levels":{"user":0}}`, wantField: "inline.levels.user"},
		"ttl below 1":               {tenant: "acme", project: "web", json: `{"name":"b","ttlSeconds":0}`, wantField: "inline.ttlSeconds"},
		"negative wait":             {tenant: "acme", project: "web", json: `{"name":"b","waitMs":-1}`, wantField: "inline.waitMs"},
		"bad tenant":                {tenant: "a/b", project: "web", json: `{"name":"b"}`, wantField: "tenant"},
		"bad project":               {tenant: "acme", project: "", json: `{"name":"b"}`, wantField: "project"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			var spec InlineSpec
			if err := json.Unmarshal([]byte(tc.json), &spec); err != nil {
				t.Fatalf("decoding %s: %v", tc.json, err)
			}
			got, err := Inline(tc.tenant, tc.project, spec)
			if tc.wantField != "" {
				var inv *lease.InvalidError
				if !errors.As(err, &inv) || !errors.Is(err, lease.ErrInvalid) {
					t.Fatalf("Inline() error = %v, want an *lease.InvalidError", err)
				}
				if inv.Field != tc.wantField {
					t.Errorf("Inline() error names %q, want %q (%v)", inv.Field, tc.wantField, err)
				}
				if errors.Is(err, lease.ErrUnavailable) {
					t.Errorf("Inline() error = %v is lease.ErrUnavailable, want only lease.ErrInvalid", err)
				}
				return
			}
			if err != nil {
				t.Fatalf("Inline() error = %v", err)
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("Inline() mismatch (-want +got):\n%s", diff)
			}
			if got.NoOp() != (got.Caps == Caps{}) {
				t.Errorf("NoOp() = %v for caps %+v", got.NoOp(), got.Caps)
			}
		})
	}
}
