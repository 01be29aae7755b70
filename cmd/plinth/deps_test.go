package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// The plinth binary runs on every storage node; it links product code only. The lab (the dev
// loop, the test control plane and real nodes, image builds: everything under test/) and the
// Prometheus HTTP API client it queries Prometheus with stay out of its import graph
// (docs/design.md#layout-and-boundaries). client_golang's metrics registry is product and stays.

// forbiddenPrefixes are import path prefixes that must not appear among the binary's deps.
var forbiddenPrefixes = []string{
	"github.com/plinth-storage/plinth/test/",
	"github.com/prometheus/client_golang/api",
	"gonum.org/",
}

// forbiddenDeps returns the packages of deps that match forbiddenPrefixes.
func forbiddenDeps(deps []string) []string {
	var bad []string
	for _, p := range deps {
		for _, prefix := range forbiddenPrefixes {
			if strings.HasPrefix(p, prefix) {
				bad = append(bad, p)
				break
			}
		}
	}
	return bad
}

// listDeps returns the import paths `go list -deps` gives for the package at dir, relative to
// this package's folder. A missing go command fails t: the check must not pass by not running.
func listDeps(t *testing.T, dir string) []string {
	t.Helper()
	goCmd, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go command is needed to list the plinth binary's packages: %v", err)
	}
	cmd := exec.Command(goCmd, "list", "-deps", "-f", "{{.ImportPath}}", dir)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list -deps %s: %v\n%s", dir, err, stderr)
	}
	return strings.Fields(string(out))
}

// TestBinaryLinksNoHarness fails when `go list -deps ./cmd/plinth` names a package of the test
// framework or the Prometheus HTTP API client.
func TestBinaryLinksNoHarness(t *testing.T) {
	deps := listDeps(t, ".")
	// The list is the real one: it holds this command and the parts it runs.
	for _, want := range []string{
		"github.com/plinth-storage/plinth/cmd/plinth",
		"github.com/plinth-storage/plinth/agents/agent",
		"github.com/plinth-storage/plinth/csi",
		"github.com/prometheus/client_golang/prometheus",
	} {
		if !slices.Contains(deps, want) {
			t.Fatalf("go list -deps ./cmd/plinth does not name %s (%d packages listed)", want, len(deps))
		}
	}
	if bad := forbiddenDeps(deps); len(bad) > 0 {
		t.Errorf("the plinth binary links %d lab packages (move the import behind test/framework/cmd/plinth-dev or a test file):\n  %s",
			len(bad), strings.Join(bad, "\n  "))
	}
}

// TestHarnessCheckFindsPlinthDev runs the same check on plinth-dev, which links the whole test
// framework, so the check is shown to see a harness package where there is one.
func TestHarnessCheckFindsPlinthDev(t *testing.T) {
	bad := forbiddenDeps(listDeps(t, "../../test/framework/cmd/plinth-dev"))
	for _, want := range []string{
		"github.com/plinth-storage/plinth/test/framework/devenv",
		"github.com/plinth-storage/plinth/test/framework/controlplane",
		"github.com/prometheus/client_golang/api",
	} {
		if !slices.Contains(bad, want) {
			t.Errorf("the check does not report %s among plinth-dev's packages; it reported %d: %v", want, len(bad), bad)
		}
	}
}
