package inject

import (
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/vancetope/lease-operator/internal/settings"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"k8s.io/utils/ptr"
)

const testImage = "registry.example/lease-operator:v1"

// wantAgent is the agent container as the product expects it, written out in full so the
// test does not repeat the code under test.
func wantAgent() corev1.Container {
	fieldRef := func(name, path string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{
			FieldRef: &corev1.ObjectFieldSelector{APIVersion: "v1", FieldPath: path},
		}}
	}
	probe := func(path string, period, failures int32) *corev1.Probe {
		return &corev1.Probe{
			ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
				Path: path, Port: intstr.FromString("lease-internal"),
			}},
			PeriodSeconds: period, TimeoutSeconds: 1, FailureThreshold: failures,
		}
	}
	return corev1.Container{
		Name:    "lease-agent",
		Image:   testImage,
		Command: []string{"/agent"},
		Args:    []string{"--api-bind-address=127.0.0.1:8090", "--internal-bind-address=:8091"},
		Env: []corev1.EnvVar{
			fieldRef("POD_NAME", "metadata.name"),
			fieldRef("POD_NAMESPACE", "metadata.namespace"),
			fieldRef("POD_UID", "metadata.uid"),
			fieldRef("POD_IP", "status.podIP"),
			{Name: "MONGODB_URI", ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
				LocalObjectReference: corev1.LocalObjectReference{Name: "lease-store"}, Key: "uri",
			}}},
			{Name: "LEASE_MANAGER_URL", Value: testManagerURL},
		},
		Ports: []corev1.ContainerPort{
			{Name: "lease-agent", ContainerPort: 8090, Protocol: corev1.ProtocolTCP},
			{Name: "lease-internal", ContainerPort: 8091, Protocol: corev1.ProtocolTCP},
		},
		StartupProbe:   probe("/readyz", 1, 30),
		ReadinessProbe: probe("/readyz", 10, 3),
		LivenessProbe:  probe("/healthz", 10, 3),
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{
				corev1.ResourceCPU:    resource.MustParse("10m"),
				corev1.ResourceMemory: resource.MustParse("32Mi"),
			},
			Limits: corev1.ResourceList{corev1.ResourceMemory: resource.MustParse("64Mi")},
		},
		RestartPolicy:            ptr.To(corev1.ContainerRestartPolicyAlways),
		TerminationMessagePolicy: corev1.TerminationMessageFallbackToLogsOnError,
		SecurityContext: &corev1.SecurityContext{
			RunAsNonRoot:             ptr.To(true),
			RunAsUser:                ptr.To[int64](65532),
			RunAsGroup:               ptr.To[int64](65532),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
			SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
		},
	}
}

// testManagerURL is the manager's admission Service, which every agent is given.
const testManagerURL = "http://lease-operator-admission.lease-operator-system.svc:8082"

var urlEnv = corev1.EnvVar{Name: "LEASE_AGENT_URL", Value: "http://127.0.0.1:8090"}

// testPod is a pod with the given annotations and one app container.
func testPod(annotations map[string]string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "app", Namespace: "team-a", Annotations: annotations,
			Labels: map[string]string{"app": "tex"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "app", Image: "app:1",
			Env: []corev1.EnvVar{{Name: "MODE", Value: "compile"}}}}},
	}
}

// injected is testPod(annotations) as Inject should leave it.
func injected(annotations map[string]string) *corev1.Pod {
	pod := testPod(annotations)
	pod.Labels["lease.vancetope.io/agent"] = "true"
	pod.Spec.InitContainers = []corev1.Container{wantAgent()}
	pod.Spec.Containers[0].Env = append(pod.Spec.Containers[0].Env, urlEnv)
	return pod
}

var inject = map[string]string{"lease.vancetope.io/inject": "true"}

func TestInject(t *testing.T) {
	cfg := Config{Image: testImage, ManagerURL: testManagerURL}
	tests := map[string]struct {
		pod         *corev1.Pod
		cfg         Config
		want        *corev1.Pod // nil: the input, unchanged
		wantChanged bool
		wantErr     string // substring of an Invalid error; the pod must stay unchanged
	}{
		"annotated pod gets one native sidecar agent, the label and the URL": {
			pod: testPod(inject), cfg: cfg, want: injected(inject), wantChanged: true,
		},
		"already injected pod is unchanged": {
			pod: injected(inject), cfg: cfg,
		},
		"pod without the annotation is untouched": {
			pod: testPod(nil), cfg: cfg,
		},
		"pod annotated false is untouched": {
			pod: testPod(map[string]string{"lease.vancetope.io/inject": "false"}), cfg: cfg,
		},
		"per-pod store secret override": {
			pod: testPod(map[string]string{"lease.vancetope.io/inject": "true", "lease.vancetope.io/store-secret": "tex-store"}),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(map[string]string{"lease.vancetope.io/inject": "true", "lease.vancetope.io/store-secret": "tex-store"})
				p.Spec.InitContainers[0].Env[4].ValueFrom.SecretKeyRef.Name = "tex-store"
				return p
			}(),
			wantChanged: true,
		},
		"configured store secret and database": {
			pod: testPod(inject), cfg: Config{Image: testImage, StoreSecret: "mongo", StoreDatabase: "leases", ManagerURL: testManagerURL},
			want: func() *corev1.Pod {
				p := injected(inject)
				agent := &p.Spec.InitContainers[0]
				agent.Env[4].ValueFrom.SecretKeyRef.Name = "mongo"
				agent.Env = slices.Insert(agent.Env, 5, corev1.EnvVar{Name: "MONGODB_DATABASE", Value: "leases"})
				return p
			}(),
			wantChanged: true,
		},
		"configured manager URL": {
			pod: testPod(inject), cfg: Config{Image: testImage, ManagerURL: "http://manager.example:8082"},
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].Env[5].Value = "http://manager.example:8082"
				return p
			}(),
			wantChanged: true,
		},
		"app container that sets LEASE_AGENT_URL keeps its own value": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env,
					corev1.EnvVar{Name: "LEASE_AGENT_URL", Value: "http://localhost:8090"})
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.Containers[0].Env[1].Value = "http://localhost:8090"
				return p
			}(),
			wantChanged: true,
		},
		"agent goes first; every other container, init containers too, gets the URL": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.InitContainers = []corev1.Container{{Name: "migrate", Image: "migrate:1"}}
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "worker", Image: "worker:1"})
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers = append(p.Spec.InitContainers,
					corev1.Container{Name: "migrate", Image: "migrate:1", Env: []corev1.EnvVar{urlEnv}})
				p.Spec.Containers = append(p.Spec.Containers,
					corev1.Container{Name: "worker", Image: "worker:1", Env: []corev1.EnvVar{urlEnv}})
				return p
			}(),
			wantChanged: true,
		},
		"reinvoked after another webhook added a container: URL only, no second agent": {
			pod: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "proxy", Image: "proxy:1"})
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.Containers = append(p.Spec.Containers,
					corev1.Container{Name: "proxy", Image: "proxy:1", Env: []corev1.EnvVar{urlEnv}})
				return p
			}(),
			wantChanged: true,
		},
		"a hand-written lease-agent container is not replaced": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "lease-agent", Image: "mine:1"})
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, urlEnv)
				p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: "lease-agent", Image: "mine:1"})
				return p
			}(),
			wantChanged: true,
		},
		"a hand-written lease-agent container does not get the agent label, and loses one set by hand": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Labels["lease.vancetope.io/agent"] = "true"
				p.Spec.InitContainers = []corev1.Container{{Name: "lease-agent", Image: "mine:1",
					RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.InitContainers = []corev1.Container{{Name: "lease-agent", Image: "mine:1",
					RestartPolicy: ptr.To(corev1.ContainerRestartPolicyAlways)}}
				p.Spec.Containers[0].Env = append(p.Spec.Containers[0].Env, urlEnv)
				return p
			}(),
			wantChanged: true,
		},
		"the agent image with another command line is not the injected agent": {
			pod: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].Args = []string{"--metrics-bind-address=:8091"}
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].Args = []string{"--metrics-bind-address=:8091"}
				delete(p.Labels, "lease.vancetope.io/agent")
				return p
			}(),
			wantChanged: true,
		},
		"an agent injected by an earlier version (manager agent …) keeps its label": {
			pod: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].Command = nil
				p.Spec.InitContainers[0].Args = append([]string{"agent"}, p.Spec.InitContainers[0].Args...)
				return p
			}(),
			cfg: cfg,
		},
		"the agent binary with the manager's mode argument is not the injected agent": {
			pod: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].Args = append([]string{"agent"}, p.Spec.InitContainers[0].Args...)
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].Args = append([]string{"agent"}, p.Spec.InitContainers[0].Args...)
				delete(p.Labels, "lease.vancetope.io/agent")
				return p
			}(),
			wantChanged: true,
		},
		"an injected agent that a later admission plugin gave a volume mount keeps its label": {
			pod: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.InitContainers[0].VolumeMounts = []corev1.VolumeMount{{Name: "kube-api-access", MountPath: "/var/run/secrets/kubernetes.io/serviceaccount"}}
				return p
			}(),
			cfg: cfg,
		},
		"a pod labelled as an agent without asking for one loses the label": {
			pod: func() *corev1.Pod {
				p := testPod(nil)
				p.Labels["lease.vancetope.io/agent"] = "true"
				return p
			}(),
			cfg: cfg, want: testPod(nil), wantChanged: true,
		},
		"a pod annotated false loses a hand-set agent label": {
			pod: func() *corev1.Pod {
				p := testPod(map[string]string{"lease.vancetope.io/inject": "false"})
				p.Labels["lease.vancetope.io/agent"] = "yes"
				return p
			}(),
			cfg: cfg, want: testPod(map[string]string{"lease.vancetope.io/inject": "false"}), wantChanged: true,
		},
		"invalid annotation value is rejected": {
			pod: testPod(map[string]string{"lease.vancetope.io/inject": "yes"}), cfg: cfg,
			wantErr: `metadata.annotations[lease.vancetope.io/inject]: Unsupported value: "yes"`,
		},
		"invalid store secret override is rejected": {
			pod:     testPod(map[string]string{"lease.vancetope.io/inject": "true", "lease.vancetope.io/store-secret": "Tex_Store"}),
			cfg:     cfg,
			wantErr: `metadata.annotations[lease.vancetope.io/store-secret]: Invalid value: "Tex_Store"`,
		},
		"host network pod is rejected": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.HostNetwork = true
				return p
			}(),
			cfg:     cfg,
			wantErr: "spec.hostNetwork: Forbidden",
		},
		"windows pod is rejected": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.OS = &corev1.PodOS{Name: corev1.Windows}
				return p
			}(),
			cfg:     cfg,
			wantErr: "spec.os.name: Forbidden",
		},
		"linux pod is injected": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.OS = &corev1.PodOS{Name: corev1.Linux}
				return p
			}(),
			cfg: cfg,
			want: func() *corev1.Pod {
				p := injected(inject)
				p.Spec.OS = &corev1.PodOS{Name: corev1.Linux}
				return p
			}(),
			wantChanged: true,
		},
		"app container on an agent port is rejected": {
			pod: func() *corev1.Pod {
				p := testPod(inject)
				p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080}, {ContainerPort: 8091}}
				return p
			}(),
			cfg:     cfg,
			wantErr: "spec.containers[0].ports[1].containerPort: Invalid value: 8091",
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			pod := tc.pod.DeepCopy()
			want := tc.want
			if want == nil {
				want = tc.pod
			}
			changed, err := Inject(pod, tc.cfg)
			if tc.wantErr != "" {
				if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Inject() error = %v, want an Invalid error containing %q", err, tc.wantErr)
				}
				if diff := cmp.Diff(tc.pod, pod); diff != "" {
					t.Errorf("Inject() changed a rejected pod (-before +after):\n%s", diff)
				}
				return
			}
			if err != nil {
				t.Fatalf("Inject() error = %v", err)
			}
			if changed != tc.wantChanged {
				t.Errorf("Inject() changed = %v, want %v", changed, tc.wantChanged)
			}
			if diff := cmp.Diff(want, pod); diff != "" {
				t.Errorf("Inject() pod mismatch (-want +got):\n%s", diff)
			}

			// Injecting the result again changes nothing.
			again := pod.DeepCopy()
			changed, err = Inject(again, tc.cfg)
			if err != nil || changed {
				t.Errorf("second Inject() = (%v, %v), want (false, nil)", changed, err)
			}
			if diff := cmp.Diff(pod, again); diff != "" {
				t.Errorf("second Inject() changed the pod (-first +second):\n%s", diff)
			}
		})
	}
}

func TestInjectRejectsBadConfig(t *testing.T) {
	tests := map[string]struct {
		cfg     Config
		wantErr string
	}{
		"no image":              {cfg: Config{ManagerURL: testManagerURL}, wantErr: "agent image is required"},
		"no manager URL":        {cfg: Config{Image: testImage}, wantErr: "the manager URL is required"},
		"bad store secret":      {cfg: Config{Image: testImage, StoreSecret: "a/b", ManagerURL: testManagerURL}, wantErr: `store secret "a/b"`},
		"bad image pull policy": {cfg: Config{Image: testImage, ImagePullPolicy: "Sometimes", ManagerURL: testManagerURL}, wantErr: `image pull policy "Sometimes"`},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			if err := tc.cfg.Validate(); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("Validate() = %v, want an error containing %q", err, tc.wantErr)
			}
			pod := testPod(inject)
			if changed, err := Inject(pod, tc.cfg); err == nil || changed {
				t.Errorf("Inject() = (%v, %v), want an error and no change", changed, err)
			}
			if diff := cmp.Diff(testPod(inject), pod); diff != "" {
				t.Errorf("Inject() changed the pod (-want +got):\n%s", diff)
			}
		})
	}
}

func TestInjectCustomResources(t *testing.T) {
	res := corev1.ResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("50m")}}
	pod := testPod(inject)
	if _, err := Inject(pod, Config{Image: testImage, Resources: res, ImagePullPolicy: corev1.PullAlways, ManagerURL: testManagerURL}); err != nil {
		t.Fatalf("Inject() error = %v", err)
	}
	agent := pod.Spec.InitContainers[0]
	if diff := cmp.Diff(res, agent.Resources); diff != "" {
		t.Errorf("agent resources (-want +got):\n%s", diff)
	}
	if agent.ImagePullPolicy != corev1.PullAlways {
		t.Errorf("agent imagePullPolicy = %q, want Always", agent.ImagePullPolicy)
	}
}

// The exported contract constants must agree with each other.
func TestAgentContract(t *testing.T) {
	if want := "http://127.0.0.1:" + strconv.Itoa(AgentAPIPort); settings.AgentURL != want {
		t.Errorf("settings.AgentURL = %q, want %q", settings.AgentURL, want)
	}
}
