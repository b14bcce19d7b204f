package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/fstest"
	"time"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/definition"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/settings"
	"github.com/vancetope/lease-operator/internal/tenancy"
	"github.com/vancetope/lease-operator/internal/testutil/agentbuild"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// The footprint benchmark runs the agent as the webhook injects it, a process of its own
// against the development store, with the manager's side of deflink in this process, and
// reads what a pod pays for it from the outside: /proc for memory, CPU and store connections,
// the agent's /metrics for goroutines (docs/figures.md, "Agent footprint").
//
// FOOTPRINT_AGENT names another agent command to measure instead of this package's build
// (the former agent, e.g. "/tmp/before/manager agent"), FOOTPRINT_GRANTS the number of
// acquire+release (10 000).

const (
	footprintSecret = "footprint-secret"
	footprintLease  = "pool"
	footprintConc   = 8
)

// idleSettle is how long after its start an idle agent is measured again: the Go runtime's
// background scavenger returns freed heap pages to the system within some tens of seconds.
const idleSettle = 30 * time.Second

var footprintPod = lease.PodRef{Namespace: "acme", Name: "app-0", UID: "uid-app-0"}

// BenchmarkAgentFootprint reports, for one agent: RSS idle and after the grants, CPU per
// acquire+release, goroutines and store connections idle and busy, and the binary's size.
func BenchmarkAgentFootprint(b *testing.B) {
	uri, err := mongotest.URI()
	if err != nil {
		b.Fatal(err)
	}
	grants := 10000
	if n, err := strconv.Atoi(os.Getenv("FOOTPRINT_GRANTS")); err == nil && n > 0 {
		grants = n
	}
	cmdline := strings.Fields(os.Getenv("FOOTPRINT_AGENT"))
	if len(cmdline) == 0 {
		// Built as the image builds it (Dockerfile): static, without cgo. A cgo build maps the C
		// library besides, and measured 1.3 MiB more resident.
		bin, err := agentbuild.Build("go", "../..", b.TempDir(), []string{"CGO_ENABLED=0"}, "-trimpath", "-ldflags=-s -w")
		if err != nil {
			b.Fatal(err)
		}
		cmdline = []string{bin}
	}
	if st, err := os.Stat(cmdline[0]); err == nil {
		b.ReportMetric(float64(st.Size())/(1<<20), "binary-MiB")
	}
	manager := footprintManager(b)
	apiAddr, internalAddr := freeAddr(b), freeAddr(b)
	for range b.N {
		a := startFootprintAgent(b, cmdline, uri, manager.URL, apiAddr, internalAddr)
		storePort := portOf(b, uri)
		// Started: ready, then a few seconds for its connections to settle. Idle: half a minute
		// later, when the runtime's scavenger has given the start-up's garbage back to the
		// system, as it does in a pod that waits for its first call.
		time.Sleep(3 * time.Second) // real time: the process is measured after it settled
		rss, _ := rssMiB(b, a.Process.Pid)
		b.ReportMetric(rss, "rss-start-MiB")
		time.Sleep(idleSettle) // real time: the scavenger's pace, which no clock of ours drives
		rss, anon := rssMiB(b, a.Process.Pid)
		b.ReportMetric(rss, "rss-idle-MiB")
		b.ReportMetric(anon, "anon-idle-MiB")
		b.ReportMetric(float64(storeConns(a.Process.Pid, storePort)), "conns-idle")
		b.ReportMetric(goroutines(b, internalAddr), "goroutines-idle")

		cpu0 := cpuSeconds(b, a.Process.Pid)
		alloc0 := agentMetric(b, internalAddr, "go_memstats_alloc_bytes_total")
		busy := sampleMax(func() int { return storeConns(a.Process.Pid, storePort) })
		elapsed := footprintGrants(b, apiAddr, grants)
		maxConns := busy()
		cpu := cpuSeconds(b, a.Process.Pid) - cpu0
		b.ReportMetric((agentMetric(b, internalAddr, "go_memstats_alloc_bytes_total")-alloc0)/float64(grants)/1024, "alloc-KiB/grant")

		b.ReportMetric(cpu*1000/float64(grants), "cpu-ms/grant")
		b.ReportMetric(float64(grants)/elapsed.Seconds(), "grants/s")
		b.ReportMetric(float64(maxConns), "conns-busy")
		b.ReportMetric(goroutines(b, internalAddr), "goroutines-after")
		rss, anon = rssMiB(b, a.Process.Pid)
		b.ReportMetric(rss, "rss-after-MiB")
		b.ReportMetric(anon, "anon-after-MiB")
		_ = a.Process.Signal(os.Interrupt)
		_ = a.Wait()
	}
}

// footprintManager serves the manager's side of deflink for the agent's pod at 127.0.0.1.
func footprintManager(b *testing.B) *httptest.Server {
	srv := httptest.NewServer(fleetHandler(deflink.NewVersions()))
	b.Cleanup(srv.Close)
	return srv
}

// fleetHandler is the manager's side of deflink for the footprint's pod and the fleet's
// (fleetPod), all of tenant acme, with one lease, pool.
func fleetHandler(versions *deflink.Versions) http.Handler {
	builtins, err := definition.LoadBuiltins(fstest.MapFS{
		footprintLease + ".yaml": {Data: []byte("name: pool\nlevels: {global: 64}\nttlSeconds: 60\nwaitMs: 0\n")},
	})
	if err != nil {
		panic(err)
	}
	key := func(ns string) string { return agentlink.AgentKey(footprintSecret, ns) }
	identify := func(r *http.Request) (lease.PodRef, error) {
		host, _, _ := net.SplitHostPort(r.RemoteAddr)
		pod, _ := fleetPod(host)
		return pod, nil
	}
	tenants := tenancy.Static{System: "lease-system", Tenants: map[string]string{footprintPod.Namespace: "acme"}}
	return deflink.NewHandler(definition.NewResolver(builtins, nil), tenants, agentauth.NewVerifier(identify, key), versions)
}

func startFootprintAgent(b *testing.B, cmdline []string, uri, managerURL, apiAddr, internalAddr string) *exec.Cmd {
	a := exec.Command(cmdline[0], append(cmdline[1:],
		"--api-bind-address", apiAddr, "--internal-bind-address", internalAddr)...)
	a.Env = append(os.Environ(),
		settings.EnvMongoURI+"="+uri, settings.EnvMongoDatabase+"=footprint",
		settings.EnvPodNamespace+"="+footprintPod.Namespace, settings.EnvPodName+"="+footprintPod.Name,
		settings.EnvPodUID+"="+footprintPod.UID, settings.EnvManagerURL+"="+managerURL,
		settings.EnvInternalSecret+"="+footprintSecret)
	logf, err := os.Create(filepath.Join(os.TempDir(), "footprint-agent.log"))
	if err != nil {
		b.Fatal(err)
	}
	a.Stdout, a.Stderr = logf, logf
	if err := a.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { _ = a.Process.Kill() })
	ready := "http://" + internalAddr + "/readyz"
	for deadline := time.Now().Add(30 * time.Second); ; {
		if resp, err := http.Get(ready); err == nil {
			_ = resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return a
			}
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(logf.Name())
			b.Fatalf("the agent did not get ready in 30 s; its log:\n%s", log)
		}
		time.Sleep(50 * time.Millisecond) // real time: polling a process's readiness
	}
}

// footprintGrants acquires and releases grants leases through the agent's API with
// footprintConc clients side by side.
func footprintGrants(b *testing.B, apiAddr string, grants int) time.Duration {
	// As an app with footprintConc callers would: a connection each, kept open.
	c, err := leaseclient.New("http://"+apiAddr, leaseclient.WithHTTPClient(&http.Client{
		Transport: &http.Transport{MaxIdleConnsPerHost: footprintConc}}))
	if err != nil {
		b.Fatal(err)
	}
	var next, failed atomic.Int64
	var wg sync.WaitGroup
	begin := time.Now()
	for w := range footprintConc {
		wg.Go(func() {
			for next.Add(1) <= int64(grants) {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				l, err := c.Acquire(ctx, leaseclient.Request{Type: "notify", Lease: footprintLease,
					Project: "web", User: fmt.Sprintf("u%d", w)})
				if err == nil {
					err = l.Release(ctx)
				}
				cancel()
				if err != nil && failed.Add(1) == 1 {
					b.Errorf("acquire+release: %v", err)
				}
			}
		})
	}
	wg.Wait()
	return time.Since(begin)
}

// fleetPod is the pod of a simulated agent at 127.0.x.y (x.y its index), the footprint's pod
// at 127.0.0.1.
func fleetPod(host string) (lease.PodRef, bool) {
	if host == "127.0.0.1" {
		return footprintPod, true
	}
	ip := net.ParseIP(host).To4()
	if ip == nil || ip[0] != 127 {
		return lease.PodRef{}, false
	}
	n := fmt.Sprintf("agent-%d-%d", ip[2], ip[3])
	return lease.PodRef{Namespace: footprintPod.Namespace, Name: n, UID: "uid-" + n}, true
}

func freeAddr(b *testing.B) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = ln.Close() }()
	return ln.Addr().String()
}

func portOf(b *testing.B, uri string) int {
	u, err := url.Parse(uri)
	if err != nil {
		b.Fatal(err)
	}
	p, err := strconv.Atoi(u.Port())
	if err != nil {
		b.Fatalf("store URI %s: no port", uri)
	}
	return p
}

// rssMiB is the process's resident set (VmRSS) and its anonymous part (RssAnon): the rest
// is the binary's pages, which the node's page cache shares between every process of the
// same image.
func rssMiB(b *testing.B, pid int) (rss, anon float64) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	kib := func(rest string) float64 {
		kb, _ := strconv.Atoi(strings.Fields(rest)[0])
		return float64(kb) / 1024
	}
	for s := bufio.NewScanner(f); s.Scan(); {
		if rest, ok := strings.CutPrefix(s.Text(), "VmRSS:"); ok {
			rss = kib(rest)
		}
		if rest, ok := strings.CutPrefix(s.Text(), "RssAnon:"); ok {
			anon = kib(rest)
		}
	}
	if rss == 0 {
		b.Fatal("no VmRSS")
	}
	return rss, anon
}

// cpuSeconds is the process's user and system time (clock ticks of 1/100 s).
func cpuSeconds(b *testing.B, pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// The fields after the command name, which is in parentheses and may hold spaces.
	f := strings.Fields(string(raw[strings.LastIndexByte(string(raw), ')')+2:]))
	ut, _ := strconv.Atoi(f[11])
	st, _ := strconv.Atoi(f[12])
	return float64(ut+st) / 100
}

// storeConns counts the process's established TCP connections to port.
func storeConns(pid, port int) int {
	inodes := map[string]bool{}
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		raw, err := os.ReadFile(table)
		if err != nil {
			continue
		}
		for _, line := range strings.Split(string(raw), "\n")[1:] {
			f := strings.Fields(line)
			if len(f) < 10 || f[3] != "01" { // 01: ESTABLISHED
				continue
			}
			remote := f[2][strings.LastIndexByte(f[2], ':')+1:]
			if p, _ := strconv.ParseInt(remote, 16, 32); int(p) == port {
				inodes[f[9]] = true
			}
		}
	}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	n := 0
	for _, fd := range fds {
		target, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if inode, ok := strings.CutPrefix(target, "socket:["); ok && inodes[strings.TrimSuffix(inode, "]")] {
			n++
		}
	}
	return n
}

// sampleMax samples f every 20 ms until the returned function is called, which returns the
// largest value seen.
func sampleMax(f func() int) func() int {
	stop, done := make(chan struct{}), make(chan int)
	go func() {
		m := f()
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-t.C:
				m = max(m, f())
			case <-stop:
				done <- max(m, f())
				return
			}
		}
	}()
	return func() int { close(stop); return <-done }
}

// goroutines reads go_goroutines from the agent's metrics (0 when it serves none).
func goroutines(b *testing.B, internalAddr string) float64 {
	return agentMetric(b, internalAddr, "go_goroutines")
}

// agentMetric reads the value of an unlabelled metric from the agent's metrics (0 when it
// serves none).
func agentMetric(b *testing.B, internalAddr, name string) float64 {
	resp, err := http.Get("http://" + internalAddr + "/metrics")
	if err != nil {
		b.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	for s := bufio.NewScanner(resp.Body); s.Scan(); {
		if rest, ok := strings.CutPrefix(s.Text(), name+" "); ok {
			v, _ := strconv.ParseFloat(rest, 64)
			return v
		}
	}
	return 0
}
