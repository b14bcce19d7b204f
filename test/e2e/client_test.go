package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"

	"github.com/vancetope/lease-operator/internal/testutil/tokenscan"
)

// requestTimeout bounds one API call of the suite; long-polls set their own.
const requestTimeout = 30 * time.Second

// acquireRequest is the body of POST /v1/leases as an application sends it.
type acquireRequest struct {
	Type      string            `json:"type"`
	Lease     string            `json:"lease,omitempty"`
	Leases    []string          `json:"leases,omitempty"`
	Tenant    string            `json:"tenant"`
	Project   string            `json:"project"`
	User      string            `json:"user,omitempty"`
	HolderRef string            `json:"holderRef,omitempty"`
	PodBound  bool              `json:"podBound,omitempty"`
	Payload   map[string]string `json:"payload,omitempty"`
	WaitMs    *int64            `json:"waitMs,omitempty"`
	Priority  int               `json:"priority,omitempty"`
}

// withWait returns r with waitMs set.
func (r acquireRequest) withWait(ms int64) acquireRequest {
	r.WaitMs = &ms
	return r
}

// leaseLevel is one booked level of a lease answer.
type leaseLevel struct {
	Level string `json:"level"`
	Scope string `json:"scope"`
	Cap   int    `json:"cap"`
}

// granted is the 200 answer of an acquire.
type granted struct {
	Token      string       `json:"token"`
	NoOp       bool         `json:"noop"`
	Lease      string       `json:"lease"`
	Resource   string       `json:"resource"`
	Levels     []leaseLevel `json:"levels"`
	TTLSeconds int64        `json:"ttlSeconds"`
	Fence      int64        `json:"fence"`
	// Parts: the leases of an acquisition of several, each with its fence.
	Parts []grantedPart `json:"leases"`
}

// grantedPart is one lease of an acquisition of several.
type grantedPart struct {
	Lease    string `json:"lease"`
	Resource string `json:"resource"`
	Fence    int64  `json:"fence"`
}

// capAt returns the cap of level in the answer, 0 when the level is not capped.
func (l granted) capAt(level string) int {
	for _, lv := range l.Levels {
		if lv.Level == level {
			return lv.Cap
		}
	}
	return 0
}

// apiError is every error answer of the admission and operator APIs.
type apiError struct {
	Error    string `json:"error"`
	Message  string `json:"message"`
	Field    string `json:"field"`
	Lease    string `json:"lease"`
	Resource string `json:"resource"`
	Level    string `json:"level"`
	Scope    string `json:"scope"`
	Count    *int   `json:"count"`
	Cap      *int   `json:"cap"`
	WaitedMs *int64 `json:"waitedMs"`
	// CallerNamespace and CallerTenant explain a TENANT_FORBIDDEN.
	CallerNamespace string `json:"callerNamespace"`
	CallerTenant    string `json:"callerTenant"`
}

// response is one HTTP answer.
type response struct {
	Status int
	Body   []byte
}

func (r response) String() string {
	return fmt.Sprintf("HTTP %d %s", r.Status, bytes.TrimSpace(r.Body))
}

// decode unmarshals the body into a fresh T, failing the spec (or g) when it is no JSON.
func decode[T any](g Gomega, r response) T {
	var v T
	g.ExpectWithOffset(1, json.Unmarshal(r.Body, &v)).To(Succeed(), "body of %s", r)
	return v
}

// handedOut is every token the suite was handed: by an acquisition through an apiClient or
// the Go client, or printed by an example consumer. At the end of the suite no process's log
// may carry any of them (docs/security.md, "Tokens").
var handedOut tokenscan.Tokens

// apiClient calls one HTTP server of the system (the manager's API or an agent's).
type apiClient struct {
	name string
	base string // http://host:port
	http *http.Client
}

// newAPIClient returns a client of the server at addr (host:port). With source set, the
// client connects from that local address (the manager identifies pods by source IP).
func newAPIClient(name, addr, source string) *apiClient {
	dialer := &net.Dialer{Timeout: 5 * time.Second}
	if source != "" {
		dialer.LocalAddr = &net.TCPAddr{IP: net.ParseIP(source)}
	}
	transport := &http.Transport{DialContext: dialer.DialContext, MaxIdleConnsPerHost: 4, IdleConnTimeout: 30 * time.Second}
	return &apiClient{name: name, base: "http://" + addr, http: &http.Client{Transport: transport}}
}

// call sends method path with body (nil: none; []byte: as is; else JSON) and headers
// ("Key: value"), and returns the answer; a transport error is returned, not asserted.
func (c *apiClient) call(ctx context.Context, method, path string, body any, headers ...string) (response, error) {
	var rd io.Reader
	switch b := body.(type) {
	case nil:
	case []byte:
		rd = bytes.NewReader(b)
	default:
		data, err := json.Marshal(b)
		if err != nil {
			return response{}, err
		}
		rd = bytes.NewReader(data)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, rd)
	if err != nil {
		return response{}, err
	}
	if rd != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	for _, h := range headers {
		k, v, _ := strings.Cut(h, ":")
		req.Header.Set(strings.TrimSpace(k), strings.TrimSpace(v))
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return response{}, fmt.Errorf("%s %s on %s: %w", method, path, c.name, err)
	}
	defer func() { _ = resp.Body.Close() }()
	data, err := io.ReadAll(resp.Body)
	if err != nil {
		return response{}, fmt.Errorf("reading the answer of %s %s on %s: %w", method, path, c.name, err)
	}
	if resp.StatusCode == http.StatusOK {
		var l granted
		if json.Unmarshal(data, &l) == nil {
			handedOut.Add(l.Token)
		}
	}
	return response{Status: resp.StatusCode, Body: data}, nil
}

// do is call with the suite's request timeout, asserting (with g) that the call went through.
func (c *apiClient) do(g Gomega, method, path string, body any, headers ...string) response {
	ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
	defer cancel()
	r, err := c.call(ctx, method, path, body, headers...)
	g.ExpectWithOffset(1, err).NotTo(HaveOccurred())
	return r
}

// acquire posts an acquisition and returns the raw answer.
func (c *apiClient) acquire(g Gomega, req acquireRequest) response {
	return c.do(g, http.MethodPost, "/v1/leases", req)
}

// acquireRefused acquires where the spec expects a refusal (busy, unavailable). A lease
// granted anyway is released at once, so that the failing spec (or the next try of an
// Eventually) leaks no slot into what follows.
func (c *apiClient) acquireRefused(g Gomega, req acquireRequest) response {
	r := c.acquire(g, req)
	if r.Status == http.StatusOK {
		var l granted
		if json.Unmarshal(r.Body, &l) == nil && l.Token != "" {
			c.release(g, l.Token)
		}
	}
	return r
}

// mustAcquire acquires and expects a lease; the spec releases it on cleanup (release is
// idempotent, so a spec may release it itself as well).
func (c *apiClient) mustAcquire(req acquireRequest) granted {
	GinkgoHelper()
	r := c.acquire(Default, req)
	Expect(r.Status).To(Equal(http.StatusOK), "acquire %+v on %s: %s", req, c.name, r)
	l := decode[granted](Default, r)
	Expect(l.Token).To(MatchRegexp(`^[0-9a-f]{32}$`), "token of %s", r)
	c.releaseOnCleanup(l.Token)
	return l
}

// releaseOnCleanup releases token when the spec ends.
func (c *apiClient) releaseOnCleanup(token string) {
	DeferCleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		defer cancel()
		r, err := c.call(ctx, http.MethodDelete, "/v1/leases/"+token, nil)
		if err != nil || r.Status != http.StatusOK {
			GinkgoWriter.Printf("cleanup: releasing %s on %s: %v %s\n", token, c.name, err, r)
		}
	})
}

func (c *apiClient) check(g Gomega, token string) response {
	return c.do(g, http.MethodPost, "/v1/leases/"+token+"/check", nil)
}

func (c *apiClient) release(g Gomega, token string) response {
	return c.do(g, http.MethodDelete, "/v1/leases/"+token, nil)
}

func (c *apiClient) putPayload(g Gomega, token string, payload map[string]string) response {
	return c.do(g, http.MethodPut, "/v1/leases/"+token+"/payload", map[string]any{"payload": payload})
}

// metric returns the value of the sample name{labels} in a Prometheus text exposition, and
// whether it is there. labels must all match; the sample may have more.
func metric(exposition, name string, labels map[string]string) (float64, bool) {
	for _, line := range strings.Split(exposition, "\n") {
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		got := map[string]string{}
		if strings.HasPrefix(rest, "{") {
			end := strings.Index(rest, "}")
			if end < 0 {
				continue
			}
			for _, pair := range splitLabels(rest[1:end]) {
				k, v, _ := strings.Cut(pair, "=")
				if uq, err := strconv.Unquote(v); err == nil {
					v = uq
				}
				got[k] = v
			}
			rest = rest[end+1:]
		} else if !strings.HasPrefix(rest, " ") {
			continue // another metric whose name starts with name
		}
		match := true
		for k, v := range labels {
			if got[k] != v {
				match = false
				break
			}
		}
		if !match {
			continue
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		return v, true
	}
	return 0, false
}

// splitLabels splits a="x",b="y" at the commas between pairs (label values here contain
// no commas or quotes).
func splitLabels(s string) []string {
	var out []string
	for _, part := range strings.Split(s, ",") {
		if part = strings.TrimSpace(part); part != "" {
			out = append(out, part)
		}
	}
	return out
}
