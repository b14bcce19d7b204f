package main

import (
	"context"
	"flag"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/vancetope/lease-operator/internal/inject"
	"github.com/vancetope/lease-operator/internal/settings"
)

// runAgents is `devcluster agents`: under kwok no container runs, so the agent the webhook
// injects into a pod would never start. This runs it for every injected pod (label
// lease.vancetope.io/agent) that is Running with an address, as a local process on the pod's
// address, as the container would on the pod's: its API on <pod IP>:8090 (in a pod,
// 127.0.0.1:8090), its internal port on <pod IP>:8091, its calls to the manager from the pod's
// address (--manager-source-ip), with the pod's identity and the environment the webhook gave
// the container. It stops the agent when the pod stops or goes.
func runAgents(args []string) error {
	fs := flag.NewFlagSet("agents", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", os.Getenv("KUBECONFIG"), "the cluster's kubeconfig")
	bin := fs.String("agent-bin", filepath.Join("bin", "agent"), "the agent binary")
	uri := fs.String("mongodb-uri", os.Getenv(settings.EnvMongoURI), "the store (in a pod it comes from the namespace's store Secret)")
	logs := fs.String("log-dir", os.TempDir(), "where each agent's log goes (agent-<namespace>-<pod>.log)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		return err
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	running := map[string]*agentProc{} // by pod UID
	defer func() {
		for _, p := range running {
			p.stop()
		}
		for _, p := range running {
			<-p.done
		}
	}()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.HasLabels{inject.LabelAgent}); err != nil && ctx.Err() == nil {
			fmt.Fprintln(os.Stderr, "devcluster agents: listing pods:", err)
		}
		live := map[string]bool{}
		for i := range pods.Items {
			pod := &pods.Items[i]
			if !agentDue(pod) {
				continue
			}
			uid := string(pod.UID)
			live[uid] = true
			if running[uid] != nil {
				continue
			}
			p, err := startAgent(pod, *bin, *uri, *logs)
			if err != nil {
				fmt.Fprintf(os.Stderr, "devcluster agents: %s/%s: %v\n", pod.Namespace, pod.Name, err)
				continue
			}
			running[uid] = p
			fmt.Printf("devcluster agents: the agent of %s/%s runs on %s (log %s)\n", pod.Namespace, pod.Name,
				net.JoinHostPort(pod.Status.PodIP, strconv.Itoa(inject.AgentAPIPort)), agentLog(*logs, pod))
		}
		for uid, p := range running {
			if !live[uid] {
				p.stop()
				delete(running, uid)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// agentDue reports whether the pod's agent should run: the pod is Running with an address and
// is not being deleted.
func agentDue(pod *corev1.Pod) bool {
	return pod.Status.Phase == corev1.PodRunning && pod.Status.PodIP != "" && pod.DeletionTimestamp == nil
}

func agentLog(dir string, pod *corev1.Pod) string {
	return filepath.Join(dir, fmt.Sprintf("agent-%s-%s.log", pod.Namespace, pod.Name))
}

// agentEnv is the environment of pod's agent: the literal values the webhook wrote into its
// container (the manager's URL, the namespace's agent key, the database), the pod's identity,
// and uri as MONGODB_URI, which the container reads from a Secret.
func agentEnv(pod *corev1.Pod, uri string) ([]string, error) {
	for _, c := range pod.Spec.InitContainers {
		if c.Name != inject.AgentContainerName {
			continue
		}
		var env []string
		for _, e := range c.Env {
			if e.ValueFrom == nil {
				env = append(env, e.Name+"="+e.Value)
			}
		}
		return append(env, settings.EnvMongoURI+"="+uri, settings.EnvPodNamespace+"="+pod.Namespace,
			settings.EnvPodName+"="+pod.Name, settings.EnvPodUID+"="+string(pod.UID),
			settings.EnvPodIP+"="+pod.Status.PodIP), nil
	}
	return nil, fmt.Errorf("no %s container", inject.AgentContainerName)
}

// agentProc is a running agent; done is closed once it exited.
type agentProc struct {
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *agentProc) stop() { _ = p.cmd.Process.Signal(os.Interrupt) }

// startAgent starts the agent of pod with the environment the webhook gave its container
// (its literal values: the manager's URL, the namespace's agent key, the database) and the
// pod's identity; MONGODB_URI, which the container reads from a Secret, is uri.
func startAgent(pod *corev1.Pod, bin, uri, logs string) (*agentProc, error) {
	env, err := agentEnv(pod, uri)
	if err != nil {
		return nil, err
	}
	ip := pod.Status.PodIP
	log, err := os.Create(agentLog(logs, pod))
	if err != nil {
		return nil, err
	}
	p := exec.Command(bin,
		"--api-bind-address", net.JoinHostPort(ip, strconv.Itoa(inject.AgentAPIPort)),
		"--internal-bind-address", net.JoinHostPort(ip, strconv.Itoa(inject.AgentInternalPort)),
		"--manager-source-ip", ip)
	p.Env, p.Stdout, p.Stderr = append(os.Environ(), env...), log, log
	if err := p.Start(); err != nil {
		_ = log.Close()
		return nil, err
	}
	a := &agentProc{cmd: p, done: make(chan struct{})}
	go func() { _ = p.Wait(); _ = log.Close(); close(a.done) }()
	return a, nil
}
