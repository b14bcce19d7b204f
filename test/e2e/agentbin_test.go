package e2e

import (
	"os/exec"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
)

var _ = Describe("The agent binary", func() {
	It("is what `manager agent` starts, as pods injected by an earlier version run it", func() {
		// -h: the agent prints its own flags and stops, reaching neither store nor manager.
		out, _ := exec.Command(managerBin, "agent", "-h").CombinedOutput()
		Expect(string(out)).To(ContainSubstring("-manager-url"), "the agent's flags")
		Expect(string(out)).To(ContainSubstring("-log-level"), "a flag only the agent binary has")
		Expect(string(out)).NotTo(ContainSubstring("-leader-elect"), "the manager's own flags")
	})
})
