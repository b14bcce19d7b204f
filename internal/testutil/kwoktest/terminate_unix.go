//go:build unix

package kwoktest

import (
	"os"
	"syscall"
)

// terminate asks kwok to shut down gracefully.
func terminate(p *os.Process) error { return p.Signal(syscall.SIGTERM) }
