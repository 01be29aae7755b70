// Package prereq is how a test says what it needs from the machine (root, the kernel's loop
// devices, a command, a built test binary). On a developer's machine a missing prerequisite
// skips the test, visibly; in CI (CI=true) and in the integration run (PLINTH_INTEGRATION=1) it
// fails the test with what is missing, because there a missing prerequisite is a broken machine
// or build, and a skip would hide every failure the test exists to catch.
//
// Gates that are skips by design (a guest suite that runs in another phase of make test) do not
// use this package: they skip, and test/tools/skipcheck's allow-list names each of them.
//
// The package is a leaf (standard library and x/sys only) so that every test package, the
// scheduler module's included, can import it.
package prereq

import (
	"fmt"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"
)

// EnvIntegration, when "1", makes missing prerequisites fail (make test-integration sets it).
const EnvIntegration = "PLINTH_INTEGRATION"

// EnvCI is set to "true" by CI systems; it makes missing prerequisites fail as EnvIntegration does.
const EnvCI = "CI"

// Strict reports whether a missing prerequisite fails the test: CI=true or PLINTH_INTEGRATION=1.
func Strict() bool {
	return os.Getenv(EnvCI) == "true" || os.Getenv(EnvIntegration) == "1"
}

// Missing stops t because a prerequisite is missing: t.Fatal under Strict, else t.Skip. The
// message (format and args, as fmt.Sprintf) names what is missing and how to get it.
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	what := fmt.Sprintf(format, args...)
	if Strict() {
		t.Fatalf("missing prerequisite: %s (%s=true or %s=1: a missing prerequisite fails)", what, EnvCI, EnvIntegration)
		return
	}
	t.Skipf("SKIP: missing prerequisite: %s (set %s=1 to make this a failure)", what, EnvIntegration)
}

// Root requires the effective user to be root; why says what the test does with it.
func Root(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Missing(t, "root (uid 0, running as %d): %s", os.Geteuid(), why)
	}
}

// LoopControl requires root and a usable /dev/loop-control (the kernel's loop driver, see
// loop(4)): what the file backend and the host's mount tests attach their images with.
func LoopControl(t testing.TB) {
	t.Helper()
	Root(t, "loop devices")
	fd, err := unix.Open("/dev/loop-control", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		Missing(t, "/dev/loop-control unusable (modprobe loop): %v", err)
		return
	}
	unix.Close(fd) //nolint:errcheck // read-only probe
}

// Commands requires each named command in PATH (exec.LookPath) and returns their paths in
// order. The message names the Debian package when it is known.
func Commands(t testing.TB, names ...string) []string {
	t.Helper()
	paths := make([]string, 0, len(names))
	for _, n := range names {
		p, err := exec.LookPath(n)
		if err != nil {
			Missing(t, "command %s not in PATH%s: %v", n, debianHint(n), err)
			return nil
		}
		paths = append(paths, p)
	}
	return paths
}

// Env requires the environment variable name to be set and returns its value; how says how to
// set it (for example "make test-unit sets it").
func Env(t testing.TB, name, how string) string {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		Missing(t, "environment variable %s unset (%s)", name, how)
	}
	return v
}

// Check fails or skips t (as Missing) when err is not nil: for prerequisites probed by the test
// itself, such as a free loop device (losetup --find). what names the prerequisite.
func Check(t testing.TB, what string, err error) {
	t.Helper()
	if err != nil {
		Missing(t, "%s: %v", what, err)
	}
}

var debianPackages = map[string]string{
	"losetup": "util-linux", "mkfs.xfs": "xfsprogs", "xfs_io": "xfsprogs", "xfs_growfs": "xfsprogs",
	"mkfs.ext4": "e2fsprogs", "resize2fs": "e2fsprogs", "promtool": "prometheus",
	"qemu-system-x86_64": "qemu-system-x86", "nvme": "nvme-cli",
	"sfdisk": "fdisk", "partx": "util-linux", "wipefs": "util-linux",
}

func debianHint(cmd string) string {
	if p, ok := debianPackages[cmd]; ok {
		return " (apt-get install " + p + ")"
	}
	return ""
}
