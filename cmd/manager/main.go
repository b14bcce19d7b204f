// Command manager is the lease operator: definitions controller, pod watch, sweeps,
// revocation dispatch, admission HTTP API, live API and the webhooks (sidecar injection, pod
// admission). The lease agent that the webhook injects is its own binary (cmd/agent), in the
// same image; `manager agent …`, what pods injected by an earlier version run, starts it.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"syscall"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "manager" {
		args = args[1:]
	}
	if len(args) > 0 && args[0] == "agent" {
		// Pods injected by an earlier version run `manager agent …` from this image: the
		// agent is its own binary beside this one (cmd/agent).
		fmt.Fprintf(os.Stderr, "manager: %v\n", execAgent(args[1:]))
		os.Exit(1)
	}
	if err := runManager(args); err != nil {
		fmt.Fprintf(os.Stderr, "manager: %v\n", err)
		os.Exit(1)
	}
}

// execAgent replaces the process with the agent binary next to this one.
func execAgent(args []string) error {
	self, err := os.Executable()
	if err != nil {
		return fmt.Errorf("finding the agent binary: %w", err)
	}
	bin := filepath.Join(filepath.Dir(self), "agent")
	return fmt.Errorf("running %s: %w", bin, syscall.Exec(bin, append([]string{bin}, args...), os.Environ()))
}

// parse parses args with zap's flags added and installs the logger.
func parse(fs *flag.FlagSet, args []string) error {
	opts := zap.Options{Development: false}
	opts.BindFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctrl.SetLogger(zap.New(zap.UseFlagOptions(&opts)))
	return nil
}
