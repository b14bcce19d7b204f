package tokenscan_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

const (
	tok   = "0123456789abcdef0123456789abcdef"
	other = "fedcba9876543210fedcba9876543210"
)

func TestScanFiles(t *testing.T) {
	cases := map[string]struct {
		log  string
		want []tokenscan.Hit
	}{
		"clean log": {
			log: "INFO Lease revoked {\"holder\": \"" + lease.HolderID(tok) + "\"}\nINFO Sweep idle=0\n",
		},
		"token as a value": {
			log: "INFO ok\nERROR Deleting the MCP session failed {\"token\": \"" + tok + "\"}\n",
			want: []tokenscan.Hit{{Line: 2, Holder: lease.HolderID(tok),
				Text: `ERROR Deleting the MCP session failed {"token": "<token>"}`}},
		},
		"token in an error text": {
			log: "ERROR Release failed {\"error\": \"holder " + tok + ": LEASE_LOST\"}",
			want: []tokenscan.Hit{{Line: 1, Holder: lease.HolderID(tok),
				Text: `ERROR Release failed {"error": "holder <token>: LEASE_LOST"}`}},
		},
		"token glued to other hex digits": {
			log:  "x=deadbeef" + tok + "\n",
			want: []tokenscan.Hit{{Line: 1, Holder: lease.HolderID(tok), Text: "x=<token>"}},
		},
		"path with a token the suite was not handed": {
			log:  "ERROR Lease request failed {\"path\": \"/v1/leases/" + other + "/check\"}\n",
			want: []tokenscan.Hit{{Line: 1, Text: `ERROR Lease request failed {"path": "/v1/leases/<token>/check"}`}},
		},
		"path pattern without a token": {
			log: "ERROR Lease request failed {\"route\": \"POST /v1/leases/{token}/check\"}\n",
		},
		"an unrecorded 32-digit hex run outside a path": {
			log: "trace=" + other + "\n",
		},
		"uppercase is no token": {
			log: "x=" + strings.ToUpper(tok) + "\n",
		},
		"a very long line": {
			log: strings.Repeat("z", 200<<10) + " " + tok + "\nnext\n",
			want: []tokenscan.Hit{{Line: 1, Holder: lease.HolderID(tok),
				Text: lease.Clip(strings.Repeat("z", 200<<10), 300)}},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "manager.log")
			if err := os.WriteFile(path, []byte(tc.log), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := tokenscan.ScanFiles([]string{tok}, path, filepath.Join(t.TempDir(), "never-started.log"))
			if err != nil {
				t.Fatal(err)
			}
			for i := range tc.want {
				tc.want[i].File = path
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("hits (-want +got):\n%s", diff)
			}
			for _, h := range got {
				if strings.Contains(h.String(), tok) || strings.Contains(h.String(), other) {
					t.Errorf("the report of a hit repeats the token: %s", h)
				}
			}
		})
	}
}

func TestScanFilesReportsUnreadableFiles(t *testing.T) {
	dir := t.TempDir() // a directory: opens, but cannot be read as a file
	hits, err := tokenscan.ScanFiles([]string{tok}, dir)
	if err == nil || len(hits) != 0 {
		t.Errorf("ScanFiles(a directory) = %v, %v; want an error", hits, err)
	}
}

func TestText(t *testing.T) {
	if hits := tokenscan.Text("holder "+lease.HolderID(tok)+": LEASE_LOST", tok); len(hits) != 0 {
		t.Errorf("Text(an ID) = %v, want none", hits)
	}
	hits := tokenscan.Text("first\nholder "+tok+": LEASE_LOST", tok)
	if len(hits) != 1 || hits[0].Line != 2 || hits[0].Holder != lease.HolderID(tok) {
		t.Errorf("Text(a token) = %v, want one hit on line 2", hits)
	}
}

func TestTokens(t *testing.T) {
	var ts tokenscan.Tokens
	for _, s := range []string{other, tok, tok, "", "noop", strings.ToUpper(tok), tok + "0", "lh-0123456789abcdef01234567"} {
		ts.Add(s)
	}
	if diff := cmp.Diff([]string{tok, other}, ts.List()); diff != "" {
		t.Errorf("List (-want +got):\n%s", diff)
	}
	if ts.Len() != 2 {
		t.Errorf("Len = %d, want 2", ts.Len())
	}
}

func TestLogger(t *testing.T) {
	log, lines := tokenscan.Logger()
	log.WithName("agent").Info("Lease revoked", "holder", lease.HolderID(tok))
	log.V(1).Error(errors.New("boom"), "Handler failed", "n", 1)
	got := lines()
	for _, want := range []string{`agent "level"=0 "msg"="Lease revoked" "holder"="` + lease.HolderID(tok) + `"`, `"error"="boom"`} {
		if !strings.Contains(got, want) {
			t.Errorf("captured %q, want it to contain %q", got, want)
		}
	}
	if n := strings.Count(got, "\n"); n != 2 {
		t.Errorf("captured %d lines, want 2:\n%s", n, fmt.Sprint(got))
	}
}
