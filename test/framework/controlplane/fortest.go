package controlplane

import (
	"context"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/test/framework/process"
	"github.com/plinth-storage/plinth/test/prereq"
)

// RequireBinaries skips t when a named test binary is missing, with a message
// saying how to build it, or fails t under CI=true or PLINTH_INTEGRATION=1
// (prereq.Strict: there a missing binary is a broken build, not an excuse).
func RequireBinaries(t testing.TB, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := BinaryPath("", n); err != nil {
			skipOrFail(t, err)
		}
	}
}

func skipOrFail(t testing.TB, err error) {
	t.Helper()
	prereq.Missing(t, "test binary: %v (make testbin builds it)", err)
}

// ForTest starts a control plane for t and stops it in t.Cleanup. Missing
// binaries skip or fail t as RequireBinaries does. When t fails, the tail of
// every process's log is logged and a temporary Dir is kept for reading.
func ForTest(t testing.TB, opts Options) *ControlPlane {
	t.Helper()
	need := []string{BinEtcd, BinKubeAPIServer}
	if opts.ControllerManager {
		need = append(need, BinKubeControllerManager)
	}
	RequireBinaries(t, need...)
	ctx := context.Background()
	if d, ok := t.(interface{ Context() context.Context }); ok {
		ctx = d.Context()
	}
	cp, err := Start(ctx, opts)
	if err != nil {
		if IsMissingBinary(err) {
			skipOrFail(t, err)
		}
		t.Fatalf("start control plane: %v", err)
	}
	t.Logf("control plane %s ready in %s", cp.URL, cp.StartDuration.Round(1e6))
	t.Cleanup(func() {
		if t.Failed() {
			for _, p := range cp.Processes() {
				t.Logf("--- %s (pid %d) log %s, last lines:\n%s", p.Name, p.PID(), p.LogPath, process.Indent(p.Tail(40)))
			}
			if cp.KeepDir() {
				t.Logf("control plane folder kept: %s", cp.Dir)
			}
		}
		if err := cp.Stop(); err != nil {
			t.Errorf("stop control plane: %v", err)
		}
	})
	return cp
}

// Eventually calls f every interval until it returns nil, and fails t with what and f's last
// error when timeout passes first. It is the wait of tests that watch controllers converge;
// the time taken is never asserted (benchmarks measure speed).
func Eventually(t testing.TB, timeout, interval time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		}
		time.Sleep(interval)
	}
}

// EnvImages names the folder of the image archives of `make images` when they
// are not under <test bin>/images.
const EnvImages = "PLINTH_IMAGES"

// ImageArchives returns the paths of the named archives of `make images`
// (<name>.tar) in $PLINTH_IMAGES, or <test bin>/images when it is unset; a
// missing archive fails t with how to build it.
func ImageArchives(t testing.TB, names ...string) []string {
	t.Helper()
	dir := os.Getenv(EnvImages)
	if dir == "" {
		bin, err := TestBinDir()
		if err != nil {
			t.Fatal(err)
		}
		dir = filepath.Join(bin, "images")
	}
	var out []string
	for _, name := range names {
		p := filepath.Join(dir, name+".tar")
		if _, err := os.Stat(p); err != nil {
			t.Fatalf("image archive %s missing (run `make images`, or set %s): %v", p, EnvImages, err)
		}
		out = append(out, p)
	}
	return out
}
