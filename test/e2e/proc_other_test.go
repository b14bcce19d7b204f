//go:build !linux

package e2e

import "os/exec"

// dieWithParent is a no-op where there is no parent-death signal: AfterSuite stops the
// children, and a test binary that dies leaves them to the operating system.
func dieWithParent(*exec.Cmd) {}
