// Package kwoktest makes pods run on a local control plane that has no nodes (envtest's
// kube-apiserver and etcd): it starts kwok (sigs.k8s.io/kwok, built and cached by
// hack/kwok-bin.sh) against it, creates one node that kwok keeps Ready, and binds every pod
// without a node to that node, as a scheduler would. kwok then plays the kubelet: a bound pod
// becomes Running and Ready with an IP from the node's pod CIDR, a pod owned by a Job completes
// (Succeeded), a deleted pod goes away. No container runs.
//
// The pod CIDR is on loopback (DefaultPodCIDR), so that a test can send from a pod's IP (a
// dialer bound to it, curl --interface) and the manager, which knows callers by their source
// address, sees that pod. Linux routes all of 127.0.0.0/8 to the loopback interface; no
// address needs adding.
//
//	k, err := kwoktest.Start(ctx, cfg, kwoktest.Options{})
//	...
//	defer k.Stop()
//
// docs/testing.md#pods-that-run has the stages and flags kwok runs with, and why.
package kwoktest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/vancetope/lease-operator/internal/testutil/mongotest"
)

const (
	// EnvBin names the kwok binary; unset, Binary runs hack/kwok-bin.sh for it.
	EnvBin = "KWOK_BIN"
	// EnvStages names kwok's stage file; unset, it is stages.yaml next to the binary, where
	// hack/kwok-bin.sh assembles it.
	EnvStages = "KWOK_STAGES"

	// NodeAnnotation marks the nodes kwok manages (--manage-nodes-with-annotation-selector),
	// with the value NodeAnnotationValue; kwok's own convention.
	NodeAnnotation = "kwok.x-k8s.io/node"
	// NodeAnnotationValue is NodeAnnotation's value on a node kwok manages.
	NodeAnnotationValue = "fake"
	// DefaultNodeName is the name of the node Start creates.
	DefaultNodeName = "kwok-node-0"
	// DefaultPodCIDR gives pods 127.1.0.1, 127.1.0.2, ...: loopback addresses this host can
	// send from, clear of 127.0.0.1 (the host itself, where make run's curl and the
	// processes of the suites call from) and of the 127.0.0.x addresses the suites give
	// their hand-made pods.
	DefaultPodCIDR = "127.1.0.0/16"
	// NodeIP is the node's InternalIP, and so the IP of hostNetwork pods: the node is this
	// host.
	NodeIP = "127.0.0.1"

	// DefaultStartTimeout bounds the wait for the node to become Ready.
	DefaultStartTimeout = time.Minute
	stopTimeout         = 10 * time.Second
	logTail             = 4 << 10
)

// Options of Start; the zero value is the default.
type Options struct {
	// NodeName is the node's name (default DefaultNodeName).
	NodeName string
	// PodCIDR is the node's pod CIDR, whence the pods' IPs (default DefaultPodCIDR).
	PodCIDR string
	// Bin is the kwok binary (default Binary()).
	Bin string
	// Stages is kwok's stage file (default $KWOK_STAGES, else stages.yaml next to Bin).
	Stages string
	// StartTimeout bounds the wait for the node to become Ready (default
	// DefaultStartTimeout).
	StartTimeout time.Duration
	// Dir is where kwok's kubeconfig and its log, kwok.log, go (default a temporary
	// directory, removed by Stop).
	Dir string
}

// Cluster is a running kwok and binder.
type Cluster struct {
	// NodeName is the node pods are bound to.
	NodeName string
	// PodCIDR is that node's pod CIDR.
	PodCIDR string
	// Dir holds kwok's kubeconfig and its log, kwok.log.
	Dir string
	// removeDir: Dir is Start's own temporary directory.
	removeDir bool
	// Startup is how long Start took from launching kwok to the node's being Ready.
	Startup time.Duration

	cmd        *exec.Cmd
	exited     chan struct{} // closed when kwok has exited
	waitErr    error         // set before exited is closed
	stopBinder context.CancelFunc
	binderDone chan struct{}
	stopOnce   sync.Once
	stopErr    error
}

// Binary returns the kwok binary: $KWOK_BIN, else what hack/kwok-bin.sh prints (building it
// on first use, about 5 minutes on 2 cores).
func Binary() (string, error) {
	if bin := os.Getenv(EnvBin); bin != "" {
		return bin, nil
	}
	root, err := mongotest.RepoRoot()
	if err != nil {
		return "", err
	}
	var stderr bytes.Buffer
	cmd := exec.Command(filepath.Join(root, "hack", "kwok-bin.sh"))
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return "", fmt.Errorf("hack/kwok-bin.sh: %w: %s", err, stderr.String())
	}
	return strings.TrimSpace(string(out)), nil
}

// Start starts kwok against the control plane of cfg (an administrator's), creates its node
// and starts the binder, and returns once the node is Ready. The caller must Stop it.
func Start(ctx context.Context, cfg *rest.Config, opts Options) (*Cluster, error) {
	if opts.NodeName == "" {
		opts.NodeName = DefaultNodeName
	}
	if opts.PodCIDR == "" {
		opts.PodCIDR = DefaultPodCIDR
	}
	if opts.StartTimeout == 0 {
		opts.StartTimeout = DefaultStartTimeout
	}
	if opts.Bin == "" {
		bin, err := Binary()
		if err != nil {
			return nil, err
		}
		opts.Bin = bin
	}
	if opts.Stages == "" {
		opts.Stages = os.Getenv(EnvStages)
	}
	if opts.Stages == "" {
		opts.Stages = filepath.Join(filepath.Dir(opts.Bin), "stages.yaml")
	}
	if _, err := os.Stat(opts.Stages); err != nil {
		return nil, fmt.Errorf("kwok's stage file (hack/kwok-bin.sh writes it): %w", err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("creating a clientset: %w", err)
	}
	dir, removeDir := opts.Dir, false
	if dir == "" {
		if dir, err = os.MkdirTemp("", "kwoktest-"); err != nil {
			return nil, err
		}
		removeDir = true
	} else if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := writeKubeconfig(kubeconfig, cfg); err != nil {
		return nil, err
	}
	if err := createNode(ctx, cs, opts.NodeName, opts.PodCIDR); err != nil {
		return nil, err
	}

	c := &Cluster{NodeName: opts.NodeName, PodCIDR: opts.PodCIDR, Dir: dir, removeDir: removeDir, exited: make(chan struct{})}
	begin := time.Now()
	if err := c.startKwok(opts, kubeconfig); err != nil {
		return nil, err
	}
	binderCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	c.stopBinder, c.binderDone = cancel, make(chan struct{})
	go func() {
		defer close(c.binderDone)
		runBinder(binderCtx, cs, opts.NodeName)
	}()
	if err := c.awaitNodeReady(ctx, cs, opts.StartTimeout); err != nil {
		return nil, errors.Join(err, c.Stop())
	}
	c.Startup = time.Since(begin)
	return c, nil
}

// startKwok launches kwok with the stage file, managing the nodes annotated NodeAnnotation.
func (c *Cluster) startKwok(opts Options, kubeconfig string) error {
	logFile, err := os.Create(filepath.Join(c.Dir, "kwok.log"))
	if err != nil {
		return err
	}
	defer func() { _ = logFile.Close() }() // the child has its copy
	c.cmd = exec.Command(opts.Bin,
		"--kubeconfig", kubeconfig,
		"--config", opts.Stages,
		"--manage-nodes-with-annotation-selector", NodeAnnotation+"="+NodeAnnotationValue,
		// The node's pod CIDR takes precedence; this is kwok's fallback for a node without one.
		"--cidr", opts.PodCIDR,
		"--node-ip", NodeIP,
		// Renew the node's Lease (kube-node-lease) as a kubelet does, with the kubelet's
		// default duration; the stage file's heartbeat refreshes the conditions in between.
		// kwok's own default, 0, keeps no Lease.
		"--node-lease-duration-seconds", "40",
	)
	c.cmd.Env = kwokEnv(os.Environ(), filepath.Join(c.Dir, "workdir"))
	c.cmd.Stdout, c.cmd.Stderr = logFile, logFile
	dieWithParent(c.cmd)
	if err := c.cmd.Start(); err != nil {
		return fmt.Errorf("starting kwok: %w", err)
	}
	go func() {
		c.waitErr = c.cmd.Wait()
		close(c.exited)
	}()
	return nil
}

// kwokEnv is kwok's environment: this process's without the KWOK_ variables, which kwok reads
// as settings (this repository's KWOK_BIN, KWOK_VERSION, ... are not meant for it), and with a
// work directory of its own, since kwok reads ~/.kwok/kwok.yaml, if there is one, before
// --config: a developer's kwok settings stay out.
func kwokEnv(environ []string, workDir string) []string {
	env := make([]string, 0, len(environ)+1)
	for _, kv := range environ {
		if !strings.HasPrefix(kv, "KWOK_") {
			env = append(env, kv)
		}
	}
	return append(env, "KWOK_WORKDIR="+workDir)
}

// awaitNodeReady waits until the node's Ready condition is True, or kwok exits.
func (c *Cluster) awaitNodeReady(ctx context.Context, cs kubernetes.Interface, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	err := wait.PollUntilContextCancel(ctx, 50*time.Millisecond, true, func(ctx context.Context) (bool, error) {
		select {
		case <-c.exited:
			return false, fmt.Errorf("kwok exited: %v", c.waitErr)
		default:
		}
		node, err := cs.CoreV1().Nodes().Get(ctx, c.NodeName, metav1.GetOptions{})
		// An error is polled again: the node may not be readable yet; the timeout reports it.
		return err == nil && nodeReady(node), nil
	})
	if err != nil {
		return fmt.Errorf("waiting for node %s to become Ready: %w; kwok's log ends: %s", c.NodeName, err, c.logTail())
	}
	return nil
}

// Stop stops the binder and kwok. The node and the pods stay as they are.
func (c *Cluster) Stop() error {
	c.stopOnce.Do(func() {
		if c.stopBinder != nil {
			c.stopBinder()
			<-c.binderDone
		}
		c.stopErr = c.stopKwok()
		if c.removeDir {
			c.stopErr = errors.Join(c.stopErr, os.RemoveAll(c.Dir))
		}
	})
	return c.stopErr
}

func (c *Cluster) stopKwok() error {
	select {
	case <-c.exited:
		return nil
	default:
	}
	if err := terminate(c.cmd.Process); err != nil {
		return fmt.Errorf("stopping kwok: %w", err)
	}
	select {
	case <-c.exited:
		return nil
	case <-time.After(stopTimeout):
		if err := c.cmd.Process.Kill(); err != nil {
			return fmt.Errorf("killing kwok: %w", err)
		}
		<-c.exited
		return fmt.Errorf("kwok did not stop within %v; killed", stopTimeout)
	}
}

// logTail returns the end of kwok's log, for errors.
func (c *Cluster) logTail() string {
	data, err := os.ReadFile(filepath.Join(c.Dir, "kwok.log"))
	if err != nil {
		return err.Error()
	}
	if len(data) > logTail {
		data = data[len(data)-logTail:]
	}
	return string(data)
}

// createNode creates the node kwok manages; one left by an earlier Start is kept.
func createNode(ctx context.Context, cs kubernetes.Interface, name, podCIDR string) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{NodeAnnotation: NodeAnnotationValue},
			Labels:      map[string]string{corev1.LabelHostname: name, "type": "kwok"},
		},
		Spec: corev1.NodeSpec{PodCIDR: podCIDR, PodCIDRs: []string{podCIDR}},
	}
	_, err := cs.CoreV1().Nodes().Create(ctx, node, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating node %s: %w", name, err)
	}
	return nil
}

func nodeReady(node *corev1.Node) bool {
	for _, c := range node.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// writeKubeconfig renders cfg (client certificate or bearer token, as files or inline) as a
// kubeconfig file for kwok.
func writeKubeconfig(path string, cfg *rest.Config) error {
	const name = "kwoktest"
	kc := clientcmdapi.NewConfig()
	kc.Clusters[name] = &clientcmdapi.Cluster{
		Server:                   cfg.Host,
		CertificateAuthority:     cfg.CAFile,
		CertificateAuthorityData: cfg.CAData,
		InsecureSkipTLSVerify:    cfg.Insecure,
	}
	kc.AuthInfos[name] = &clientcmdapi.AuthInfo{
		ClientCertificate:     cfg.CertFile,
		ClientCertificateData: cfg.CertData,
		ClientKey:             cfg.KeyFile,
		ClientKeyData:         cfg.KeyData,
		Token:                 cfg.BearerToken,
		TokenFile:             cfg.BearerTokenFile,
		Username:              cfg.Username,
		Password:              cfg.Password,
	}
	kc.Contexts[name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name}
	kc.CurrentContext = name
	if err := clientcmd.WriteToFile(*kc, path); err != nil {
		return fmt.Errorf("writing kwok's kubeconfig: %w", err)
	}
	return nil
}

// Version is the kwok version hack/kwok-bin.sh builds, into
// ${XDG_CACHE_HOME:-~/.cache}/lease-operator/kwok/v<Version>. Keep it in step with the script.
const Version = "0.8.0"

// BinaryOrSkip returns $KWOK_BIN, else the binary hack/kwok-bin.sh has built, else skips the
// test with the command that builds it (fails it in CI, CI=true, whose .ci/run builds kwok
// first). `make test` always sets KWOK_BIN, building kwok if needed. Tests call it rather
// than Binary, so that a plain `go test` does not start a 5-minute build.
func BinaryOrSkip(t interface {
	Skip(args ...any)
	Fatal(args ...any)
}) string {
	if bin := os.Getenv(EnvBin); bin != "" {
		return bin
	}
	hint := "run the tests with `make test`, or " + EnvBin + "=$(hack/kwok-bin.sh) go test ./..."
	cache, err := os.UserCacheDir()
	if err == nil {
		bin := filepath.Join(cache, "lease-operator", "kwok", "v"+Version, "kwok")
		if _, err = os.Stat(bin); err == nil {
			return bin
		}
	}
	msg := fmt.Sprintf("%s is unset and kwok is not built (%v); %s", EnvBin, err, hint)
	if os.Getenv("CI") == "true" {
		t.Fatal(msg)
	}
	t.Skip(msg)
	return ""
}
