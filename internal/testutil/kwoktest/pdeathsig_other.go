//go:build !linux

package kwoktest

import "os/exec"

// dieWithParent: only Linux has a parent-death signal; elsewhere Stop is the only way out.
func dieWithParent(*exec.Cmd) {}
