//go:build robustness

package robustness

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
	"sigs.k8s.io/yaml"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasestore"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/agentbuild"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/internal/testutil/testenv"
	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

// The deployed shape on loopback addresses of its own (test/e2e uses 127.0.0.1–6): the
// store and the manager on managerIP, each agent on its pod's IP, and the manager's callers
// coming from callerIP, the IP of a pod without an agent.
const (
	managerIP      = "127.0.0.20"
	callerIP       = "127.0.0.23"
	namespace      = "acme"
	tenant         = "acme"
	systemNS       = "lease-system"
	internalSecret = "robustness-internal-secret"
	adminSecret    = "robustness-admin"
	database       = "robustness"
)

// agentIPs are the agents' pods (and their listeners).
var agentIPs = []string{"127.0.0.21", "127.0.0.22"}

// proc is a child process (the store, the manager or an agent) that the suite can kill,
// stop and start again with the same command line; its output goes to one log, appended
// across restarts.
type proc struct {
	name    string
	bin     string
	args    []string
	env     []string
	logPath string
	// stdin is held open for mongodev's --exit-on-stdin-eof.
	holdStdin bool

	mu      sync.Mutex
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan struct{}
	waitErr error
}

// start starts the process (again).
func (p *proc) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	logFile, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("opening the log of %s: %w", p.name, err)
	}
	defer func() { _ = logFile.Close() }() // the child has its own descriptor
	_, _ = fmt.Fprintf(logFile, "==== %s: starting %s %s\n", time.Now().Format(time.RFC3339Nano), p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = p.env
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// The kernel kills the child when the test binary dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdin io.WriteCloser
	if p.holdStdin {
		if stdin, err = cmd.StdinPipe(); err != nil {
			return err
		}
	}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("starting %s: %w", p.name, err)
	}
	done := make(chan struct{})
	p.cmd, p.stdin, p.done = cmd, stdin, done
	go func() {
		err := cmd.Wait()
		p.mu.Lock()
		p.waitErr = err
		p.mu.Unlock()
		close(done)
	}()
	return nil
}

// running reports whether the last start is still running.
func (p *proc) running() bool {
	p.mu.Lock()
	done := p.done
	p.mu.Unlock()
	if done == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// signal sends sig to the running process.
func (p *proc) signal(sig syscall.Signal) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return fmt.Errorf("%s was never started", p.name)
	}
	return p.cmd.Process.Signal(sig)
}

// kill sends sig (SIGKILL or SIGTERM) and waits for the exit, killing it after a bound.
func (p *proc) kill(sig syscall.Signal) error {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return nil
	}
	if err := cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("signalling %s: %w", p.name, err)
	}
	select {
	case <-done:
		return nil
	case <-time.After(15 * time.Second):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("%s did not exit within 15 s of %v and was killed", p.name, sig)
	}
}

// cluster is the deployed shape: the store, the manager and two agents.
type cluster struct {
	t       testing.TB
	workDir string
	env     *testenv.Env

	store    *proc
	storeURI string
	manager  *proc
	agents   []*proc
	// readyURLs are each process's readiness URL: the manager's probe, the agents' internal.
	managerReady string
	agentReady   []string
	// apiAddrs are the admission APIs of process 0 (the manager), 1 and 2 (the agents).
	apiAddrs []string
	// adminAddr is the manager's operator API.
	adminAddr string

	db *leasestore.Store
}

// freePort returns a TCP port that was free a moment ago on every one of ips.
func freePort(ips ...string) (int, error) {
	for range 50 {
		ln, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			return 0, err
		}
		port := ln.Addr().(*net.TCPAddr).Port
		free := true
		var others []net.Listener
		for _, ip := range ips[1:] {
			o, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			others = append(others, o)
		}
		_ = ln.Close()
		for _, o := range others {
			_ = o.Close()
		}
		if free {
			return port, nil
		}
	}
	return 0, errors.New("no port free on every address")
}

// childEnv is this process's environment without what configures the lease operator or
// selects a cluster, plus extra.
func childEnv(extra ...string) []string {
	drop := map[string]bool{
		"KUBECONFIG": true, "KUBERNETES_SERVICE_HOST": true, "KUBERNETES_SERVICE_PORT": true,
		"MONGODB_URI": true, "MONGODB_DATABASE": true, "POD_NAMESPACE": true, "POD_NAME": true, "POD_UID": true,
		"LEASE_ADMIN_SECRET": true, "LEASE_INTERNAL_SECRET": true, "LEASE_DEFINITIONS_NAMESPACE": true,
	}
	var env []string
	for _, kv := range os.Environ() {
		if key, _, _ := strings.Cut(kv, "="); !drop[key] {
			env = append(env, kv)
		}
	}
	return append(env, extra...)
}

// startCluster builds the manager, starts the control plane, the store and the processes.
func startCluster(ctx context.Context, t testing.TB, assets string) *cluster {
	t.Helper()
	root, err := mongotest.RepoRoot()
	if err != nil {
		t.Fatal(err)
	}
	workDir, err := os.MkdirTemp("", "lease-robustness-")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("robustness: binary, kubeconfig, store data and process logs in %s", workDir)
	c := &cluster{t: t, workDir: workDir}
	t.Cleanup(c.stop)

	built := make(chan error, 1)
	managerBin := filepath.Join(workDir, "manager")
	go func() {
		// The manager and, beside it, the agent binary the webhook injects.
		cmd := exec.Command("go", "build", "-o", workDir+string(filepath.Separator), "./cmd/manager")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			err = fmt.Errorf("go build ./cmd/manager: %w\n%s", err, out)
		} else {
			_, err = agentbuild.Build("go", root, workDir, nil)
		}
		built <- err
	}()

	if err := c.startStore(); err != nil {
		t.Fatal(err)
	}
	c.env, err = testenv.Start(assets, testenv.Options{})
	if err != nil {
		t.Fatal(err)
	}
	admin, err := c.env.AddUser(envtest.User{Name: "robustness-admin", Groups: []string{"system:masters"}}, c.env.Config)
	if err != nil {
		t.Fatal(err)
	}
	kubeconfig, err := admin.KubeConfig()
	if err != nil {
		t.Fatal(err)
	}
	kubeconfigPath := filepath.Join(workDir, "kubeconfig")
	if err := os.WriteFile(kubeconfigPath, kubeconfig, 0o600); err != nil {
		t.Fatal(err)
	}
	k := c.env.Client
	for _, ns := range []*corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: systemNS}},
		{ObjectMeta: metav1.ObjectMeta{Name: namespace, Labels: map[string]string{tenancy.TenantLabel: tenant}}},
	} {
		if err := k.Create(ctx, ns); err != nil {
			t.Fatal(err)
		}
	}
	pods := make([]corev1.Pod, 0, 3)
	for i, ip := range append(slicesClone(agentIPs), callerIP) {
		pod := corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: fmt.Sprintf("app-%d", i)},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "busybox"}}},
		}
		if err := k.Create(ctx, &pod); err != nil {
			t.Fatal(err)
		}
		pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip, PodIPs: []corev1.PodIP{{IP: ip}}}
		if err := k.Status().Update(ctx, &pod); err != nil {
			t.Fatal(err)
		}
		pods = append(pods, pod)
	}
	if err := <-built; err != nil {
		t.Fatal(err)
	}

	port := func(ips ...string) int {
		p, err := freePort(ips...)
		if err != nil {
			t.Fatal(err)
		}
		return p
	}
	local := func(ip string, port int) string { return net.JoinHostPort(ip, strconv.Itoa(port)) }
	internalPort := port(agentIPs...)
	managerAPI := local(managerIP, port(managerIP))
	probe := local(managerIP, port(managerIP))
	c.adminAddr = local(managerIP, port(managerIP))
	c.managerReady = "http://" + probe + "/readyz"
	c.apiAddrs = []string{managerAPI}
	c.manager = &proc{
		name: "manager", bin: managerBin, logPath: filepath.Join(workDir, "manager.log"),
		args: []string{
			"--api-bind-address", managerAPI,
			"--metrics-bind-address", local(managerIP, port(managerIP)),
			"--health-probe-bind-address", probe,
			"--admin-bind-address", c.adminAddr,
			"--webhook-port", strconv.Itoa(port(managerIP)),
			"--admin-secret", adminSecret,
			"--agent-internal-port", strconv.Itoa(internalPort),
			"--mongodb-uri", c.storeURI,
			"--mongodb-database", database,
			"--system-namespace", systemNS,
		},
		env: childEnv("KUBECONFIG="+kubeconfigPath, "LEASE_INTERNAL_SECRET="+internalSecret),
	}
	if err := c.manager.start(); err != nil {
		t.Fatal(err)
	}
	for i, ip := range agentIPs {
		api := local(ip, port(ip))
		c.apiAddrs = append(c.apiAddrs, api)
		c.agentReady = append(c.agentReady, "http://"+local(ip, internalPort)+"/readyz")
		pod := pods[i]
		a := &proc{
			name: fmt.Sprintf("agent-%d", i+1), bin: filepath.Join(workDir, "agent"), logPath: filepath.Join(workDir, fmt.Sprintf("agent-%d.log", i+1)),
			// As the webhook injects it: no kubeconfig (it asks the manager for its tenant and
			// definitions), and its connections to the manager leave from the pod's address.
			args: []string{"--api-bind-address", api, "--internal-bind-address", local(ip, internalPort),
				"--manager-source-ip", ip},
			env: childEnv(
				"MONGODB_URI="+c.storeURI, "MONGODB_DATABASE="+database,
				"POD_NAMESPACE="+pod.Namespace, "POD_NAME="+pod.Name, "POD_UID="+string(pod.UID),
				"LEASE_MANAGER_URL=http://"+managerAPI, "LEASE_INTERNAL_SECRET="+internalSecret,
				settings.EnvSystemNamespace+"="+systemNS),
		}
		if err := a.start(); err != nil {
			t.Fatal(err)
		}
		c.agents = append(c.agents, a)
	}
	for i := range 3 {
		if err := c.waitReady(ctx, i, 90*time.Second); err != nil {
			t.Fatal(err)
		}
	}
	c.db, err = leasestore.Connect(c.storeURI, database)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func slicesClone(s []string) []string { return append([]string(nil), s...) }

// startStore starts mongodev on managerIP with a data directory of its own, so that a
// restart (after a wedge) keeps the data and the address.
func (c *cluster) startStore() error {
	bin := os.Getenv("MONGODEV_BIN")
	if bin == "" {
		root, err := mongotest.RepoRoot()
		if err != nil {
			return err
		}
		bin = filepath.Join(root, "bin", "mongodev")
	}
	if _, err := os.Stat(bin); err != nil {
		return fmt.Errorf("the development store %s is missing (make mongodev): %w", bin, err)
	}
	port, err := freePort(managerIP)
	if err != nil {
		return err
	}
	dir := filepath.Join(c.workDir, "store")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	c.store = &proc{
		name: "mongodev", bin: bin, logPath: filepath.Join(c.workDir, "mongodev.log"), holdStdin: true,
		args: []string{"--listen", net.JoinHostPort(managerIP, strconv.Itoa(port)), "--dir", dir, "--exit-on-stdin-eof"},
		env:  os.Environ(),
	}
	c.storeURI = "mongodb://" + net.JoinHostPort(managerIP, strconv.Itoa(port)) + "/"
	return c.restartStore()
}

// restartStore (re)starts the store and waits for its ready line in the log.
func (c *cluster) restartStore() error {
	before := logSize(c.store.logPath)
	if err := c.store.start(); err != nil {
		return err
	}
	deadline := time.Now().Add(mongotest.StartTimeout)
	for time.Now().Before(deadline) {
		if strings.Contains(logSince(c.store.logPath, before), "mongodev listening on ") {
			return nil
		}
		if !c.store.running() {
			return fmt.Errorf("mongodev exited before it was ready; log %s", c.store.logPath)
		}
		time.Sleep(50 * time.Millisecond) // real time: the store is starting
	}
	return fmt.Errorf("mongodev not ready within %v; log %s", mongotest.StartTimeout, c.store.logPath)
}

// logSize is the size of a log, to read what comes after.
func logSize(path string) int64 {
	info, err := os.Stat(path)
	if err != nil {
		return 0
	}
	return info.Size()
}

// logSince returns what the log at path holds after offset.
func logSince(path string, offset int64) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer func() { _ = f.Close() }()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return ""
	}
	var b strings.Builder
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		b.WriteString(sc.Text())
		b.WriteByte('\n')
	}
	return b.String()
}

// process returns process i: 0 the manager, 1 and 2 the agents.
func (c *cluster) process(i int) *proc {
	if i == 0 {
		return c.manager
	}
	return c.agents[i-1]
}

// readyURL is process i's readiness endpoint.
func (c *cluster) readyURL(i int) string {
	if i == 0 {
		return c.managerReady
	}
	return c.agentReady[i-1]
}

// waitReady waits until process i answers ready, or exits, or bound passes.
func (c *cluster) waitReady(ctx context.Context, i int, bound time.Duration) error {
	p := c.process(i)
	hc := &http.Client{Timeout: 2 * time.Second}
	deadline := time.Now().Add(bound)
	for {
		if !p.running() {
			return fmt.Errorf("%s exited before it was ready; log %s", p.name, p.logPath)
		}
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.readyURL(i), nil)
		if resp, err := hc.Do(req); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("%s not ready within %v; log %s", p.name, bound, p.logPath)
		}
		time.Sleep(50 * time.Millisecond) // real time: a real process is starting
	}
}

// ensureRunning starts again any process that is not running (after a failed run).
func (c *cluster) ensureRunning(ctx context.Context) error {
	if !c.store.running() {
		if err := c.restartStore(); err != nil {
			return err
		}
	}
	for i := range 3 {
		if p := c.process(i); !p.running() {
			if err := p.start(); err != nil {
				return err
			}
		}
		if err := c.waitReady(ctx, i, 90*time.Second); err != nil {
			return err
		}
	}
	return nil
}

// define creates the system LeaseDefinition of one episode: levels.global 2, ttlSeconds 5.
func (c *cluster) define(ctx context.Context, name, fairness string, cap, ttlSeconds int) error {
	doc := fmt.Sprintf(`apiVersion: lease.vancetope.io/v1alpha1
kind: LeaseDefinition
metadata: {name: %s, namespace: %s}
spec:
  leaseName: %s
  tenant: _vance
  project: _tenant
  resource: %s
  levels: {global: %d}
  ttlSeconds: %d
  waitMs: 10000
  fairness: %s
`, name, systemNS, name, name, cap, ttlSeconds, fairness)
	var ld leasev1alpha1.LeaseDefinition
	if err := yaml.UnmarshalStrict([]byte(doc), &ld); err != nil {
		return err
	}
	return c.env.Client.Create(ctx, &ld)
}

// dumpStore describes the counters and holders of resource, for a stuck level.
func (c *cluster) dumpStore(resource string) string {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var b strings.Builder
	cs, err := c.db.ListCounters(ctx, leasestore.CounterFilter{Resource: resource})
	if err != nil {
		fmt.Fprintf(&b, "counters: %v\n", err)
	}
	for _, x := range cs {
		fmt.Fprintf(&b, "counter %s count=%d booked=%d updated=%s\n", x.Key, x.Count, x.Booked, x.UpdatedAt.Format(time.RFC3339Nano))
	}
	hs, err := c.db.ListHolders(ctx, leasestore.HolderFilter{})
	if err != nil {
		fmt.Fprintf(&b, "holders: %v\n", err)
	}
	for _, h := range hs {
		if h.Resource == resource {
			fmt.Fprintf(&b, "holder %s %s pod=%s lastSeen=%s\n", short(h.Token), h.State, h.Pod, h.LastSeenAt.Format(time.RFC3339Nano))
		}
	}
	return b.String()
}

// scanLogs fails the test when the log of any process (store, manager, agents) carries a
// token a caller was handed, or an admission API path with any token: a token is a bearer
// secret, and logs name a holder by its ID (docs/security.md, "Tokens"). The processes have
// stopped; their logs go only after this.
func (c *cluster) scanLogs() {
	var logs []string
	for _, p := range append([]*proc{c.store, c.manager}, c.agents...) {
		if p != nil {
			logs = append(logs, p.logPath)
		}
	}
	tokens := handedOut.List()
	hits, err := tokenscan.ScanFiles(tokens, logs...)
	if err != nil {
		c.t.Errorf("scanning the process logs for tokens: %v", err)
	}
	for i, h := range hits {
		if i == 20 {
			c.t.Errorf("… and %d more tokens in the process logs", len(hits)-i)
			break
		}
		c.t.Errorf("a token in a process log: %s", h)
	}
	c.t.Logf("robustness: scanned %d process logs for %d tokens handed out: %d found", len(logs), len(tokens), len(hits))
}

// stop ends everything the cluster started; the work directory is kept when the test
// failed or ROBUSTNESS_KEEP is set.
func (c *cluster) stop() {
	for _, p := range append([]*proc{c.manager}, c.agents...) {
		if p != nil && p.running() {
			_ = p.kill(syscall.SIGTERM)
		}
	}
	if c.db != nil {
		_ = c.db.Close(context.Background())
	}
	if c.store != nil && c.store.running() {
		_ = c.store.signal(syscall.SIGCONT)
		_ = c.store.kill(syscall.SIGTERM)
	}
	if c.env != nil {
		_ = c.env.Stop()
	}
	c.scanLogs()
	if c.t.Failed() || os.Getenv("ROBUSTNESS_KEEP") != "" {
		c.t.Logf("robustness: process logs kept in %s", c.workDir)
		return
	}
	_ = os.RemoveAll(c.workDir)
}
