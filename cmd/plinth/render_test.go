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
