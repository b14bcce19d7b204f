//go:build linux

package e2e

import (
	"os/exec"
	"syscall"
)

// dieWithParent makes the kernel kill the child when the test binary dies (a panic, a
// `go test` timeout, SIGKILL), so that no manager or agent outlives the suite.
func dieWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
