package mount

import (
	"encoding/binary"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/plinth-storage/plinth/test/prereq"
)

// setCapacity grows the backing file of dev to size and makes the loop device show it, as the
// agent growing an LV or file and the kernel noticing would.
func setCapacity(t *testing.T, dev, file string, size int64) {
	t.Helper()
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity %s: %v %s", dev, err, out)
	}
}

func fsSize(t *testing.T, dev, mnt string) int64 {
	t.Helper()
	n, err := FilesystemSize(dev, mnt)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// Grow on a real xfs on a loop device: it touches nothing while the device is smaller than
// asked — also when the device grew part of the way, where a blind xfs_growfs would grow the
// filesystem to the wrong size — grows once the device shows the size, and runs no resize tool
// when the filesystem already has it.
func TestGrowOnlyToTheAskedSize(t *testing.T) {
	prereq.Commands(t, "mkfs.xfs", "xfs_growfs")
	m := New()
	dev, file := loopDevice(t, 320<<20)
	mnt := mountDir(t, m)
	if err := m.FormatAndMount(dev, mnt, "xfs", nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount(mnt, false) }) //nolint:errcheck // before the loop device detaches
	if got := fsSize(t, dev, mnt); got != 320<<20 {
		t.Fatalf("FilesystemSize of a fresh xfs on 320 MiB: %d", got)
	}
	grown, _, err := m.Grow(dev, mnt, 640<<20)
	if !errors.Is(err, ErrDeviceTooSmall) || grown {
		t.Fatalf("Grow before the device grew: grown %v, %v; want ErrDeviceTooSmall", grown, err)
	}
	setCapacity(t, dev, file, 480<<20) // part of the way
	grown, size, err := m.Grow(dev, mnt, 640<<20)
	if !errors.Is(err, ErrDeviceTooSmall) || grown || size != 480<<20 {
		t.Fatalf("Grow with the device at 480 of 640 MiB: grown %v, size %d, %v; want ErrDeviceTooSmall", grown, size, err)
	}
	if got := fsSize(t, dev, mnt); got != 320<<20 {
		t.Fatalf("filesystem %d bytes after a refused Grow, want 320 MiB untouched", got)
	}
	setCapacity(t, dev, file, 640<<20)
	if grown, size, err := m.Grow(dev, mnt, 640<<20); err != nil || !grown || size != 640<<20 {
		t.Fatalf("Grow once the device shows 640 MiB: grown %v, size %d, %v", grown, size, err)
	}
	if got := fsSize(t, dev, mnt); got != 640<<20 {
		t.Fatalf("filesystem %d bytes after Grow, want 640 MiB", got)
	}
	for _, want := range []int64{640 << 20, 320 << 20, 0} {
		if grown, _, err := m.Grow(dev, mnt, want); err != nil || grown {
			t.Errorf("Grow(%d) of a filesystem that has the size: grown %v, %v; want no resize", want, grown, err)
		}
	}
}

// FilesystemSize of ext4 reads the superblock: mkfs.ext4 spans the whole device.
func TestFilesystemSizeExt4(t *testing.T) {
	prereq.Commands(t, "mkfs.ext4")
	m := New()
	dev, _ := loopDevice(t, 64<<20)
	mnt := mountDir(t, m)
	if err := m.FormatAndMount(dev, mnt, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount(mnt, false) }) //nolint:errcheck
	if got := fsSize(t, dev, mnt); got != 64<<20 {
		t.Errorf("FilesystemSize of ext4 on 64 MiB: %d", got)
	}
	if _, err := FilesystemSize(dev, "/proc"); err == nil {
		t.Error("FilesystemSize of procfs: no error (only ext* and xfs can be grown)")
	}
}

func TestParseExtSuperblock(t *testing.T) {
	sb := make([]byte, 1024)
	le := binary.LittleEndian
	le.PutUint16(sb[0x38:], ext4Magic)
	le.PutUint32(sb[0x4:], 5)
	le.PutUint32(sb[0x18:], 2) // 4 KiB blocks
	le.PutUint32(sb[0x150:], 1)
	if n, err := parseExtSuperblock(sb); err != nil || n != 5*4096 {
		t.Errorf("32-bit block count: %d, %v", n, err)
	}
	le.PutUint32(sb[0x60:], 0x80) // 64bit: the high word counts
	if n, err := parseExtSuperblock(sb); err != nil || n != (1<<32+5)*4096 {
		t.Errorf("64-bit block count: %d, %v", n, err)
	}
	le.PutUint32(sb[0x18:], 40)
	if _, err := parseExtSuperblock(sb); err == nil {
		t.Error("absurd block size accepted")
	}
	if _, err := parseExtSuperblock(make([]byte, 1024)); err == nil {
		t.Error("no magic accepted")
	}
}

// A mount point reached through a symlinked folder (a kubelet root dir that is a symlink) is
// listed by mountinfo under its resolved path: IsMounted and Unmount must find it there.
func TestSymlinkedMountPoint(t *testing.T) {
	m := New()
	dev, _ := loopDevice(t, 64<<20)
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "real"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "real"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(root, "link", "target")
	if err := os.Mkdir(target, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := m.FormatAndMount(dev, target, "ext4", nil, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Unmount(target, false) }) //nolint:errcheck
	if got := Resolve(target); got != filepath.Join(root, "real", "target") {
		t.Errorf("Resolve(%s) = %s", target, got)
	}
	if mounted, err := m.IsMounted(target); err != nil || !mounted {
		t.Fatalf("IsMounted through the symlink: %v, %v; want true", mounted, err)
	}
	if err := m.Unmount(target, true); err != nil {
		t.Fatalf("Unmount through the symlink: %v", err)
	}
	if mounted, _ := m.IsMounted(filepath.Join(root, "real", "target")); mounted {
		t.Error("still mounted at the resolved path after Unmount returned nil")
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target not removed: %v", err)
	}
}
