package e2e

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	livev1alpha1 "github.com/vancetope/lease-operator/api/live/v1alpha1"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/testutil/aggregatortest"
)

// nameWatch is `kubectl get leaseholders -A -w -o name` running as the cluster admin.
type nameWatch struct {
	lines chan string
	seen  []string
}

func watchNames(ctx context.Context, selector string) *nameWatch {
	GinkgoHelper()
	path, err := exec.LookPath("kubectl")
	if err != nil {
		Skip("the kubectl binary is needed: " + err.Error())
	}
	ctx, cancel := context.WithCancel(ctx)
	cmd := exec.CommandContext(ctx, path, "--kubeconfig", kubeconfigPath, "get", "leaseholders", "-A", "-l", selector, "-w", "-o", "name")
	out, err := cmd.StdoutPipe()
	Expect(err).NotTo(HaveOccurred())
	Expect(cmd.Start()).To(Succeed())
	DeferCleanup(func() { cancel(); _ = cmd.Wait() })
	w := &nameWatch{lines: make(chan string, 100)}
	go func() {
		for s := bufio.NewScanner(out); s.Scan(); {
			w.lines <- strings.TrimPrefix(s.Text(), "leaseholder.live.lease.vancetope.io/")
		}
		close(w.lines)
	}()
	return w
}

// listed takes the lines kubectl prints in its first second (its list) as seen.
func (w *nameWatch) listed() {
	for deadline := time.After(time.Second); ; { // real time: another process's output
		select {
		case l, ok := <-w.lines:
			if !ok {
				return
			}
			w.seen = append(w.seen, l)
		case <-deadline:
			return
		}
	}
}

// next waits for a line of id; lines of holders printed before may come between (a change a
// list showed may come again, and a holder read while it books comes twice).
func (w *nameWatch) next(id string) {
	GinkgoHelper()
	for {
		select {
		case l, ok := <-w.lines:
			Expect(ok).To(BeTrue(), "kubectl get -w ended; it printed %q, want %s", w.seen, id)
			if l == id {
				w.seen = append(w.seen, l)
				return
			}
			Expect(w.seen).To(ContainElement(l), "kubectl get -w printed %s, want %s (or one printed before)", l, id)
		case <-time.After(20 * time.Second): // real time: another process's output
			Fail("kubectl get -w printed nothing for " + id + " in 20 s; before: " + strings.Join(w.seen, " "))
		}
	}
}

var _ = Describe("Watching live leases", func() {
	It("shows every grant, revocation, reap and release with kubectl get -w, and nothing missed across a manager restart", func(ctx SpecContext) {
		needLoopback("127.0.0.42") // the address of the pod whose holder is reaped
		By("a manager serving the live API, registered with the aggregation layer")
		ports, err := freePorts(4)
		Expect(err).NotTo(HaveOccurred())
		local := func(port int) string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(port)) }
		apiAddr, metricsAddr, probeAddr := local(ports[0]), local(ports[1]), local(ports[2])
		start := func() *process {
			p := startManager("live-manager", apiAddr, metricsAddr, probeAddr, "--live-api-bind-address", local(ports[3]),
				"--live-watch-interval", "100ms", "--pod-admission=false")
			waitReady(p, "http://"+probeAddr+"/readyz")
			Expect(aggregatortest.WaitServed(ctx, env.Config, livev1alpha1.GroupVersion)).To(Succeed())
			return p
		}
		Expect(aggregatortest.RegisterAPIService(ctx, env.Config, livev1alpha1.GroupVersion, systemNamespace, ports[3])).To(Succeed())
		live := start()
		DeferCleanup(func() { _ = live.stop() })
		api := newAPIClient("live-manager", apiAddr, "")
		// The built-in e2e-pool: two slots for the tenant, one per user.
		acquire := func(c *apiClient, user string, podBound bool) granted {
			l := c.mustAcquire(acquireRequest{Type: "tex", Lease: builtinOnlyLease, Tenant: tenant, Project: "watch", User: user, PodBound: podBound})
			c.releaseOnCleanup(l.Token)
			return l
		}
		w := watchNames(ctx, livev1alpha1.LabelResource+"=e2e-pool")
		w.listed() // holders other specs left, if any

		By("a grant, and a revocation with kubectl delete")
		a := acquire(api, "ann", false)
		w.next(lease.HolderID(a.Token))
		b := acquire(api, "bob", false)
		w.next(lease.HolderID(b.Token))
		out, err := kubectl(ctx, "delete", "leaseholder", "-n", namespace, lease.HolderID(b.Token))
		Expect(err).NotTo(HaveOccurred(), out)
		w.next(lease.HolderID(b.Token))

		By("a reap: the holder of a pod that is deleted")
		podRef := createRunningPod(ctx, namespace, "watcher-0", "127.0.0.42")
		pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: podRef.Namespace, Name: podRef.Name}}
		DeferCleanup(func(ctx SpecContext) { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pod))).To(Succeed()) })
		p := acquire(newAPIClient("watcher-0", apiAddr, "127.0.0.42"), "pat", true)
		w.next(lease.HolderID(p.Token))
		Expect(k8sClient.Delete(ctx, pod)).To(Succeed())
		w.next(lease.HolderID(p.Token))
		Expect(api.check(Default, p.Token).Status).To(Equal(http.StatusGone))

		By("a release")
		Expect(api.release(Default, a.Token).Status).To(Equal(http.StatusOK))
		w.next(lease.HolderID(a.Token))

		By("the manager restarting, with a grant and a release while it is down")
		j := acquire(api, "jo", false)
		w.next(lease.HolderID(j.Token))
		Expect(live.stop()).To(Succeed())
		Expect(managerAPI.release(Default, j.Token).Status).To(Equal(http.StatusOK))
		down := acquire(managerAPI, "dan", false)
		live = start()

		By("a new kubectl watch listing exactly what the store holds, then following the new manager")
		again := watchNames(ctx, livev1alpha1.LabelResource+"=e2e-pool")
		again.next(lease.HolderID(down.Token))
		k := acquire(api, "kim", false)
		again.next(lease.HolderID(k.Token))
		for _, gone := range []string{a.Token, b.Token, p.Token, j.Token} {
			Expect(again.seen).NotTo(ContainElement(lease.HolderID(gone)), "a holder gone before the restart")
		}
		Expect(managerAPI.release(Default, down.Token).Status).To(Equal(http.StatusOK))
		again.next(lease.HolderID(down.Token))
	})
})
