// Command compile-poller is an example consumer in the shape of a remote compile (the tex
// consumer of docs/client.md): acquire a lease before submitting the job, store the job id
// in the payload once it is known, check the lease in every poll iteration, release it when
// the result is in, and stop at once when the lease is revoked.
//
// The compile service is simulated (a job is done after --polls polls); everything else is
// what a real consumer does with pkg/leaseclient. The lease agent's URL comes from
// $LEASE_AGENT_URL. Exit codes: 0 result, 2 busy, 3 lease lost or revoked, 1 any other error.
//
//	LEASE_AGENT_URL=http://127.0.0.1:8090 compile-poller -tenant acme -project thesis -user ann
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vancetope/lease-operator/pkg/leaseclient"
)

// Exit codes.
const (
	exitError = 1
	exitBusy  = 2
	exitLost  = 3
)

// compileService is the remote service the lease protects.
type compileService interface {
	Submit(ctx context.Context, doc string) (jobID string, err error)
	// Poll reports whether the job is done.
	Poll(ctx context.Context, jobID string) (done bool, err error)
}

// simulated completes a job after a number of polls.
type simulated struct{ polls, seen int }

func (s *simulated) Submit(context.Context, string) (string, error) {
	return fmt.Sprintf("job-%d", time.Now().UnixNano()), nil
}

func (s *simulated) Poll(context.Context, string) (bool, error) {
	s.seen++
	return s.seen >= s.polls, nil
}

func main() {
	var (
		req      leaseclient.Request
		polls    = flag.Int("polls", 3, "polls until the simulated job is done")
		interval = flag.Duration("interval", 500*time.Millisecond, "pause between two polls (keep it below the lease's TTL)")
		wait     = flag.Duration("wait", 0, "longest wait for a slot (0: the definition's)")
	)
	flag.StringVar(&req.Lease, "lease", "tex", "lease definition")
	flag.StringVar(&req.Tenant, "tenant", "", "tenant")
	flag.StringVar(&req.Project, "project", "", "project")
	flag.StringVar(&req.User, "user", "", "user")
	flag.Parse()
	req.Type = "tex"
	req.HolderRef = fmt.Sprintf("compile-poller-%d", os.Getpid())
	// The poll state lives in this process: the resource dies with the pod.
	req.PodBound = true
	req.Wait = *wait

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, req, &simulated{polls: *polls}, *interval)
	stop()
	os.Exit(code)
}

func run(ctx context.Context, req leaseclient.Request, svc compileService, interval time.Duration) int {
	client, err := leaseclient.NewFromEnv()
	if err != nil {
		fmt.Println("error:", err)
		return exitError
	}
	// Acquire before submitting: an overloaded service shows as LEASE_BUSY here rather than
	// as a 429 from the service.
	l, err := client.Acquire(ctx, req)
	var busy *leaseclient.BusyError
	switch {
	case errors.As(err, &busy):
		fmt.Printf("busy: %s full at level %s (%s): %d of %d, waited %s\n",
			busy.Resource, busy.Level, busy.Scope, busy.Count, busy.Cap, busy.Waited)
		return exitBusy
	case err != nil:
		fmt.Println("error:", err)
		return exitError
	}
	// Released on every way out; a release of a lost lease is not an error.
	defer func() {
		if err := l.Release(context.WithoutCancel(ctx)); err != nil {
			fmt.Println("release failed:", err)
		} else {
			fmt.Println("released")
		}
	}()
	fmt.Printf("acquired token=%s noop=%v\n", l.Token, l.NoOp)

	jobID, err := svc.Submit(ctx, "thesis.tex")
	if err != nil {
		fmt.Println("error:", err)
		return exitError
	}
	// The job id is known only now; a revocation handler needs it.
	if err := l.UpdatePayload(ctx, map[string]string{"jobId": jobID}); err != nil {
		return stopped("payload", err)
	}
	fmt.Printf("submitted job=%s\n", jobID)

	revoked := l.Revoked()
	for i := 1; ; i++ {
		// Check at every use: it also renews the lease.
		if err := l.Check(ctx); err != nil {
			return stopped("check", err)
		}
		done, err := svc.Poll(ctx, jobID)
		if err != nil {
			fmt.Println("error:", err)
			return exitError
		}
		fmt.Printf("poll %d done=%v\n", i, done)
		if done {
			fmt.Printf("result job=%s\n", jobID)
			return 0
		}
		select {
		case ev := <-revoked:
			// Stop at once: the slot is already someone else's.
			fmt.Printf("revoked reason=%s: aborting job=%s\n", ev.Reason, jobID)
			return exitLost
		case <-ctx.Done():
			fmt.Println("interrupted")
			return exitError
		case <-time.After(interval):
		}
	}
}

// stopped reports a failed lease call and returns its exit code.
func stopped(op string, err error) int {
	if errors.Is(err, leaseclient.ErrLost) {
		fmt.Printf("lost (%s): %v\n", op, err)
		return exitLost
	}
	fmt.Printf("error (%s): %v\n", op, err)
	return exitError
}
