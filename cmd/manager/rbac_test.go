package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/settings"
)

// shippedRBAC reads every Role and ClusterRole, and every binding, that config/rbac's
// kustomization installs.
func shippedRBAC(t *testing.T) (roles []rbacv1.ClusterRole, bindings []rbacv1.ClusterRoleBinding) {
	t.Helper()
	dir := filepath.Join("..", "..", "config", "rbac")
	data, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var k struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		t.Fatal(err)
	}
	for _, file := range k.Resources {
		data, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			t.Fatal(err)
		}
		for _, doc := range strings.Split(string(data), "\n---") {
			var meta struct {
				Kind string `json:"kind"`
			}
			if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			switch meta.Kind {
			case "ClusterRole", "Role": // the same rules
				var r rbacv1.ClusterRole
				if err := yaml.Unmarshal([]byte(doc), &r); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				roles = append(roles, r)
			case "ClusterRoleBinding", "RoleBinding":
				var b rbacv1.ClusterRoleBinding
				if err := yaml.Unmarshal([]byte(doc), &b); err != nil {
					t.Fatalf("%s: %v", file, err)
				}
				bindings = append(bindings, b)
			}
		}
	}
	return roles, bindings
}

// TestShippedRolesKeepTenancyToTheManager: the definitions and the namespace-to-tenant map
// are read by the manager alone (issue 26, item 7). A role that workloads could be bound to
// (every role the manager's service account is not bound to) grants no read of namespaces or
// LeaseDefinitions: an app container must not learn every tenant's ID and definitions.
func TestShippedRolesKeepTenancyToTheManager(t *testing.T) {
	roles, bindings := shippedRBAC(t)
	managers := map[string]bool{}
	for _, b := range bindings {
		for _, s := range b.Subjects {
			if s.Kind == rbacv1.ServiceAccountKind && s.Name == "controller-manager" {
				managers[b.RoleRef.Name] = true
			}
		}
	}
	if !managers["manager-role"] {
		t.Fatalf("no binding of manager-role to the manager's service account among %d bindings", len(bindings))
	}
	for _, r := range roles {
		if managers[r.Name] {
			continue
		}
		for _, rule := range r.Rules {
			for _, res := range rule.Resources {
				private := (res == "namespaces" && slices.Contains(rule.APIGroups, "")) ||
					(strings.HasPrefix(res, "leasedefinitions") && slices.Contains(rule.APIGroups, "lease.vancetope.io"))
				if private && len(rule.Verbs) > 0 {
					t.Errorf("role %s grants %v on %s: only the manager reads definitions and tenancy", r.Name, rule.Verbs, res)
				}
			}
		}
	}
}

// TestInjectedAgentAsksTheManager: the agent the webhook injects is told where the manager
// is, and nothing that would make it read definitions or tenancy from the API itself.
func TestInjectedAgentAsksTheManager(t *testing.T) {
	const url = "http://lease-operator-admission.lease-operator-system.svc:8082"
	cfg := inject.Config{Image: "example.com/lease-operator:dev", ManagerURL: url}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate() = %v", err)
	}
	if err := (inject.Config{Image: cfg.Image}).Validate(); err == nil || !strings.Contains(err.Error(), "manager URL") {
		t.Errorf("Validate() without a manager URL = %v, want an error about the manager URL", err)
	}
	pod := agentTestPod()
	if _, err := inject.Inject(pod, cfg); err != nil {
		t.Fatal(err)
	}
	env := map[string]string{}
	for _, c := range pod.Spec.InitContainers {
		if c.Name == inject.AgentContainerName {
			for _, e := range c.Env {
				env[e.Name] = e.Value
			}
		}
	}
	if env[settings.EnvManagerURL] != url {
		t.Errorf("agent %s = %q, want %q", settings.EnvManagerURL, env[settings.EnvManagerURL], url)
	}
	for _, name := range []string{settings.EnvSystemNamespace, "LEASE_NAMESPACES", settings.EnvBuiltinConfigMap} {
		if v, ok := env[name]; ok {
			t.Errorf("agent has %s=%q: agents no longer resolve definitions themselves", name, v)
		}
	}
}

func agentTestPod() *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "acme", Annotations: map[string]string{inject.AnnotationInject: "true"}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1"}}},
	}
}
