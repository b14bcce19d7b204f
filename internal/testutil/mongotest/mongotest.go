// Package mongotest gives tests a MongoDB to talk to: a real one named by $MONGODB_URI, or
// else the development server hack/mongodev (FerretDB behind a serializing wire proxy),
// started once per test binary.
//
// Typical use:
//
//	func TestMain(m *testing.M) {
//		code := m.Run()
//		mongotest.Stop()
//		os.Exit(code)
//	}
//
//	func TestX(t *testing.T) {
//		uri, err := mongotest.URI()
//		if err != nil {
//			t.Fatal(err)
//		}
//		store, err := leasestore.Connect(uri, mongotest.DatabaseName(t))
//		...
//	}
//
// Store tests normally use internal/testutil/storetest instead, which does the above, creates
// the indexes, and drops the database when the test ends.
//
// The mongodev binary is <repo root>/bin/mongodev; it is built from hack/mongodev when it is
// missing or older than its sources ($MONGODEV_BIN overrides the path and skips building).
// A cold build takes a few minutes on a 2-core machine.
//
// This package uses only the standard library.
package mongotest

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vancetope/lease-operator/internal/settings"
)

const (
	modulePath = "github.com/vancetope/lease-operator"
	readyLine  = "mongodev listening on "

	// StartTimeout bounds the wait for the ready line of a started server.
	StartTimeout = 60 * time.Second
	// stopTimeout bounds a graceful stop before the process is killed.
	stopTimeout = 10 * time.Second
)

var (
	sharedMu  sync.Mutex
	shared    *Server
	sharedErr error
)

// URI returns the MongoDB URI for tests: $MONGODB_URI when set (a real MongoDB), otherwise
// the URI of a development server started once per test binary (process). Safe for
// concurrent use. A failure to start is remembered: later calls return the same error.
func URI() (string, error) {
	if uri := os.Getenv(settings.EnvMongoURI); uri != "" {
		return uri, nil
	}
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if sharedErr != nil {
		return "", sharedErr
	}
	if shared != nil && !shared.exited() {
		return shared.URI(), nil
	}
	if shared != nil {
		// It died under us (it should not): start another one.
		_ = shared.Stop()
		shared = nil
	}
	s, err := StartServer()
	if err != nil {
		sharedErr = err
		return "", err
	}
	shared = s
	return s.URI(), nil
}

// Stop stops the server started by URI, if any (call from TestMain after m.Run()).
// A later URI starts a new one.
func Stop() {
	sharedMu.Lock()
	defer sharedMu.Unlock()
	if shared != nil {
		if err := shared.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "mongotest: stopping mongodev: %v\n", err)
		}
		shared = nil
	}
	sharedErr = nil
}

// Server is a running mongodev process.
type Server struct {
	uri   string
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   *tailBuffer

	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done is closed

	stopOnce sync.Once
	stopErr  error
}

// StartServer starts a dedicated development server (always mongodev, even when MONGODB_URI
// is set), for tests that must stop the server mid-test. Its data lives in a temporary
// directory removed when it stops. The caller must Stop it.
func StartServer() (*Server, error) {
	bin, err := binary()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	// Port 0: mongodev binds a free port and reports it in its ready line, so concurrent test
	// binaries cannot race for a port. With --exit-on-stdin-eof it shuts down (removing its
	// data directory) when this process goes away, even if Stop is never called.
	cmd := exec.Command(bin, "--listen", "127.0.0.1:0", "--exit-on-stdin-eof")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	// A pipe of our own rather than StdoutPipe, which Wait would close under the reader.
	stdout, stdoutW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer func() { _ = stdoutW.Close() }() // the child has its copy
	cmd.Stdout = stdoutW
	s := &Server{cmd: cmd, stdin: stdin, log: &tailBuffer{max: 64 << 10}, done: make(chan struct{})}
	// Not an *os.File, so the child does not hold this process's stderr open.
	cmd.Stderr = &prefixWriter{prefix: "mongodev: ", w: io.MultiWriter(os.Stderr, s.log)}
	if err := cmd.Start(); err != nil {
		_ = stdout.Close()
		return nil, fmt.Errorf("mongotest: start %s: %w", bin, err)
	}

	ready := make(chan string, 1)
	go func() {
		defer func() { _ = stdout.Close() }()
		sc := bufio.NewScanner(stdout)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			if !sent && strings.HasPrefix(line, readyLine) {
				ready <- strings.TrimSpace(strings.TrimPrefix(line, readyLine))
				sent = true
				continue
			}
			_, _ = s.log.Write([]byte(line + "\n"))
		}
		_, _ = io.Copy(io.Discard, stdout)
	}()
	go func() {
		s.waitErr = cmd.Wait()
		close(s.done)
	}()

	timer := time.NewTimer(StartTimeout)
	defer timer.Stop()
	select {
	case s.uri = <-ready:
		fmt.Fprintf(os.Stderr, "mongotest: mongodev ready at %s in %v\n", s.uri, time.Since(start).Round(time.Millisecond))
		return s, nil
	case <-s.done:
		return nil, fmt.Errorf("mongotest: mongodev exited before it was ready (%v); its output:\n%s", s.waitErr, s.log.String())
	case <-timer.C:
		_ = s.Stop()
		return nil, fmt.Errorf("mongotest: mongodev not ready within %v; its output:\n%s", StartTimeout, s.log.String())
	}
}

// URI returns the server's MongoDB URI, like mongodb://127.0.0.1:40123/.
func (s *Server) URI() string { return s.uri }

// Stop stops the server: gracefully (SIGTERM), or by killing it after 10 s. It is safe to
// call more than once; later calls return the first result.
func (s *Server) Stop() error {
	s.stopOnce.Do(func() {
		if s.exited() {
			s.stopErr = fmt.Errorf("mongodev had exited already: %v; its output:\n%s", s.waitErr, s.log.String())
			return
		}
		// SIGTERM, not also end of stdin: mongodev treats a second shutdown request as
		// "die now". Where there is no SIGTERM, closing stdin asks it to stop.
		defer func() { _ = s.stdin.Close() }()
		if err := terminate(s.cmd.Process); err != nil {
			_ = s.stdin.Close()
		}
		select {
		case <-s.done:
			if s.waitErr != nil {
				s.stopErr = fmt.Errorf("mongodev: %v; its output:\n%s", s.waitErr, s.log.String())
			}
		case <-time.After(stopTimeout):
			_ = s.cmd.Process.Kill()
			<-s.done
			s.stopErr = fmt.Errorf("mongodev did not stop within %v and was killed", stopTimeout)
		}
	})
	return s.stopErr
}

func (s *Server) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// DatabaseName returns a unique database name for one test: "lt_", up to 20 characters of
// the test's name (lower case, [a-z0-9_]), "_" and 12 random hex digits; at most 36 bytes.
func DatabaseName(t testing.TB) string {
	var b strings.Builder
	b.WriteString("lt_")
	n := 0
	under := true // no leading or doubled '_'
	for _, r := range strings.ToLower(t.Name()) {
		if n == 20 {
			break
		}
		switch {
		case r >= 'a' && r <= 'z' || r >= '0' && r <= '9':
			b.WriteRune(r)
			under = false
		case !under:
			b.WriteByte('_')
			under = true
		default:
			continue
		}
		n++
	}
	if !under {
		b.WriteByte('_')
	}
	var rnd [6]byte
	_, _ = rand.Read(rnd[:])
	b.WriteString(hex.EncodeToString(rnd[:]))
	return b.String()
}

var (
	binMu   sync.Mutex
	binPath string
)

// binary returns the path of an up-to-date mongodev binary, building it if needed (once per
// process; across processes under a file lock, written to a temporary name and renamed).
func binary() (string, error) {
	if p := os.Getenv("MONGODEV_BIN"); p != "" {
		return p, nil
	}
	binMu.Lock()
	defer binMu.Unlock()
	if binPath != "" {
		return binPath, nil
	}
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	src := filepath.Join(root, "hack", "mongodev")
	bin := filepath.Join(root, "bin", "mongodev")
	if fresh, err := upToDate(bin, src); err != nil {
		return "", err
	} else if !fresh {
		if err := build(src, bin); err != nil {
			return "", err
		}
	}
	binPath = bin
	return bin, nil
}

func build(src, bin string) error {
	dir := filepath.Dir(bin)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	unlock, err := lockFile(filepath.Join(dir, ".mongodev.lock"))
	if err != nil {
		return fmt.Errorf("mongotest: lock: %w", err)
	}
	defer unlock()
	// Another process may have built it while we waited for the lock.
	if fresh, err := upToDate(bin, src); err != nil || fresh {
		return err
	}

	goTool, err := exec.LookPath("go")
	if err != nil {
		if goroot := os.Getenv("GOROOT"); goroot != "" {
			goTool = filepath.Join(goroot, "bin", "go")
		} else {
			return fmt.Errorf("mongotest: go command not found to build %s: %w", bin, err)
		}
	}
	tmp := filepath.Join(dir, fmt.Sprintf(".mongodev.%d.tmp", os.Getpid()))
	defer func() { _ = os.Remove(tmp) }()
	fmt.Fprintf(os.Stderr, "mongotest: building %s (a cold build takes a few minutes)\n", bin)
	start := time.Now()
	cmd := exec.Command(goTool, "build", "-C", src, "-o", tmp, ".")
	cmd.Env = append(os.Environ(), "GOWORK=off")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mongotest: go build -C %s -o %s .: %v\n%s", src, tmp, err, out.String())
	}
	if err := os.Rename(tmp, bin); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "mongotest: built %s in %v\n", bin, time.Since(start).Round(100*time.Millisecond))
	return nil
}

// upToDate reports whether bin exists and is newer than every source of the mongodev
// module (its .go files other than tests, go.mod and go.sum).
func upToDate(bin, src string) (bool, error) {
	bi, err := os.Stat(bin)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	entries, err := os.ReadDir(src)
	if err != nil {
		return false, fmt.Errorf("mongotest: mongodev sources: %w", err)
	}
	for _, e := range entries {
		name := e.Name()
		source := name == "go.mod" || name == "go.sum" ||
			strings.HasSuffix(name, ".go") && !strings.HasSuffix(name, "_test.go")
		if e.IsDir() || !source {
			continue
		}
		info, err := e.Info()
		if err != nil {
			return false, err
		}
		if info.ModTime().After(bi.ModTime()) {
			return false, nil
		}
	}
	return true, nil
}

// RepoRoot returns the directory holding the go.mod of module
// github.com/vancetope/lease-operator, walking up from the working directory.
func RepoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if data, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && moduleName(data) == modulePath {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", fmt.Errorf("mongotest: no go.mod of module %s above the working directory", modulePath)
		}
		dir = parent
	}
}

// moduleName returns the module path declared in go.mod data.
func moduleName(gomod []byte) string {
	for _, line := range strings.Split(string(gomod), "\n") {
		line, _, _ = strings.Cut(line, "//")
		fields := strings.Fields(line)
		if len(fields) == 2 && fields[0] == "module" {
			return strings.Trim(fields[1], "\"`")
		}
	}
	return ""
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if over := len(b.buf) - b.max; over > 0 {
		b.buf = append(b.buf[:0], b.buf[over:]...)
	}
	return len(p), nil
}

func (b *tailBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.buf)
}

// prefixWriter writes each line with a prefix.
type prefixWriter struct {
	prefix  string
	w       io.Writer
	mu      sync.Mutex
	midLine bool
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []byte
	for _, c := range b {
		if !p.midLine {
			out = append(out, p.prefix...)
			p.midLine = true
		}
		out = append(out, c)
		if c == '\n' {
			p.midLine = false
		}
	}
	if _, err := p.w.Write(out); err != nil {
		return 0, err
	}
	return len(b), nil
}
