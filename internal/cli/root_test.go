package cli_test

import (
	"strings"
	"testing"
)

func TestRootCommand(t *testing.T) {
	cases := []struct {
		name     string
		args     []string
		wantCode int
		inStdout []string
		inStderr []string
	}{
		{
			name:     "help lists every command",
			args:     []string{"--help"},
			inStdout: []string{"kubectl lease [command]", "list", "show", "counters", "definition", "revoke", "revoke-pod", "sweep", "reconcile", "ui"},
		},
		{
			name:     "no command prints help",
			args:     nil,
			inStdout: []string{"Usage:\n  kubectl lease [flags]"},
		},
		{
			name:     "unknown command",
			args:     []string{"bogus"},
			wantCode: 1,
			inStderr: []string{`error: unknown command "bogus" for "kubectl lease"`, "See 'kubectl lease --help' for usage."},
		},
		{
			name:     "unknown flag",
			args:     []string{"counters", "--nope"},
			wantCode: 1,
			inStderr: []string{"error: unknown flag: --nope", "See 'kubectl lease counters --help' for usage."},
		},
		{
			name:     "bad timeout",
			args:     []string{"list", "--timeout", "0s"},
			wantCode: 1,
			inStderr: []string{"--timeout must be positive"},
		},
		{
			name:     "ui refuses to listen beyond this machine",
			args:     []string{"ui", "--address", "0.0.0.0:8765"},
			wantCode: 1,
			inStderr: []string{"listens only on a loopback address"},
		},
		{
			name:     "ui needs host:port",
			args:     []string{"ui", "--address", "8765"},
			wantCode: 1,
			inStderr: []string{"want host:port"},
		},
		{
			name:     "completion of a fixed flag value",
			args:     []string{"__complete", "counters", "--level", ""},
			inStdout: []string{"user\nproject\ntenant\nglobal\n"},
		},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := run(t, nil, tc.args...)
			if r.code != tc.wantCode {
				t.Fatalf("exit %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, tc.wantCode, r.stdout, r.stderr)
			}
			for _, w := range tc.inStdout {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("stdout lacks %q:\n%s", w, r.stdout)
				}
			}
			for _, w := range tc.inStderr {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q:\n%s", w, r.stderr)
				}
			}
		})
	}
}
