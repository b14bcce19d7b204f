// Package agentbuild builds the lease agent (cmd/agent) as the image ships it, for the tests
// and benchmarks that run it as a process of its own.
package agentbuild

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// Tags are the agent's build tags, in the Dockerfile and the Makefile as here.
// nethttpomithttp2 leaves HTTP/2 out of net/http: the agent serves the pod's containers and
// calls the manager over HTTP/1.1 only, and the HTTP/2 code was half a MiB of its binary and
// of its resident memory (docs/figures.md, "Agent footprint").
const Tags = "nethttpomithttp2"

// Build builds the agent of the module at root into dir (dir/agent) with extra go build
// flags, and returns the binary's path.
func Build(goTool, root, dir string, env []string, flags ...string) (string, error) {
	args := append([]string{"build", "-tags", Tags}, flags...)
	args = append(args, "-o", dir+string(filepath.Separator), "./cmd/agent")
	cmd := exec.Command(goTool, args...)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go %v: %w\n%s", args, err, out)
	}
	return filepath.Join(dir, "agent"), nil
}
