package iolimit

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/opencontainers/cgroups"
)

// fakeCgroupfs stands in for cgroupfs (the library's TestMode writes plain files): the kernel
// side is covered by the end-to-end scenario on real kubelets.
func fakeCgroupfs(t *testing.T, dirs ...string) string {
	t.Helper()
	cgroups.TestMode = true
	t.Cleanup(func() { cgroups.TestMode = false })
	root := t.TempDir()
	for _, d := range dirs {
		if err := os.MkdirAll(filepath.Join(root, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func read(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestV1WritesThePodAndEveryContainerCgroup(t *testing.T) {
	const uid = "0b3c5d6e-1111-2222-3333-444455556666"
	pod := "blkio/plinth-n1/kubepods/besteffort/pod" + uid
	root := fakeCgroupfs(t, pod+"/sandbox", pod+"/writer", "blkio/plinth-n1/kubepods/besteffort/podother/c")
	w := Writer{Root: root}
	if _, err := w.Apply(uid, Device{7, 3}, Limits{WriteBPS: 8 << 20, ReadIOPS: 100}); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{pod, pod + "/sandbox", pod + "/writer"} {
		if got := read(t, filepath.Join(root, d, "blkio.throttle.write_bps_device")); got != "7:3 8388608" {
			t.Errorf("%s write_bps %q", d, got)
		}
		if got := read(t, filepath.Join(root, d, "blkio.throttle.read_iops_device")); got != "7:3 100" {
			t.Errorf("%s read_iops %q", d, got)
		}
		// an unset limit is removed (0), never left at an older tier's value
		if got := read(t, filepath.Join(root, d, "blkio.throttle.read_bps_device")); got != "7:3 0" {
			t.Errorf("%s read_bps %q", d, got)
		}
	}
	if _, err := os.Stat(filepath.Join(root, "blkio/plinth-n1/kubepods/besteffort/podother/c/blkio.throttle.write_bps_device")); err == nil {
		t.Error("another pod's cgroup was written")
	}
}

func TestV2WritesIOMaxOfThePodCgroupFoundBySystemdName(t *testing.T) {
	const uid = "0b3c5d6e-1111-2222-3333-444455556666"
	pod := "kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod0b3c5d6e_1111_2222_3333_444455556666.slice"
	root := fakeCgroupfs(t, pod+"/cri-containerd-abc.scope")
	w := Writer{Root: root, V2: true}
	if _, err := w.Apply(uid, Device{259, 1}, Limits{ReadBPS: 1 << 20}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, filepath.Join(root, pod, "io.max")); got != "259:1 rbps=1048576 wbps=max riops=max wiops=max" {
		t.Errorf("io.max %q", got)
	}
}

func TestMissingPodCgroupOrDeviceIsNamed(t *testing.T) {
	root := fakeCgroupfs(t, "blkio/kubepods")
	if _, err := (Writer{Root: root}).Apply("nope", Device{7, 3}, Limits{WriteBPS: 1}); !errors.Is(err, ErrNoCgroup) {
		t.Errorf("missing pod: %v, want ErrNoCgroup", err)
	}
	if _, err := DeviceOf(filepath.Join(root, "absent")); !errors.Is(err, ErrNoDevice) {
		t.Errorf("missing device: %v, want ErrNoDevice", err)
	}
	if _, err := DeviceOf(root); !errors.Is(err, ErrNoDevice) {
		t.Errorf("a directory: %v, want ErrNoDevice", err)
	}
}

// An unchanged limit is not written again (each write restarts the kernel's throttling
// slice); a changed one is.
func TestUnchangedLimitsAreNotRewritten(t *testing.T) {
	const uid = "u1"
	root := fakeCgroupfs(t, "blkio/kubepods/pod"+uid)
	w := Writer{Root: root}
	file := filepath.Join(root, "blkio/kubepods/pod"+uid, "blkio.throttle.write_bps_device")
	if _, err := w.Apply(uid, Device{7, 3}, Limits{WriteBPS: 4096}); err != nil {
		t.Fatal(err)
	}
	// the kernel's form, with a newline: a rewrite would drop it
	if err := os.WriteFile(file, []byte("7:3 4096\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := w.Apply(uid, Device{7, 3}, Limits{WriteBPS: 4096}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file); got != "7:3 4096\n" {
		t.Errorf("unchanged limit rewritten: %q", got)
	}
	if _, err := w.Apply(uid, Device{7, 3}, Limits{WriteBPS: 8192}); err != nil {
		t.Fatal(err)
	}
	if got := read(t, file); got != "7:3 8192" {
		t.Errorf("changed limit: %q", got)
	}
}
