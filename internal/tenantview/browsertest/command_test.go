package browsertest

import (
	"bytes"
	"context"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/onsi/gomega"

	"github.com/vancetope/lease-operator/internal/cli"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/testutil/browser"
	"github.com/vancetope/lease-operator/internal/testutil/waitfor"
)

// syncBuffer is a bytes.Buffer safe for the command's goroutine and the test.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestKubectlLeaseUI runs the command as a tenant admin does, with a kubeconfig file, and
// opens the URL it prints.
func TestKubectlLeaseUI(t *testing.T) {
	h := acquire(t, "acme", "command", "gil")
	var out, errOut syncBuffer
	ctx, stop := context.WithCancel(t.Context())
	t.Cleanup(stop) // a failed step below ends the command too
	done := make(chan int, 1)
	go func() {
		done <- cli.Run(ctx, []string{"ui", "--kubeconfig", aliceFile, "--namespace", nsAcme, "--address", "127.0.0.1:0"},
			cli.IOStreams{In: strings.NewReader(""), Out: &out, ErrOut: &errOut})
	}()
	url := regexp.MustCompile(`http://127\.0\.0\.1:\d+/`)
	g := gomega.NewWithT(t)
	g.Eventually(out.String).WithTimeout(30*time.Second).Should(gomega.MatchRegexp(url.String()), "stderr: %s", errOut.String())

	bctx := browser.New(t, 1024, 768)
	browser.Navigate(bctx, t, url.FindString(out.String()))
	if got := browser.Eval[[]string](bctx, t, jsHolders); !slices.Contains(got, lease.HolderID(h)) {
		t.Errorf("kubectl lease ui lists %v, want %s among them", got, lease.HolderID(h))
	}
	stop()
	if code := waitfor.Receive(t, done, "kubectl lease ui to stop after its context ended"); code != 0 {
		t.Errorf("kubectl lease ui exited %d after Ctrl-C: %s", code, errOut.String())
	}
}
