package registry

// The testing entry point: a registry for one test (ForTest).

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/plinth-storage/plinth/test/framework/process"
	"github.com/plinth-storage/plinth/test/prereq"
)

// ForTest starts a docker-registry on a free loopback port with its storage in a temporary
// folder, and stops it in t.Cleanup; when t fails, the tail of its log is logged. A missing
// docker-registry skips t, or fails it under CI=true or PLINTH_INTEGRATION=1 (prereq).
func ForTest(t testing.TB) *Server {
	t.Helper()
	if _, err := os.Stat(DefaultBinary); err != nil {
		prereq.Missing(t, "%s (Debian package docker-registry, hack/install-deps.sh): %v", DefaultBinary, err)
	}
	dir := filepath.Join(t.TempDir(), "registry")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s, err := StartServer(t.Context(), ServerOptions{Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("docker-registry on %s", s.Addr)
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- docker-registry log %s, last lines:\n%s", s.LogPath(), process.Indent(s.Tail(40)))
		}
		if err := s.Stop(); err != nil {
			t.Errorf("stop docker-registry: %v", err)
		}
	})
	return s
}
