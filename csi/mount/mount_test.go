package mount

import (
	"errors"
	"github.com/plinth-storage/plinth/test/prereq"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// loopDevice attaches a sparse file of size bytes to a free loop device (real kernel loop
// driver) and detaches it at cleanup. Needs root and losetup (prereq).
func loopDevice(t *testing.T, size int64) (dev, file string) {
	t.Helper()
	prereq.Root(t, "loop devices and mount")
	prereq.Commands(t, "losetup")
	file = filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		prereq.Missing(t, "a free loop device (losetup --find): %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		if out, err := exec.Command("losetup", "--detach", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup --detach %s: %v: %s", dev, err, out)
		}
	})
	return dev, file
}

func mountDir(t *testing.T, m *Mounter) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount(dir, false) }) //nolint:errcheck // best effort after a failure
	return dir
}

func blkidType(t *testing.T, dev string) string {
	out, _ := exec.Command("blkid", "-p", "-s", "TYPE", "-o", "value", dev).Output()
	return strings.TrimSpace(string(out))
}

// Blank → mkfs; an existing filesystem is mounted as it is (data kept, no mkfs even when
// another fsType is asked); a missing device is an error and nothing is formatted.
func TestFormatOnlyBlankDevices(t *testing.T) {
	m := New()
	dev, _ := loopDevice(t, 64<<20)
	target := mountDir(t, m)
	if err := m.FormatAndMount(dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	if got := blkidType(t, dev); got != "ext4" {
		t.Fatalf("blank device formatted as %q, want ext4", got)
	}
	if err := os.WriteFile(filepath.Join(target, "keep"), []byte("data"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(target, false); err != nil {
		t.Fatal(err)
	}
	// Asked for xfs on an ext4 device: refuse to reformat; the mount as xfs fails, data stays.
	if err := m.FormatAndMount(dev, target, "xfs", nil, nil); err == nil {
		t.Error("mount of an ext4 device as xfs succeeded")
	}
	if got := blkidType(t, dev); got != "ext4" {
		t.Fatalf("device now %q: an existing filesystem was reformatted", got)
	}
	if err := m.FormatAndMount(dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(target, "keep")); err != nil || string(b) != "data" {
		t.Errorf("data after restage: %q, %v", b, err)
	}
	if err := m.Unmount(target, false); err != nil {
		t.Fatal(err)
	}
	// Missing device: never mkfs.
	err := m.FormatAndMount("/dev/plinth-does-not-exist", target, "xfs", nil, nil)
	if !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("missing device: %v, want ErrDeviceNotFound", err)
	}
	// A regular file is not a block device either.
	f := filepath.Join(t.TempDir(), "plain")
	os.WriteFile(f, nil, 0o644)
	if err := CheckBlockDevice(f); !errors.Is(err, ErrDeviceNotFound) {
		t.Errorf("plain file: %v", err)
	}
}

// An xfs clone (same UUID) mounts beside its origin because xfs mounts use nouuid.
func TestXFSCloneMountsBesideOrigin(t *testing.T) {
	prereq.Commands(t, "mkfs.xfs")
	m := New()
	devA, fileA := loopDevice(t, 320<<20)
	a := mountDir(t, m)
	if err := m.FormatAndMount(devA, a, "xfs", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(a, false); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(fileA)
	if err != nil {
		t.Fatal(err)
	}
	devB, fileB := loopDevice(t, 320<<20)
	if err := os.WriteFile(fileB, data, 0o644); err != nil { // block-level clone
		t.Fatal(err)
	}
	if out, err := exec.Command("blockdev", "--flushbufs", devB).CombinedOutput(); err != nil {
		t.Fatalf("flush %s: %v %s", devB, err, out)
	}
	if err := m.FormatAndMount(devA, a, "xfs", nil, nil); err != nil {
		t.Fatal(err)
	}
	b := mountDir(t, m)
	if err := m.FormatAndMount(devB, b, "xfs", nil, nil); err != nil {
		t.Fatalf("mount of the clone beside its origin: %v", err)
	}
	if MountOptions("xfs", nil)[0] != "nouuid" || len(MountOptions("ext4", nil)) != 0 {
		t.Errorf("MountOptions: xfs %v, ext4 %v", MountOptions("xfs", nil), MountOptions("ext4", nil))
	}
}

// A dead mount (xfs shut down: every stat returns EIO) is unmounted and removed; success
// only once mountinfo no longer lists it.
func TestUnmountDeadMount(t *testing.T) {
	prereq.Commands(t, "xfs_io")
	m := New()
	dev, _ := loopDevice(t, 320<<20)
	target := mountDir(t, m)
	if err := m.FormatAndMount(dev, target, "xfs", nil, nil); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("xfs_io", "-x", "-c", "shutdown", target).CombinedOutput(); err != nil {
		t.Fatalf("xfs_io shutdown: %v %s", err, out)
	}
	err := m.Probe(target)
	if !errors.Is(err, syscall.EIO) || !IsCorrupted(err) {
		t.Fatalf("stat of a shut-down xfs: %v, want EIO classified as corrupted", err)
	}
	if mounted, err := m.IsMounted(target); err != nil || !mounted {
		t.Fatalf("IsMounted(dead mount) = %v, %v; want true from mountinfo", mounted, err)
	}
	if err := m.Unmount(target, true); err != nil {
		t.Fatal(err)
	}
	if mounted, _ := m.IsMounted(target); mounted {
		t.Error("still mounted after Unmount returned nil")
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target not removed: %v", err)
	}
	// Unmount of an absent path is success.
	if err := m.Unmount(target, true); err != nil {
		t.Errorf("second Unmount: %v", err)
	}
}

func TestIsCorruptedErrnos(t *testing.T) {
	for _, e := range []syscall.Errno{syscall.EIO, syscall.ENOTCONN, syscall.ESTALE} {
		if !IsCorrupted(&os.PathError{Op: "stat", Path: "/x", Err: e}) {
			t.Errorf("%v not classified as a corrupted mount", e)
		}
	}
	if IsCorrupted(&os.PathError{Op: "stat", Path: "/x", Err: syscall.ENOENT}) {
		t.Error("ENOENT classified as corrupted")
	}
}

func TestDeviceSize(t *testing.T) {
	dev, _ := loopDevice(t, 48<<20)
	got, err := DeviceSize(dev)
	if err != nil || got != 48<<20 {
		t.Errorf("DeviceSize = %d, %v; want %d", got, err, 48<<20)
	}
}
