//go:build linux

package kwoktest

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel stop kwok when the process that started it dies (a panic, a
// `go test` timeout, SIGKILL), so that no kwok outlives its control plane's suite.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
