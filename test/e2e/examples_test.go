package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// The example consumers of examples/ run here against the real manager and agent, through
// pkg/leaseclient, as an application in the app pod would (LEASE_AGENT_URL = the agent).

// buildExamples builds the examples once, into the suite's work directory.
var buildExamples = sync.OnceValues(func() (map[string]string, error) {
	root, err := mongotest.RepoRoot()
	if err != nil {
		return nil, err
	}
	bins := map[string]string{}
	for _, name := range []string{"compile-poller", "session", "fenced-store"} {
		bin := filepath.Join(workDir, name)
		cmd := exec.Command("go", "build", "-o", bin, "./examples/"+name)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("building examples/%s: %w\n%s", name, err, out)
		}
		bins[name] = bin
	}
	return bins, nil
})

// lockedBuffer collects a child's output for the spec to read while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// example is a running example consumer.
type example struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	out   *lockedBuffer
	done  chan struct{}
	code  int
}

// startExample runs the example name with args, talking to the agent.
func startExample(name string, args ...string) *example {
	GinkgoHelper()
	bins, err := buildExamples()
	Expect(err).NotTo(HaveOccurred())
	e := &example{out: &lockedBuffer{}, done: make(chan struct{})}
	e.cmd = exec.Command(bins[name], args...)
	e.cmd.Env = childEnv(leaseclient.EnvURL + "=" + agentAPI.base)
	e.cmd.Stdout, e.cmd.Stderr = e.out, e.out
	e.stdin, err = e.cmd.StdinPipe()
	Expect(err).NotTo(HaveOccurred())
	dieWithParent(e.cmd)
	Expect(e.cmd.Start()).To(Succeed())
	go func() {
		err := e.cmd.Wait()
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			e.code = ee.ExitCode()
		}
		close(e.done)
	}()
	DeferCleanup(func() {
		_ = e.stdin.Close()
		select {
		case <-e.done:
		case <-time.After(10 * time.Second):
			_ = e.cmd.Process.Kill()
			<-e.done
		}
		for _, tok := range e.tokens() {
			handedOut.Add(tok)
		}
		GinkgoWriter.Printf("---- %s %v\n%s\n", name, args, e.out.String())
	})
	return e
}

// exited waits for the example to end and returns its exit code.
func (e *example) exited(timeout time.Duration) int {
	GinkgoHelper()
	Eventually(e.done).WithTimeout(timeout).Should(BeClosed(), "output so far:\n%s", e.out)
	return e.code
}

// send writes a command line to the example's stdin.
func (e *example) send(line string) {
	GinkgoHelper()
	_, err := io.WriteString(e.stdin, line+"\n")
	Expect(err).NotTo(HaveOccurred())
}

// revokeByOperator revokes token through the manager's operator API (the handler runs and
// the revocation is forwarded to the holder's agent).
func revokeByOperator(token, tenant string) {
	GinkgoHelper()
	r := adminAPI.do(Default, http.MethodPost, "/internal/lease/admin/revoke",
		map[string]string{"token": token, "tenant": tenant}, "Authorization: Bearer "+adminSecret)
	Expect(r.Status).To(Equal(http.StatusOK), "%s", r)
}

// texLease acquires a tex lease in tenant/project for user through the Go client on the
// agent; the spec releases it on cleanup (release is idempotent).
func texLease(ctx context.Context, project, user string) *leaseclient.Lease {
	GinkgoHelper()
	client, err := leaseclient.New(agentAPI.base)
	Expect(err).NotTo(HaveOccurred())
	l, err := client.Acquire(ctx, leaseclient.Request{Type: "tex", Lease: "tex", Tenant: tenant, Project: project, User: user})
	Expect(err).NotTo(HaveOccurred())
	handedOut.Add(l.Token)
	DeferCleanup(func() { Expect(l.Release(context.Background())).To(Succeed()) })
	return l
}

var tokenOut = regexp.MustCompile(`token=([0-9a-f]{32})`)

// tokens returns the lease tokens the example printed, in order.
func (e *example) tokens() []string {
	var out []string
	for _, m := range tokenOut.FindAllStringSubmatch(e.out.String(), -1) {
		out = append(out, m[1])
	}
	return out
}

var _ = Describe("The example consumers", func() {
	It("fenced-store: refuses a reaped holder's late write and accepts its successor's", func(ctx SpecContext) {
		svc := startExample("fenced-store", "-listen", "127.0.0.1:0")
		Eventually(svc.out.String).Should(MatchRegexp(`listening on \S+`))
		addr := regexp.MustCompile(`listening on (\S+)`).FindStringSubmatch(svc.out.String())[1]
		write := func(fence int64, body string) (int, string) {
			GinkgoHelper()
			req, err := http.NewRequestWithContext(ctx, http.MethodPut, "http://"+addr+"/docs/thesis", strings.NewReader(body))
			Expect(err).NotTo(HaveOccurred())
			req.Header.Set("Lease-Fence", strconv.FormatInt(fence, 10))
			res, err := http.DefaultClient.Do(req)
			Expect(err).NotTo(HaveOccurred())
			defer func() { _ = res.Body.Close() }()
			b, _ := io.ReadAll(res.Body)
			return res.StatusCode, string(b)
		}
		wrote := func(fence int64, body string) int {
			GinkgoHelper()
			status, _ := write(fence, body)
			return status
		}
		// Through the other tenant's agent: the idle reap below is forwarded to that pod's
		// agent and recorded as an Event on it, and the revocation spec reads the Events of
		// app-0, whose series keep the note of their first revocation.
		client, err := leaseclient.New(otherAgentAPI.base)
		Expect(err).NotTo(HaveOccurred())
		// One writer per project at a time, idle after one second.
		inline := &leaseclient.Inline{Name: "fence-e2e", Levels: leaseclient.InlineLevels{Project: 1}, TTLSeconds: 1}
		acquire := func(user string, wait time.Duration) *leaseclient.Lease {
			GinkgoHelper()
			l, err := client.Acquire(ctx, leaseclient.Request{Type: "notify", Inline: inline, Tenant: otherTenant, Project: "fenced", User: user, Wait: wait})
			Expect(err).NotTo(HaveOccurred())
			handedOut.Add(l.Token)
			DeferCleanup(func() { _ = l.Release(context.Background()) })
			return l
		}

		By("holder A acquiring and writing with its fence")
		a := acquire("ann", 0)
		Expect(a.Fence).To(BeNumerically(">", 0))
		Expect(wrote(a.Fence, "A's draft")).To(Equal(http.StatusOK))

		By("A pausing past its TTL: B waits, A is reaped as idle, B gets the slot with a higher fence")
		b := acquire("bob", 10*time.Second)
		Expect(b.Fence).To(BeNumerically(">", a.Fence))
		Expect(a.Check(ctx)).To(MatchError(leaseclient.ErrLost))
		Expect(wrote(b.Fence, "B's chapter")).To(Equal(http.StatusOK))

		By("A resuming: its late write carries the old fence and is refused; B's stays")
		status, body := write(a.Fence, "A's late overwrite")
		Expect(status).To(Equal(http.StatusConflict), body)
		Expect(body).To(ContainSubstring("STALE_FENCE"))
		Expect(wrote(b.Fence, "B's second chapter")).To(Equal(http.StatusOK))
		res, err := http.Get("http://" + addr + "/docs/thesis")
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = res.Body.Close() }()
		got, _ := io.ReadAll(res.Body)
		Expect(string(got)).To(ContainSubstring("B's second chapter"))
		Expect(b.Release(ctx)).To(Succeed())
		expectAtRest(tenant)
	})

	It("compile-poller: acquires, stores the job id, checks every poll and releases on the result", func() {
		const project = "poller"
		e := startExample("compile-poller", "-tenant", tenant, "-project", project, "-user", "ann", "-polls", "3", "-interval", "50ms")
		Expect(e.exited(30*time.Second)).To(Equal(0), e.out.String())
		Expect(e.out.String()).To(SatisfyAll(
			MatchRegexp(`acquired token=[0-9a-f]{32} noop=false`),
			ContainSubstring("submitted job=job-"),
			ContainSubstring("poll 3 done=true"),
			ContainSubstring("result job=job-"),
			ContainSubstring("released"),
		))
		expectAtRest(tenant)
	})

	It("compile-poller: stops at once on a revocation notice", func() {
		const project = "poller-revoke"
		// A poll every 30 s: only the notice can end it within the timeout below.
		e := startExample("compile-poller", "-tenant", tenant, "-project", project, "-user", "ann", "-polls", "1000", "-interval", "30s")
		Eventually(e.out.String).Should(ContainSubstring("poll 1 done=false"))
		Expect(e.tokens()).To(HaveLen(1))
		token := e.tokens()[0]

		By("the job id in the holder's payload, for the revocation handler")
		Expect(holdersOf(Default, tenant)).To(ConsistOf(SatisfyAll(
			HaveField("Token", token), HaveField("Pod", appPod), HaveField("PodBound", true),
			HaveField("Payload", HaveKeyWithValue("jobId", HavePrefix("job-"))))))

		revokeByOperator(token, tenant)
		Expect(e.exited(15*time.Second)).To(Equal(3), e.out.String())
		Expect(e.out.String()).To(SatisfyAll(ContainSubstring("revoked reason=revoke: aborting job=job-"), ContainSubstring("released")))
		Expect(e.out.String()).NotTo(ContainSubstring("poll 2"))
		expectAtRest(tenant)
	})

	It("compile-poller: reports LEASE_BUSY with the diagnosis", func(ctx SpecContext) {
		const project = "poller-busy"
		By("another consumer holding the project's only slot, through the Go client")
		held := texLease(ctx, project, "bob")

		e := startExample("compile-poller", "-tenant", tenant, "-project", project, "-user", "ann", "-wait", "200ms")
		Expect(e.exited(30*time.Second)).To(Equal(2), e.out.String())
		Expect(e.out.String()).To(MatchRegexp(`busy: tex full at level project \(acme/poller-busy\): 1 of 1, waited \d`))
		Expect(held.Release(ctx)).To(Succeed())
		expectAtRest(tenant)
	})

	It("session: checks on every call, closes on LEASE_LOST and acquires anew on the next call", func() {
		const project = "session"
		e := startExample("session", "-tenant", tenant, "-project", project, "-user", "ann", "-endpoint", "http://mcp.test/s")
		e.send("call")
		Eventually(e.out.String).Should(ContainSubstring("call 1 ok"))
		first := e.tokens()
		Expect(first).To(HaveLen(1))
		Expect(holdersOf(Default, tenant)).To(ConsistOf(SatisfyAll(
			HaveField("Token", first[0]), HaveField("Type", "mcp"),
			HaveField("Payload", SatisfyAll(HaveKeyWithValue("endpoint", "http://mcp.test/s"), HaveKey("sessionId"))))))

		By("a revocation straight in the store (no handler, no notice): the next call finds the lease lost")
		_, ok, err := store.Revoke(context.Background(), first[0], tenant)
		Expect(err).NotTo(HaveOccurred())
		Expect(ok).To(BeTrue())
		e.send("call")
		Eventually(e.out.String).Should(SatisfyAll(ContainSubstring(`reason="lease lost"`), ContainSubstring("call 2 failed: lease lost")))

		By("the call after it opening a new session with a new lease")
		e.send("call")
		Eventually(e.out.String).Should(ContainSubstring("call 3 ok"))
		second := e.tokens()
		Expect(second).To(HaveLen(2))
		Expect(second[1]).NotTo(Equal(first[0]))

		By("an operator's revocation closing the session at once, through the notice")
		revokeByOperator(second[1], tenant)
		Eventually(e.out.String).WithTimeout(15 * time.Second).Should(ContainSubstring(`reason="revoked reason=revoke"`))
		expectAtRest(tenant)
		e.send("call")
		Eventually(e.out.String).Should(ContainSubstring("call 4 ok"))
		Expect(e.tokens()).To(HaveLen(3))

		By("end of input closing the session and releasing its lease")
		Expect(e.stdin.Close()).To(Succeed())
		Expect(e.exited(15*time.Second)).To(Equal(0), e.out.String())
		Expect(e.out.String()).To(ContainSubstring(`reason="end of input" release error=<nil>`))
		expectAtRest(tenant)
	})

	It("shows held leases in the manager's state gauges", func(ctx SpecContext) {
		const project = "gauges"
		l := texLease(ctx, project, "ann")
		// The gauges are read from the store at most every 30 s.
		Eventually(func(g Gomega) {
			text := scrape(g)
			up, ok := metric(text, "vance_lease_store_up", nil)
			g.Expect(ok).To(BeTrue())
			g.Expect(up).To(Equal(1.0))
			held, ok := metric(text, "vance_lease_holders", map[string]string{"resource": "tex"})
			g.Expect(ok).To(BeTrue())
			g.Expect(held).To(BeNumerically(">=", 1))
			globalCap, ok := metric(text, "vance_lease_global_cap", map[string]string{"resource": "tex"})
			g.Expect(ok).To(BeTrue())
			g.Expect(globalCap).To(Equal(6.0))
			_, ok = metric(text, "vance_lease_global_in_use", map[string]string{"resource": "tex"})
			g.Expect(ok).To(BeTrue())
		}).WithTimeout(45 * time.Second).WithPolling(time.Second).Should(Succeed())
		Expect(l.Release(ctx)).To(Succeed())
		expectAtRest(tenant)
	})

	It("exports the agent's metrics on its internal port", func(ctx SpecContext) {
		const project = "agent-metrics"
		Expect(texLease(ctx, project, "ann").Release(ctx)).To(Succeed())
		resp, err := boundedHTTP.Get(agentMetricsURL)
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		Expect(resp.StatusCode).To(Equal(http.StatusOK))
		text, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		n, ok := metric(string(text), "vance_lease_acquire_total", map[string]string{"resource": "tex", "outcome": "success"})
		Expect(ok).To(BeTrue(), "the agent counts its acquisitions:\n%s", text)
		Expect(n).To(BeNumerically(">=", 1))
		expectAtRest(tenant)
	})

	It("serves the OpenAPI document on the manager and the agent", func() {
		for _, api := range []*apiClient{managerAPI, agentAPI} {
			r := api.do(Default, http.MethodGet, "/openapi.json", nil)
			Expect(r.Status).To(Equal(http.StatusOK), "%s: %s", api.name, r)
			Expect(decode[map[string]any](Default, r)).To(HaveKeyWithValue("openapi", "3.0.3"), api.name)
		}
	})
})
