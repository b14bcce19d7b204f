package metrics_test

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	"sigs.k8s.io/yaml"

	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/lease"
	"github.com/vancetope/lease-operator/internal/metrics"
	"github.com/vancetope/lease-operator/internal/revocation"
)

// The alerts and the dashboard of config/prometheus are checked here, so that a renamed
// metric breaks the build and not the dashboard (docs/observability.md).

const promDir = "../../config/prometheus"

// nameRecorder is a prometheus.Registerer that records the metric names of what is
// registered with it.
type nameRecorder struct{ names map[string]bool }

var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

func (r *nameRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 32)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		if m := fqName.FindStringSubmatch(d.String()); m != nil {
			r.names[m[1]] = true
		}
	}
	return nil
}

func (r *nameRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}

func (r *nameRecorder) Unregister(prometheus.Collector) bool { return true }

// registeredNames returns the names of every lease metric the operator registers: the
// metrics of this package, the state gauges and the revocation dispatcher's own.
func registeredNames(t *testing.T) map[string]bool {
	rec := &nameRecorder{names: map[string]bool{}}
	metrics.New(rec)
	rec.MustRegister(metrics.NewStateCollector(func(context.Context) (metrics.State, error) { return metrics.State{}, nil }))
	revocation.NewDispatcher(nil, lease.PodRef{}, nil, revocation.WithMetrics(metrics.New(nil)), revocation.WithRegisterer(rec))
	if len(rec.names) < 10 {
		t.Fatalf("only %d metric names recorded: %v", len(rec.names), rec.names)
	}
	return rec.names
}

var leaseMetric = regexp.MustCompile(`\bvance_lease_[a-z0-9_]+`)

// unknownNames returns the lease metric names in expr that the code does not register.
func unknownNames(expr string, known map[string]bool) []string {
	var out []string
	for _, n := range leaseMetric.FindAllString(expr, -1) {
		base := n
		for _, suffix := range []string{"_bucket", "_sum", "_count"} {
			if b, ok := strings.CutSuffix(n, suffix); ok && known[b] {
				base = b
			}
		}
		if !known[base] {
			out = append(out, n)
		}
	}
	return out
}

// ruleFile is the spec of the PrometheusRule: a Prometheus rule file.
type ruleFile struct {
	Groups []struct {
		Name  string `json:"name"`
		Rules []struct {
			Alert  string            `json:"alert"`
			Record string            `json:"record"`
			Expr   string            `json:"expr"`
			Labels map[string]string `json:"labels"`
		} `json:"rules"`
	} `json:"groups"`
}

func readRules(t *testing.T) (spec []byte, rules ruleFile) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(promDir, "rules.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var pr struct {
		Kind string          `json:"kind"`
		Spec json.RawMessage `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pr); err != nil {
		t.Fatalf("rules.yaml: %v", err)
	}
	if pr.Kind != "PrometheusRule" {
		t.Fatalf("rules.yaml is a %q, want a PrometheusRule", pr.Kind)
	}
	if err := json.Unmarshal(pr.Spec, &rules); err != nil {
		t.Fatal(err)
	}
	spec, err = yaml.JSONToYAML(pr.Spec)
	if err != nil {
		t.Fatal(err)
	}
	return spec, rules
}

func TestRulesUseRegisteredMetrics(t *testing.T) {
	known := registeredNames(t)
	_, rules := readRules(t)
	n := 0
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			n++
			if bad := unknownNames(r.Expr, known); len(bad) > 0 {
				t.Errorf("rule %s uses metrics the code does not register: %v", r.Alert+r.Record, bad)
			}
		}
	}
	if n < 5 {
		t.Errorf("%d rules, want the alerts of docs/observability.md", n)
	}
}

// selector is a metric name with its label matchers, as written in a rule.
var selector = regexp.MustCompile(`\b(vance_lease_[a-z0-9_]+)(\{[^}]*\})?`)

// TestCriticalAlertsReadOnlyTheManager: the agents run in tenants' pods (their store URI,
// their workload), so what they report may page no one; a critical alert reads only series
// of the manager's job, which no scraped pod can claim (docs/observability.md).
func TestCriticalAlertsReadOnlyTheManager(t *testing.T) {
	_, rules := readRules(t)
	for _, g := range rules.Groups {
		for _, r := range g.Rules {
			if r.Labels["severity"] != "critical" {
				continue
			}
			for _, m := range selector.FindAllStringSubmatch(r.Expr, -1) {
				if !strings.Contains(m[2], `job="lease-manager"`) {
					t.Errorf("critical alert %s reads %s without job=\"lease-manager\"", r.Alert, m[0])
				}
			}
		}
	}
}

// TestAgentMonitorScrapesOnlyInjectedAgents: the PodMonitor selects the label the webhook
// sets only on pods it injected, keeps only the port of the injected native sidecar, and
// names the job itself.
func TestAgentMonitorScrapesOnlyInjectedAgents(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(promDir, "agent-monitor.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	type relabel struct {
		SourceLabels []string `json:"sourceLabels"`
		Regex        string   `json:"regex"`
		Action       string   `json:"action"`
		TargetLabel  string   `json:"targetLabel"`
		Replacement  string   `json:"replacement"`
	}
	var pm struct {
		Kind string `json:"kind"`
		Spec struct {
			Selector struct {
				MatchLabels map[string]string `json:"matchLabels"`
			} `json:"selector"`
			Endpoints []struct {
				Port        string    `json:"port"`
				HonorLabels bool      `json:"honorLabels"`
				Relabelings []relabel `json:"relabelings"`
			} `json:"podMetricsEndpoints"`
		} `json:"spec"`
	}
	if err := yaml.Unmarshal(raw, &pm); err != nil {
		t.Fatal(err)
	}
	if pm.Kind != "PodMonitor" {
		t.Fatalf("agent-monitor.yaml is a %q, want a PodMonitor", pm.Kind)
	}
	if diff := cmp.Diff(map[string]string{inject.LabelAgent: "true"}, pm.Spec.Selector.MatchLabels); diff != "" {
		t.Errorf("PodMonitor selector (-want +got):\n%s", diff)
	}
	if len(pm.Spec.Endpoints) != 1 {
		t.Fatalf("%d endpoints, want 1", len(pm.Spec.Endpoints))
	}
	ep := pm.Spec.Endpoints[0]
	if ep.Port != inject.AgentInternalPortName || ep.HonorLabels {
		t.Errorf("endpoint port %q honorLabels %v, want %q and false", ep.Port, ep.HonorLabels, inject.AgentInternalPortName)
	}
	want := []relabel{
		{SourceLabels: []string{"__meta_kubernetes_pod_container_name", "__meta_kubernetes_pod_container_init"},
			Regex: inject.AgentContainerName + ";true", Action: "keep"},
		{TargetLabel: "job", Replacement: "lease-agent"},
	}
	if diff := cmp.Diff(want, ep.Relabelings); diff != "" {
		t.Errorf("relabelings (-want +got):\n%s", diff)
	}
}

func TestDashboardUsesRegisteredMetrics(t *testing.T) {
	known := registeredNames(t)
	raw, err := os.ReadFile(filepath.Join(promDir, "lease-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	used := map[string]bool{}
	check := func(where, expr string) {
		for _, n := range leaseMetric.FindAllString(expr, -1) {
			used[n] = true
		}
		if bad := unknownNames(expr, known); len(bad) > 0 {
			t.Errorf("%s uses metrics the code does not register: %v", where, bad)
		}
	}
	for _, p := range dash.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			if tg.Expr == "" {
				t.Errorf("panel %q has an empty query", p.Title)
			}
			check("panel "+p.Title, tg.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		check("variable", v.Definition)
	}
	if len(used) < 10 {
		names := make([]string, 0, len(used))
		for n := range used {
			names = append(names, n)
		}
		sort.Strings(names)
		t.Errorf("the dashboard shows only %v", names)
	}
}

// promtool returns the path of promtool (Debian package prometheus). In CI (CI=true) a
// missing promtool fails the test; elsewhere it skips it.
func promtool(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("promtool is not installed; .ci/run installs it (apt-get install -y prometheus)")
		}
		t.Skip("promtool is not installed (apt-get install -y prometheus); the rules are not checked")
	}
	return p
}

// ruleDir writes the rule file inside the PrometheusRule, and the alert unit tests
// (rules-test.yaml, which names it rules.yaml), into a temporary directory.
func ruleDir(t *testing.T) string {
	t.Helper()
	spec, _ := readRules(t)
	dir := t.TempDir()
	tests, err := os.ReadFile(filepath.Join(promDir, "rules-test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{"rules.yaml": spec, "rules-test.yaml": tests} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRulesPassPromtool runs `promtool check rules` on the PrometheusRule's rule file.
func TestRulesPassPromtool(t *testing.T) {
	bin := promtool(t)
	out, err := exec.Command(bin, "check", "rules", filepath.Join(ruleDir(t), "rules.yaml")).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
}

// TestAlertsFire runs the alert unit tests of rules-test.yaml (`promtool test rules`): each
// alert fires on the series it is meant for, after its for-duration, and not before.
func TestAlertsFire(t *testing.T) {
	bin := promtool(t)
	cmd := exec.Command(bin, "test", "rules", "rules-test.yaml")
	cmd.Dir = ruleDir(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
