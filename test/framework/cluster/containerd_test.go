package cluster

import (
	"context"
	"github.com/plinth-storage/plinth/test/prereq"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// requireNodePrerequisites skips t outside integration runs and, inside one
// (PLINTH_INTEGRATION=1 or CI=true), fails it naming what is missing: root,
// a Debian package.
func requireNodePrerequisites(t *testing.T) {
	t.Helper()
	prereq.Env(t, prereq.EnvIntegration, "a node integration test (root, containerd, runc, containernetworking-plugins): make test-integration sets it")
	if err := CheckHost(); err != nil {
		t.Fatalf("node prerequisites: %v", err)
	}
}

func TestContainerdStartImportStop(t *testing.T) {
	requireNodePrerequisites(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	dir := t.TempDir()
	c, err := StartContainerd(ctx, ContainerdOptions{Name: "ctr-test", Dir: filepath.Join(dir, "containerd")})
	if err != nil {
		t.Fatal(err)
	}
	pid := c.PID()
	images, err := c.Images(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(images) != 0 {
		t.Errorf("a new containerd has images: %v", images)
	}
	if err := c.Import(ctx, filepath.Join(dir, "missing.tar")); err == nil || !strings.Contains(err.Error(), "ctr-test") {
		t.Errorf("Import of a missing archive: want an error naming the node, got %v", err)
	}
	if err := c.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); err == nil {
		t.Errorf("containerd pid %d still runs after Stop", pid)
	}
	if _, err := os.Stat(c.Socket); err == nil {
		// containerd removes its sockets on a clean exit.
		t.Errorf("socket %s left after Stop", c.Socket)
	}
}

func TestContainerdStartFailureNamesNode(t *testing.T) {
	requireNodePrerequisites(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	dir := t.TempDir()
	// A file where containerd wants its root folder: it exits at start.
	bad := filepath.Join(dir, "c")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bad, "config.toml"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	_, err := StartContainerd(ctx, ContainerdOptions{Name: "broken-node", Dir: bad, Binary: "/bin/false", StartTimeout: 10 * time.Second})
	if err == nil {
		t.Fatal("containerd that exits at start: no error")
	}
	for _, want := range []string{"broken-node", "containerd", "last lines of"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not contain %q", err, want)
		}
	}
}
