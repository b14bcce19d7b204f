// Command kubectl-lease is the kubectl plugin `kubectl lease`: the operator's view of the
// lease system (holders, counters with drift, merged definitions) and its revocations. Put the
// binary on $PATH and run `kubectl lease --help`. The commands live in internal/cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/vancetope/lease-operator/internal/cli"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := cli.Run(ctx, os.Args[1:], cli.StdStreams())
	stop()
	os.Exit(code)
}
