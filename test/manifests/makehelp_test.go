package manifests

import (
	"os/exec"
	"strings"
	"testing"
)

// make help, read through a pipe (a CI log, less, grep), holds no terminal escape codes, marks
// the targets that need root and says how long a cold build takes.
func TestMakeHelp(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Fatalf("make: %v", err)
	}
	cmd := exec.Command("make", "--no-print-directory", "-C", "../..", "help")
	cmd.Env = append(cmd.Environ(), "NO_COLOR=")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("make help: %v\n%s", err, out)
	}
	help := string(out)
	if strings.Contains(help, "\x1b") {
		t.Errorf("make help writes escape codes into a pipe:\n%q", help)
	}
	root := map[string]bool{}
	for _, line := range strings.Split(help, "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[1] == "[root]" {
			root[f[0]] = true
		}
	}
	for _, target := range []string{"dev", "test", "test-e2e", "test-integration", "bench"} {
		if !root[target] {
			t.Errorf("make help does not mark %s as needing root", target)
		}
	}
	if root["build"] || root["generate"] {
		t.Errorf("make help marks build or generate as needing root: %v", root)
	}
	if !strings.Contains(help, "cold build") || !strings.Contains(help, "hours on 2 cores") {
		t.Errorf("make help does not say how long a cold build takes:\n%s", help)
	}
}
