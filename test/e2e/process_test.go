package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vancetope/lease-operator/internal/testutil/agentbuild"
)

// stopTimeout bounds a graceful stop (SIGTERM) before a child is killed.
const stopTimeout = 15 * time.Second

// process is a child process of the suite (the manager or an agent) whose combined output
// goes to a log file, shown when a spec fails.
type process struct {
	name    string
	cmd     *exec.Cmd
	logPath string
	done    chan struct{} // closed when the process has exited
	waitErr error         // set before done is closed
}

// processLogs are the logs of every process startProcess started, for the scan for tokens at
// the end of the suite.
var processLogs struct {
	mu    sync.Mutex
	paths []string
}

// logPaths returns the log of every process the suite started.
func logPaths() []string {
	processLogs.mu.Lock()
	defer processLogs.mu.Unlock()
	return slices.Clone(processLogs.paths)
}

// startProcess starts bin with args and env (the complete environment), writing stdout and
// stderr to <logDir>/<name>.log.
func startProcess(name, logDir, bin string, args, env []string) (*process, error) {
	logPath := filepath.Join(logDir, name+".log")
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, fmt.Errorf("creating the log of %s: %w", name, err)
	}
	processLogs.mu.Lock()
	processLogs.paths = append(processLogs.paths, logPath)
	processLogs.mu.Unlock()
	cmd := exec.Command(bin, args...)
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		_ = logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	// The child has its own descriptor of the log file.
	_ = logFile.Close()
	p := &process{name: name, cmd: cmd, logPath: logPath, done: make(chan struct{})}
	go func() {
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

// exited reports whether the process has ended.
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop ends the process: SIGTERM, then SIGKILL after stopTimeout. An exit caused by the
// SIGTERM is no error; an earlier exit is.
func (p *process) stop() error {
	if p == nil {
		return nil
	}
	if p.exited() {
		return fmt.Errorf("%s had exited already: %v", p.name, p.waitErr)
	}
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		_ = p.cmd.Process.Kill()
	}
	select {
	case <-p.done:
		return nil
	case <-time.After(stopTimeout):
		_ = p.cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not stop within %v after SIGTERM and was killed", p.name, stopTimeout)
	}
}

// describe names the process, its state and the tail of its log, for failure messages.
func (p *process) describe() string {
	state := "running"
	if p.exited() {
		state = fmt.Sprintf("exited: %v", p.waitErr)
	}
	return fmt.Sprintf("%s (pid %d, %s), log %s, last lines:\n%s", p.name, p.cmd.Process.Pid, state, p.logPath, p.tail(60))
}

// tail returns the last n lines of the log.
func (p *process) tail(n int) string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = f.Close() }()
	const maxTail = 256 << 10
	if info, err := f.Stat(); err == nil && info.Size() > maxTail {
		_, _ = f.Seek(-maxTail, io.SeekEnd)
	}
	data, err := io.ReadAll(f)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// freePorts returns n distinct TCP ports on 127.0.0.1 that were free a moment ago. All of
// them are held until the last one is chosen, so that none comes back twice.
func freePorts(n int) ([]int, error) {
	ports := make([]int, 0, n)
	for range n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer func() { _ = ln.Close() }()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// childEnv returns this process's environment without the variables that configure the
// lease operator or select a cluster, plus extra (KEY=value).
func childEnv(extra ...string) []string {
	drop := map[string]bool{
		"KUBECONFIG": true, "KUBERNETES_SERVICE_HOST": true, "KUBERNETES_SERVICE_PORT": true,
		"MONGODB_URI": true, "MONGODB_DATABASE": true,
		"POD_NAMESPACE": true, "POD_NAME": true, "POD_UID": true,
		"LEASE_ADMIN_SECRET": true, "LEASE_INTERNAL_SECRET": true, "LEASE_DEFINITIONS_NAMESPACE": true,
	}
	var env []string
	for _, kv := range os.Environ() {
		key, _, _ := strings.Cut(kv, "=")
		if !drop[key] {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// buildManager builds ./cmd/manager and ./cmd/agent of the module at root into dir and
// returns the manager's binary; the agent's is beside it (agentBinOf).
func buildManager(root, dir string) (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goroot := os.Getenv("GOROOT")
		if goroot == "" {
			return "", fmt.Errorf("the go command is needed to build the manager: %w", err)
		}
		goTool = filepath.Join(goroot, "bin", "go")
	}
	bin := filepath.Join(dir, "manager")
	cmd := exec.Command(goTool, "build", "-o", dir+string(filepath.Separator), "./cmd/manager")
	cmd.Dir = root
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build -o %s ./cmd/manager: %w\n%s", dir, err, out)
	}
	if _, err := agentbuild.Build(goTool, root, dir, nil); err != nil {
		return "", err
	}
	return bin, nil
}

// agentBinOf is the agent's binary built beside the manager's.
func agentBinOf(managerBin string) string { return filepath.Join(filepath.Dir(managerBin), "agent") }
