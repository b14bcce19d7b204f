// Package tokenscan finds lease tokens where none may be: in the logs of the processes a
// test suite ran, and in the log lines and error texts a unit test captured. A holder's token
// is a bearer secret; everything but the answer to its own acquisition names the holder by
// its public ID (docs/security.md, "Tokens"). The e2e and robustness suites record every token
// they are handed (Tokens) and, at their end, scan every child process's log (ScanFiles) for
// those tokens and for any admission API path that carries a token (PathPattern), whoever
// acquired it.
package tokenscan

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/funcr"

	"github.com/vancetope/lease-operator/internal/lease"
)

// tokenLen is the length of a token: 128 random bits in lowercase hex.
const tokenLen = 32

// PathPattern is a path of the admission API that carries a token: /v1/leases/{token}, with
// or without /check, /payload or /events after it.
var PathPattern = regexp.MustCompile(`/v1/leases/[0-9a-f]{32}`)

// hexRun is a run of lowercase hex digits long enough to hold a token.
var hexRun = regexp.MustCompile(`[0-9a-f]{32,}`)

// Tokens is the set of tokens a suite was handed. Safe for concurrent use.
type Tokens struct {
	mu  sync.Mutex
	set map[string]bool
}

// Add records token; anything that is not 32 lowercase hex digits (an empty token of a NOOP
// answer, say) is ignored.
func (t *Tokens) Add(token string) {
	if len(token) != tokenLen || hexRun.FindString(token) != token {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.set == nil {
		t.set = map[string]bool{}
	}
	t.set[token] = true
}

// Len is the number of tokens recorded.
func (t *Tokens) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.set)
}

// List returns the tokens recorded, sorted.
func (t *Tokens) List() []string {
	t.mu.Lock()
	defer t.mu.Unlock()
	out := make([]string, 0, len(t.set))
	for tok := range t.set {
		out = append(out, tok)
	}
	slices.Sort(out)
	return out
}

// Hit is a token found where none may be.
type Hit struct {
	// File is the log's path ("" for a text scanned with Text); Line counts from 1.
	File string
	Line int
	// Holder is the public ID of the token found, or "" when the line matched PathPattern
	// with a token the suite was not handed (of a pod admission or an example, say).
	Holder string
	// Text is the line, the token in it replaced by <token>, clipped to 300 bytes.
	Text string
}

// String names the place and the holder; it never repeats the token.
func (h Hit) String() string {
	what := "an admission API path with a token"
	if h.Holder != "" {
		what = "the token of holder " + h.Holder
	}
	where := fmt.Sprintf("line %d", h.Line)
	if h.File != "" {
		where = fmt.Sprintf("%s:%d", h.File, h.Line)
	}
	return fmt.Sprintf("%s: %s: %s", where, what, h.Text)
}

// ScanFiles reads each file line by line and reports every line that holds one of tokens
// or matches PathPattern, in file order. A file that does not exist is skipped (a process
// that never started wrote none); any other read error is returned with what was found.
func ScanFiles(tokens []string, paths ...string) ([]Hit, error) {
	set := setOf(tokens)
	var hits []Hit
	var errs []error
	for _, p := range paths {
		f, err := os.Open(p)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		found, err := scan(f, p, set)
		_ = f.Close()
		hits = append(hits, found...)
		if err != nil {
			errs = append(errs, fmt.Errorf("reading %s: %w", p, err))
		}
	}
	return hits, errors.Join(errs...)
}

// Text is ScanFiles for a text a test captured (log lines, an error's text, an answer's body).
func Text(text string, tokens ...string) []Hit {
	hits, _ := scan(strings.NewReader(text), "", setOf(tokens))
	return hits
}

func setOf(tokens []string) map[string]bool {
	set := make(map[string]bool, len(tokens))
	for _, t := range tokens {
		set[t] = true
	}
	return set
}

// scan reads r line by line, however long a line (a stack trace in a JSON log line).
func scan(r io.Reader, file string, tokens map[string]bool) ([]Hit, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var hits []Hit
	for n := 1; ; n++ {
		line, err := br.ReadString('\n')
		if line != "" {
			if h, ok := inspect(line, tokens); ok {
				h.File, h.Line = file, n
				hits = append(hits, h)
			}
		}
		if errors.Is(err, io.EOF) {
			return hits, nil
		}
		if err != nil {
			return hits, err
		}
	}
}

// inspect looks for a recorded token in every 32-digit window of every hex run of line (a
// token may be glued to other hex digits), then for PathPattern.
func inspect(line string, tokens map[string]bool) (Hit, bool) {
	line = strings.TrimRight(line, "\r\n")
	for _, run := range hexRun.FindAllString(line, -1) {
		for i := 0; i+tokenLen <= len(run); i++ {
			if tok := run[i : i+tokenLen]; tokens[tok] {
				return Hit{Holder: lease.HolderID(tok), Text: redact(line)}, true
			}
		}
	}
	if PathPattern.MatchString(line) {
		return Hit{Text: redact(line)}, true
	}
	return Hit{}, false
}

// redact replaces every run of 32 or more hex digits by <token>, so that a report of a hit
// does not spread the token further, and clips the line.
func redact(line string) string {
	return lease.Clip(hexRun.ReplaceAllString(line, "<token>"), 300)
}

// Logger returns a logger that keeps every line it writes, and a function that returns
// them, one a line: for a unit test that asserts on what a component logs.
func Logger() (logr.Logger, func() string) {
	var mu sync.Mutex
	var b strings.Builder
	l := funcr.New(func(prefix, args string) {
		mu.Lock()
		defer mu.Unlock()
		if prefix != "" {
			b.WriteString(prefix + " ")
		}
		b.WriteString(args + "\n")
	}, funcr.Options{Verbosity: 10})
	return l, func() string {
		mu.Lock()
		defer mu.Unlock()
		return b.String()
	}
}
