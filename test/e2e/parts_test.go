package e2e

import (
	"context"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/utils/ptr"

	leasev1alpha1 "github.com/vancetope/lease-operator/api/v1alpha1"
	"github.com/vancetope/lease-operator/internal/leasestore"
)

// Acquisitions of several leases at once through the built manager's HTTP API
// (docs/waiting.md, "Several resources at once"): a GPU lease and a licence lease, jobs that
// want both, named in opposite orders, and jobs that want one of them.

var _ = Describe("Acquiring several leases at once", func() {
	It("grants GPU and licence together to jobs asking in opposite orders, beside single-lease jobs: all finish, no cap exceeded", func(ctx SpecContext) {
		caps := map[string]int{"gpu": 2, "licence": 1}
		for name, c := range caps {
			defineSystemLease(ctx, name, leasev1alpha1.LeaseDefinitionSpec{
				Levels: &leasev1alpha1.LeaseLevels{Global: ptr.To(int32(c))}, WaitMs: ptr.To(int32(20000)),
			})
		}
		for name := range caps {
			managerAPI.release(Default, acquireOnceDefined(acquireRequest{Type: "tex", Lease: name, Tenant: tenant, Project: "parts"}).Token)
		}

		By("a dry run for the set names the part that is full")
		lic := managerAPI.mustAcquire(acquireRequest{Type: "tex", Lease: "licence", Tenant: tenant, Project: "parts", User: "holder"}.withWait(0))
		dry := managerAPI.do(Default, http.MethodPost, "/v1/leases?dryRun=true", acquireRequest{Type: "tex", Leases: []string{"gpu", "licence"}, Tenant: tenant, Project: "parts"})
		Expect(dry.Status).To(Equal(http.StatusConflict), "%s", dry)
		busy := decode[apiError](Default, dry)
		Expect(busy.Lease).To(Equal("licence"))
		Expect(busy.Resource).To(Equal("licence"))
		managerAPI.release(Default, lic.Token)

		By("two jobs wanting both in opposite orders and four single-lease jobs, each taking its leases five times")
		type job struct {
			name   string
			leases []string
		}
		jobs := []job{
			{"both-gpu-first", []string{"gpu", "licence"}}, {"both-licence-first", []string{"licence", "gpu"}},
			{"gpu-1", []string{"gpu"}}, {"gpu-2", []string{"gpu"}}, {"licence-1", []string{"licence"}}, {"licence-2", []string{"licence"}},
		}
		var inUse sync.Map // resource -> *atomic.Int32: leases held now, as the jobs were told
		for r := range caps {
			inUse.Store(r, new(atomic.Int32))
		}
		var overCap atomic.Value
		use := func(resources []string, d int32) {
			for _, r := range resources {
				v, _ := inUse.Load(r)
				if n := v.(*atomic.Int32).Add(d); int(n) > caps[r] {
					overCap.Store(fmt.Sprintf("%d jobs told they hold %s, cap %d", n, r, caps[r]))
				}
			}
		}
		sampleCtx, stopSampling := context.WithCancel(ctx)
		defer stopSampling()
		var sampled atomic.Int32
		go func() {
			defer GinkgoRecover()
			for sampleCtx.Err() == nil {
				cs, err := store.ListCounters(sampleCtx, leasestore.CounterFilter{})
				if err == nil {
					sampled.Add(1)
					for _, c := range cs {
						if cp, ok := caps[c.Resource]; ok && c.Count > cp {
							overCap.Store(fmt.Sprintf("counter %s counts %d, cap %d", c.Key, c.Count, cp))
						}
					}
				}
				time.Sleep(20 * time.Millisecond) // real time: the pace of the sampler beside the jobs
			}
		}()
		var wg sync.WaitGroup
		done := make([]atomic.Int32, len(jobs))
		for i, j := range jobs {
			wg.Add(1)
			go func() {
				defer GinkgoRecover()
				defer wg.Done()
				for round := range 5 {
					req := acquireRequest{Type: "tex", Tenant: tenant, Project: "parts", User: j.name, HolderRef: fmt.Sprintf("%s-%d", j.name, round)}.withWait(20000)
					if len(j.leases) > 1 {
						req.Leases = j.leases
					} else {
						req.Lease = j.leases[0]
					}
					r := managerAPI.acquire(Default, req)
					Expect(r.Status).To(Equal(http.StatusOK), "%s round %d: %s", j.name, round, r)
					l := decode[granted](Default, r)
					if len(j.leases) > 1 {
						Expect(l.Parts).To(HaveLen(2), "%s", r)
						Expect(l.Parts[0].Resource).To(Equal("gpu"), "parts in the order of their resources")
						Expect(l.Parts[0].Fence).To(BeNumerically(">", 0))
						Expect(l.Parts[1].Fence).To(BeNumerically(">", 0))
					}
					use(j.leases, 1)
					time.Sleep(time.Duration(30+10*i) * time.Millisecond) // real time: the job's work while it holds its leases
					Expect(managerAPI.check(Default, l.Token).Status).To(Equal(http.StatusOK))
					use(j.leases, -1)
					managerAPI.release(Default, l.Token)
					done[i].Add(1)
				}
			}()
		}
		finished := make(chan struct{})
		go func() { wg.Wait(); close(finished) }()
		Eventually(finished).WithTimeout(90*time.Second).Should(BeClosed(), "every job finishes")
		stopSampling()
		for i, j := range jobs {
			Expect(done[i].Load()).To(BeEquivalentTo(5), "%s finished its rounds", j.name)
		}
		Expect(overCap.Load()).To(BeNil(), "no cap exceeded")
		Expect(sampled.Load()).To(BeNumerically(">", 5), "the counters were sampled while the jobs ran")
		Eventually(func(g Gomega) int {
			cs, err := store.ListCounters(ctx, leasestore.CounterFilter{})
			g.Expect(err).NotTo(HaveOccurred())
			n := 0
			for _, c := range cs {
				if _, ok := caps[c.Resource]; ok {
					n += c.Count
				}
			}
			return n
		}).Should(BeZero(), "every slot given back")
	})
})
