package main

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// plinthOutErr runs the command line as main does and returns the exit status, stdout and
// stderr.
func plinthOutErr(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	root := newRootCommand()
	var out, errOut bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&errOut)
	root.SetArgs(args)
	err := root.Execute()
	var ee *exitError
	switch {
	case err == nil:
		code = exitOK
	case errors.As(err, &ee):
		code = ee.code
	default:
		code = exitUsage
	}
	return code, out.String(), errOut.String()
}

// TestRenderWarnsUnmatchedPool: a pool whose nodeSelector matches no node of the inventory is
// named on stderr (it renders no Store); the output and the exit status stay those of a
// successful render, and a pool that matches draws no warning.
func TestRenderWarnsUnmatchedPool(t *testing.T) {
	const td = "../../controllers/diff/testdata/"
	onlyFast := filepath.Join(t.TempDir(), "nodes.yaml")
	if err := os.WriteFile(onlyFast, []byte(`apiVersion: v1
kind: List
items:
- apiVersion: v1
  kind: Node
  metadata:
    name: node-a
    labels: {plinth.dev/storage: fast}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := plinthOutErr(t, "render", td+"live/base", "--nodes", onlyFast)
	if code != exitOK || !strings.Contains(out, "kind: Store") {
		t.Fatalf("exit %d, stdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	want := "plinth: warning: StoragePool thin: no node matches its nodeSelector plinth.dev/storage=thin"
	if strings.Count(errOut, "warning:") != 1 || !strings.Contains(errOut, want) {
		t.Errorf("stderr %q, want one warning %q", errOut, want)
	}
	code, _, errOut = plinthOutErr(t, "render", td+"live/base", "--nodes", td+"nodes.yaml")
	if code != exitOK || errOut != "" {
		t.Errorf("every pool matched: exit %d, stderr %q, want 0 and nothing", code, errOut)
	}
}

// render and diff of a folder that holds several overlays (the policy repository) refuse it,
// naming the overlays, instead of reading them as one set full of duplicates.
func TestRenderRefusesSeveralOverlays(t *testing.T) {
	const nodes = "../../controllers/diff/testdata/nodes.yaml"
	for _, args := range [][]string{
		{"render", "../../policies", "--nodes", nodes},
		{"diff", "../../policies", "--against", "../../policies/clusters/staging", "--nodes", nodes},
	} {
		code, out, _ := plinthOutErr(t, args...)
		if code != exitUsage || out != "" {
			t.Errorf("plinth %v: exit %d, stdout %q; want %d and nothing", args, code, out, exitUsage)
		}
		err := runErr(t, args...)
		for _, want := range []string{"../../policies holds 2 overlays", "policies/clusters/production", "policies/clusters/staging"} {
			if !strings.Contains(err, want) {
				t.Errorf("plinth %v: error %q lacks %q", args, err, want)
			}
		}
	}
	if code, _, errOut := plinthOutErr(t, "render", "../../policies/clusters/staging", "--nodes", nodes); code != exitOK {
		t.Errorf("one overlay: exit %d, stderr %s", code, errOut)
	}
}

// runErr runs the command line and returns the error main would print.
func runErr(t *testing.T, args ...string) string {
	t.Helper()
	root := newRootCommand()
	root.SetOut(&bytes.Buffer{})
	root.SetErr(&bytes.Buffer{})
	root.SetArgs(args)
	if err := root.Execute(); err != nil {
		return err.Error()
	}
	return ""
}
