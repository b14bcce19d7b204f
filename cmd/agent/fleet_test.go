package main

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/vancetope/lease-operator/internal/agentauth"
	"github.com/vancetope/lease-operator/internal/agentlink"
	"github.com/vancetope/lease-operator/internal/deflink"
	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

// The fleet simulation (docs/figures.md, "Agents at cluster scale"): N agents' definition
// watches (deflink, the one thing every agent holds open on the manager) against the
// manager's side of deflink in a process of its own, which is measured from the outside.
// Each simulated agent is a deflink client of its own pod's address, 127.0.x.y, as
// --manager-source-ip gives a local agent; the manager tells them apart by that address.

// fleetManagerEnv, when set in the environment of this test binary, makes it the manager's
// side of the simulation, listening on the address it holds (TestMain).
const fleetManagerEnv = "FLEET_MANAGER_ADDR"

func TestMain(m *testing.M) {
	if addr := os.Getenv(fleetManagerEnv); addr != "" {
		serveFleetManager(addr)
		return
	}
	code := m.Run()
	mongotest.Stop()
	os.Exit(code)
}

// serveFleetManager serves deflink for the fleet's pods, its metrics, and POST /bump, a
// definition change, until it is killed.
func serveFleetManager(addr string) {
	versions := deflink.NewVersions()
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mux := http.NewServeMux()
	h := fleetHandler(versions)
	mux.Handle(deflink.WatchPath, h)
	mux.Handle(deflink.ResolvePath, h)
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("POST /bump", func(w http.ResponseWriter, _ *http.Request) { versions.Bump() })
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	fmt.Fprintln(os.Stderr, srv.ListenAndServe())
	os.Exit(1)
}

// BenchmarkAgentFleet reports what the manager pays per connected agent (memory,
// goroutines, CPU while idle) and how long a definition change takes to reach every agent
// (p50 and the last), for 100 and 1 000 agents.
func BenchmarkAgentFleet(b *testing.B) {
	for _, n := range []int{100, 1000} {
		b.Run(fmt.Sprintf("agents=%d", n), func(b *testing.B) {
			for range b.N {
				fleetRun(b, n)
			}
		})
	}
}

func fleetRun(b *testing.B, n int) {
	addr := freeAddr(b)
	mgr := exec.Command(os.Args[0], "-test.run=^$")
	mgr.Env = append(os.Environ(), fleetManagerEnv+"="+addr)
	mgr.Stderr = os.Stderr
	if err := mgr.Start(); err != nil {
		b.Fatal(err)
	}
	defer func() { _ = mgr.Process.Kill(); _ = mgr.Wait() }()
	url := "http://" + addr
	for deadline := time.Now().Add(10 * time.Second); ; {
		if resp, err := http.Get(url + "/metrics"); err == nil {
			_ = resp.Body.Close()
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the manager's side did not start")
		}
		time.Sleep(20 * time.Millisecond) // real time: polling a process's start
	}
	pid := mgr.Process.Pid
	rss0, _ := rssMiB(b, pid)
	g0 := agentMetric(b, addr, "go_goroutines")

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var mu sync.Mutex
	changed := make([]time.Time, n)
	clients := make([]*deflink.Client, n)
	for i := range n {
		ip := net.IPv4(127, 0, byte(1+i/250), byte(1+i%250)).String()
		c := deflink.NewClient(url, footprintPod.Namespace, agentlink.AgentKey(footprintSecret, footprintPod.Namespace),
			deflink.WithHTTPClient(agentauth.HTTPClient(ip)))
		c.OnChange(func() {
			mu.Lock()
			changed[i] = time.Now()
			mu.Unlock()
		})
		clients[i] = c
		wg.Go(func() { _ = c.Start(ctx) })
	}
	for deadline := time.Now().Add(60 * time.Second); ; {
		ready := 0
		for _, c := range clients {
			if c.Ready() {
				ready++
			}
		}
		if ready == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d agents reached the manager in 60 s", ready, n)
		}
		time.Sleep(50 * time.Millisecond) // real time: polling the fleet's first answers
	}
	// Connected and idle: every agent's watch held, renewed once a hold (deflink.DefaultHold).
	time.Sleep(2 * time.Second) // real time: the fleet's start-up settles
	cpu0 := cpuSeconds(b, pid)
	// One hold and a second: every watch is answered and renewed once.
	idle := deflink.DefaultHold + time.Second
	time.Sleep(idle) // real time: the manager's CPU while it holds the fleet's watches
	idleCPU := cpuSeconds(b, pid) - cpu0
	rss1, anon1 := rssMiB(b, pid)
	g1 := agentMetric(b, addr, "go_goroutines")

	// A definition change: how long until every agent has it.
	begin := time.Now()
	resp, err := http.Post(url+"/bump", "", nil)
	if err != nil {
		b.Fatal(err)
	}
	_ = resp.Body.Close()
	var lat []time.Duration
	for deadline := begin.Add(30 * time.Second); ; {
		mu.Lock()
		lat = lat[:0]
		for _, t := range changed {
			if t.After(begin) {
				lat = append(lat, t.Sub(begin))
			}
		}
		mu.Unlock()
		if len(lat) == n {
			break
		}
		if time.Now().After(deadline) {
			b.Fatalf("%d of %d agents saw the change in 30 s", len(lat), n)
		}
		time.Sleep(10 * time.Millisecond) // real time: polling the fleet for the change
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[n/2].Microseconds())/1000, "change-p50-ms")
	b.ReportMetric(float64(lat[n-1].Microseconds())/1000, "change-all-ms")
	b.ReportMetric((rss1-rss0)*1024/float64(n), "manager-KiB/agent")
	b.ReportMetric(rss1, "manager-rss-MiB")
	b.ReportMetric(anon1, "manager-anon-MiB")
	b.ReportMetric((g1-g0)/float64(n), "goroutines/agent")
	b.ReportMetric(idleCPU*1e6/idle.Seconds()/float64(n), "manager-cpu-µs/s/agent")
}
