//go:build !unix

package kwoktest

import "os"

// terminate: without SIGTERM, kill.
func terminate(p *os.Process) error { return p.Kill() }
