package inject

import (
	"os"
	"strings"
	"testing"
)

// TestImagesCarryTheAgentWhereTheWebhookRunsIt reads the Dockerfile: the default image (its
// last stage) and the agent's own (target agent) must both put the agent binary where the
// injected container's command runs it, so that --agent-image may name either.
func TestImagesCarryTheAgentWhereTheWebhookRunsIt(t *testing.T) {
	raw, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	// Stages in order, each with its FROM line and its instructions.
	var stages [][]string
	for _, line := range strings.Split(string(raw), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.HasPrefix(line, "FROM ") {
			stages = append(stages, nil)
		}
		if len(stages) > 0 {
			stages[len(stages)-1] = append(stages[len(stages)-1], line)
		}
	}
	if len(stages) < 2 {
		t.Fatalf("the Dockerfile has %d stages, want a builder and the images", len(stages))
	}
	copiesAgent := func(stage []string) bool {
		for _, l := range stage {
			f := strings.Fields(l)
			if len(f) >= 3 && f[0] == "COPY" && strings.HasPrefix(f[1], "--from=builder") {
				dst := f[len(f)-1]
				for _, src := range f[2 : len(f)-1] {
					if strings.HasSuffix(src, "/agent") && (dst == "/" || dst == AgentBinary) {
						return true
					}
				}
			}
		}
		return false
	}
	if last := stages[len(stages)-1]; !copiesAgent(last) {
		t.Errorf("the default image (%s) has no %s", last[0], AgentBinary)
	}
	found := false
	for _, st := range stages {
		if strings.HasSuffix(st[0], " AS agent") {
			found = true
			if !copiesAgent(st) {
				t.Errorf("the agent's image (%s) has no %s", st[0], AgentBinary)
			}
			if !strings.Contains(strings.Join(st, "\n"), `ENTRYPOINT ["`+AgentBinary+`"]`) {
				t.Errorf("the agent's image does not run %s", AgentBinary)
			}
		}
	}
	if !found {
		t.Error("the Dockerfile has no stage AS agent (the agent's own image)")
	}
}
