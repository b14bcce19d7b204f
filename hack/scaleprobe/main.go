// Command scaleprobe measures acquisitions through the admission API of a running manager
// (`make run`) while the store holds many holders: it fills the store with holders spread
// over many tenants, then times sequential probes (an acquisition by a new user, then its
// release) and prints their p50 and p99. docs/operations.md ("make run with 10 000 holders")
// has the figures and the definition it expects.
//
//	go run ./hack/scaleprobe -url http://127.0.0.1:8082 -fill 10000 -probes 500
//
// The holders it fills stay (their TTL is the definition's; the probe checks none of them in,
// so run it within that TTL). It speaks HTTP and JSON only.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	url := flag.String("url", "http://127.0.0.1:8082", "the admission API")
	lease := flag.String("lease", "scale", "the lease name (a system-layer definition with room for every holder)")
	fill := flag.Int("fill", 0, "holders to create first")
	tenants := flag.Int("tenants", 1000, "tenants the holders are spread over")
	parallel := flag.Int("parallel", 8, "callers filling in parallel")
	probes := flag.Int("probes", 500, "sequential acquire+release probes")
	run := flag.String("run", fmt.Sprintf("%d", time.Now().Unix()), "a run ID, part of every user name")
	flag.Parse()
	p := &prober{url: *url, lease: *lease, client: &http.Client{Timeout: 30 * time.Second}}
	if err := p.main(*fill, *tenants, *parallel, *probes, *run); err != nil {
		fmt.Fprintln(os.Stderr, "scaleprobe:", err)
		os.Exit(1)
	}
}

type prober struct {
	url, lease string
	client     *http.Client
}

func (p *prober) main(fill, tenants, parallel, probes int, run string) error {
	ctx := context.Background()
	if fill > 0 {
		start := time.Now()
		var next atomic.Int64
		var failed atomic.Int64
		var wg sync.WaitGroup
		for range parallel {
			wg.Go(func() {
				for {
					i := int(next.Add(1)) - 1
					if i >= fill {
						return
					}
					if _, err := p.acquire(ctx, fmt.Sprintf("st%d", i%tenants), fmt.Sprintf("fill-%s-%d", run, i)); err != nil {
						if failed.Add(1) <= 3 {
							fmt.Fprintln(os.Stderr, "fill:", err)
						}
					}
				}
			})
		}
		wg.Wait()
		took := time.Since(start)
		fmt.Printf("filled %d holders over %d tenants in %v (%.1f holders/s), %d failed\n",
			fill, tenants, took.Round(time.Millisecond), float64(fill)/took.Seconds(), failed.Load())
	}
	if probes == 0 {
		return nil
	}
	var acq, rel []time.Duration
	for i := range probes {
		t0 := time.Now()
		token, err := p.acquire(ctx, fmt.Sprintf("st%d", i%tenants), fmt.Sprintf("probe-%s-%d", run, i))
		if err != nil {
			return err
		}
		t1 := time.Now()
		if err := p.release(ctx, token); err != nil {
			return err
		}
		acq, rel = append(acq, t1.Sub(t0)), append(rel, time.Since(t1))
	}
	fmt.Printf("%d probes: acquire p50 %s p99 %s; release p50 %s p99 %s\n", probes,
		ms(quantile(acq, 0.5)), ms(quantile(acq, 0.99)), ms(quantile(rel, 0.5)), ms(quantile(rel, 0.99)))
	return nil
}

func (p *prober) acquire(ctx context.Context, tenant, user string) (string, error) {
	body, _ := json.Marshal(map[string]any{
		"type": "tex", "lease": p.lease, "tenant": tenant, "project": "p", "user": user,
		"holderRef": "scaleprobe", "waitMs": 0,
	})
	var out struct{ Token string }
	if err := p.do(ctx, http.MethodPost, "/v1/leases", body, &out); err != nil {
		return "", err
	}
	return out.Token, nil
}

func (p *prober) release(ctx context.Context, token string) error {
	return p.do(ctx, http.MethodDelete, "/v1/leases/"+token, nil, nil)
}

func (p *prober) do(ctx context.Context, method, path string, body []byte, out any) error {
	req, err := http.NewRequestWithContext(ctx, method, p.url+path, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := p.client.Do(req)
	if err != nil {
		return err
	}
	defer func() { _ = resp.Body.Close() }()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s %s: %d %s", method, path, resp.StatusCode, bytes.TrimSpace(b))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

func quantile(d []time.Duration, q float64) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }
