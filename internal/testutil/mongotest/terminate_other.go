//go:build !unix

package mongotest

import (
	"errors"
	"os"
)

// terminate is not available: the caller closes the process's stdin instead, which asks
// mongodev (started with --exit-on-stdin-eof) to shut down.
func terminate(*os.Process) error { return errors.New("no SIGTERM on this system") }
