package raw

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/test/prereq"
)

// These tests use the kernel's real loop devices with partition scanning (losetup -P), real
// sfdisk, partx, wipefs and blkid, on the host (root with /dev/loop-control); the guest suite
// does the same on virtio disks through the agent and the CSI driver.

// loopDisk attaches a sparse file of size bytes as a loop device with partition scanning and
// returns its path; detached at cleanup.
func loopDisk(t *testing.T, size int64) string {
	t.Helper()
	img := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(img)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	f.Close()
	out, err := exec.Command("losetup", "--find", "--show", "--partscan", img).CombinedOutput()
	prereq.Check(t, "a free loop device with partition scanning (losetup -P)", err)
	dev := strings.TrimSpace(string(out))
	t.Cleanup(func() {
		exec.Command("umount", "-l", filepath.Join(filepath.Dir(img), "mnt")).Run() //nolint:errcheck
		if b, err := exec.Command("losetup", "-d", dev).CombinedOutput(); err != nil {
			t.Errorf("losetup -d %s: %v: %s", dev, err, b)
		}
	})
	return dev
}

func hostPrereqs(t *testing.T) {
	t.Helper()
	prereq.LoopControl(t)
	prereq.Commands(t, "losetup", "sfdisk", "partx", "wipefs", "blkid", "mkfs.ext4", "mount", "umount")
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// partitions counts the partitions of dev in its GPT (sfdisk) and in the kernel (sysfs).
func partitions(t *testing.T, dev string) (inTable, inKernel int) {
	t.Helper()
	tb, err := parseTable([]byte(sh(t, "sfdisk", "--json", dev)))
	if err != nil {
		t.Fatal(err)
	}
	m, _ := filepath.Glob(filepath.Join("/sys/class/block", filepath.Base(dev), "*", "partition"))
	return len(tb.Partitions), len(m)
}

func vid(n int) string { return backend.VolumeID(fmt.Sprintf("pvc-raw-%d", n)) }

// probeAt reports what blkid finds at byte offset off of dev ("" when nothing).
func probeAt(t *testing.T, dev string, off int64) string {
	t.Helper()
	out, err := exec.Command("blkid", "-p", "-O", strconv.FormatInt(off, 10), "-o", "value", "-s", "TYPE", dev).CombinedOutput()
	var ee *exec.ExitError
	if errors.As(err, &ee) && ee.ExitCode() == 2 {
		return ""
	}
	if err != nil {
		t.Fatalf("blkid -p -O %d %s: %v: %s", off, dev, err, out)
	}
	return strings.TrimSpace(string(out))
}

func TestHostGPT(t *testing.T) {
	hostPrereqs(t)
	ctx := context.Background()
	small, big := loopDisk(t, 48<<20), loopDisk(t, 96<<20)
	r, err := New(Config{Devices: []string{small, big}, Partitioning: GPT})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Ensure(ctx); err != nil { // idempotent on a labelled disk
		t.Fatal(err)
	}
	c, err := r.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// each disk loses its first MiB (GPT + alignment) and its last (the backup GPT's 33
	// sectors leave an incomplete aligned MiB)
	if c.TotalBytes != (46+94)<<20 || c.FreeBytes != c.TotalBytes || c.LargestFreeBytes != 94<<20 || c.ProvisionedBytes != 0 {
		t.Fatalf("empty disks: capacity %+v, want total = free = 140 MiB, largest 94 MiB", c)
	}

	// A: 10 MiB + 1 byte rounds up to 11 MiB, at the start of the largest region (big disk)
	a, err := r.Create(ctx, vid(1), 10<<20+1)
	if err != nil {
		t.Fatal(err)
	}
	if a.SizeBytes != 11<<20 || !strings.HasPrefix(a.DevicePath, big+"p") {
		t.Fatalf("volume A = %+v, want 11 MiB on %s", a, big)
	}
	if again, err := r.Create(ctx, vid(1), 10<<20); err != nil || again != a {
		t.Fatalf("Create again = %+v, %v; want %+v", again, err, a)
	}
	if _, err := r.Create(ctx, vid(1), 12<<20); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Fatalf("Create larger under the same id: %v, want ErrAlreadyExists", err)
	}
	if tb, k := partitions(t, big); tb != 1 || k != 1 {
		t.Fatalf("after creating A: %d partitions in the GPT, %d in the kernel; want 1, 1", tb, k)
	}

	// A crash after sfdisk wrote B and before the kernel heard of it (or the status was
	// written): Create adopts B, makes no second partition, and the kernel gets to know it.
	name, _ := PartitionName(vid(2))
	guid, _ := PartitionGUID(vid(2))
	start := a.SizeBytes/512 + 2048
	script := fmt.Sprintf("start=%d, size=%d, type=%s, uuid=%s, name=%q\n", start, 8<<20/512, TypeGUID, guid, name)
	cmd := exec.Command("sfdisk", "--quiet", "--append", "--no-reread", "--no-tell-kernel", big)
	cmd.Stdin = strings.NewReader(script)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v: %s", err, out)
	}
	if tb, k := partitions(t, big); tb != 2 || k != 1 {
		t.Fatalf("crash left %d partitions in the GPT, %d in the kernel; want 2, 1", tb, k)
	}
	b, err := r.Create(ctx, vid(2), 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if tb, k := partitions(t, big); tb != 2 || k != 2 || b.SizeBytes != 8<<20 || b.DevicePath == "" {
		t.Fatalf("after adopting B (%+v): %d partitions in the GPT, %d in the kernel; want 2, 2", b, tb, k)
	}
	if _, err := os.Stat(b.DevicePath); err != nil {
		t.Fatalf("B's device node: %v", err)
	}

	// Expansion: A has B right after it: refused, with what is there; B grows into the
	// free space after it, while mounted.
	if _, err := r.Expand(ctx, vid(1), 12<<20); !errors.Is(err, backend.ErrOutOfRange) || !strings.Contains(err.Error(), "0 bytes there") {
		t.Fatalf("Expand A with B right after it: %v, want ErrOutOfRange naming 0 bytes", err)
	}
	sh(t, "mkfs.ext4", "-q", b.DevicePath)
	mnt := filepath.Join(t.TempDir(), "mnt")
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	sh(t, "mount", b.DevicePath, mnt)
	b2, err := r.Expand(ctx, vid(2), 20<<20)
	if err != nil {
		t.Fatal(err)
	}
	kb := strings.TrimSpace(sh(t, "cat", filepath.Join("/sys/class/block", filepath.Base(b.DevicePath), "size")))
	if b2.SizeBytes != 20<<20 || kb != strconv.Itoa(20<<20/512) {
		t.Fatalf("B after Expand: %+v, kernel size %s sectors; want 20 MiB in both", b2, kb)
	}
	if _, err := r.Expand(ctx, vid(2), 200<<20); !errors.Is(err, backend.ErrOutOfRange) {
		t.Fatalf("Expand B beyond its disk: %v, want ErrOutOfRange", err)
	}
	// a new partition on a disk with a mounted one (sfdisk refuses a disk in use without
	// --no-reread), and its deletion
	if _, err := r.Create(ctx, vid(3), 4<<20); err != nil {
		t.Fatalf("Create beside a mounted partition: %v", err)
	}
	if err := r.Delete(ctx, vid(3)); err != nil {
		t.Fatalf("Delete beside a mounted partition: %v", err)
	}

	// A mounted volume is never deleted: ErrInUse, the partition and its filesystem stay.
	if err := r.Delete(ctx, vid(2)); !errors.Is(err, backend.ErrInUse) || !strings.Contains(err.Error(), "mounted at "+mnt) {
		t.Fatalf("Delete of mounted B: %v, want ErrInUse naming the mount", err)
	}
	bStart := (a.SizeBytes + 1<<20)
	if tb, k := partitions(t, big); tb != 2 || k != 2 || probeAt(t, big, bStart) != "ext4" {
		t.Fatalf("after the refused delete: %d, %d partitions, signature %q at B; want 2, 2, ext4", tb, k, probeAt(t, big, bStart))
	}
	// ... nor one a process holds open (no mount: the kernel's BLKPG delete refuses)
	sh(t, "umount", mnt)
	held, err := os.Open(b.DevicePath)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Delete(ctx, vid(2)); !errors.Is(err, backend.ErrInUse) {
		t.Fatalf("Delete of B held open: %v, want ErrInUse", err)
	}
	held.Close()
	if tb, k := partitions(t, big); tb != 2 || k != 2 || probeAt(t, big, bStart) != "ext4" {
		t.Fatalf("after the refused delete: %d, %d partitions, signature %q at B; want 2, 2, ext4", tb, k, probeAt(t, big, bStart))
	}
	if err := r.Delete(ctx, vid(2)); err != nil {
		t.Fatal(err)
	}
	if tb, k := partitions(t, big); tb != 1 || k != 1 {
		t.Fatalf("after deleting B: %d partitions in the GPT, %d in the kernel; want 1, 1", tb, k)
	}
	if sig := probeAt(t, big, bStart); sig != "" {
		t.Fatalf("B's area still carries a %s signature after Delete", sig)
	}
	if err := r.Delete(ctx, vid(2)); err != nil { // idempotent
		t.Fatal(err)
	}

	// A new volume in the freed area never shows the old data: sfdisk wipes the new area.
	sh(t, "mkfs.ext4", "-q", a.DevicePath)
	if err := r.Delete(ctx, vid(1)); err != nil {
		t.Fatal(err)
	}
	vols, err := r.List(ctx)
	if err != nil || len(vols) != 0 {
		t.Fatalf("List after deleting everything = %v, %v", vols, err)
	}
	c, err = r.Capacity(ctx)
	if err != nil || c.FreeBytes != c.TotalBytes || c.ProvisionedBytes != 0 {
		t.Fatalf("capacity after deleting everything: %+v, %v", c, err)
	}
}

func TestHostWholeDisks(t *testing.T) {
	hostPrereqs(t)
	ctx := context.Background()
	d1, d2 := loopDisk(t, 64<<20), loopDisk(t, 32<<20)
	r, err := New(Config{Devices: []string{d1, d2}, Partitioning: Whole, ReserveBytes: 0})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	c, err := r.Capacity(ctx)
	if err != nil || c.TotalBytes != (62+30)<<20 || c.LargestFreeBytes != 62<<20 {
		t.Fatalf("capacity %+v, %v; want total 92 MiB, largest 62 MiB", c, err)
	}
	// 20 MiB takes the smallest disk that holds it, all of it
	v, err := r.Create(ctx, vid(1), 20<<20)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 30<<20 || !strings.HasPrefix(v.DevicePath, d2+"p") {
		t.Fatalf("whole-disk volume %+v, want 30 MiB on %s", v, d2)
	}
	if _, err := r.Create(ctx, vid(2), 64<<20); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Fatalf("Create larger than any free disk: %v, want ErrInsufficientCapacity", err)
	}
	if _, err := r.Expand(ctx, vid(1), 32<<20); !errors.Is(err, backend.ErrOutOfRange) {
		t.Fatalf("Expand a whole-disk volume: %v, want ErrOutOfRange", err)
	}
	w, err := r.Create(ctx, vid(2), 40<<20)
	if err != nil || w.SizeBytes != 62<<20 {
		t.Fatalf("second whole-disk volume %+v, %v; want 62 MiB", w, err)
	}
	c, err = r.Capacity(ctx)
	if err != nil || c.FreeBytes != 0 || c.ProvisionedBytes != c.TotalBytes || c.Available(0, 0) != 0 {
		t.Fatalf("capacity when every disk is a volume: %+v, %v", c, err)
	}
	for _, d := range []string{d1, d2} {
		if tb, k := partitions(t, d); tb != 1 || k != 1 {
			t.Fatalf("%s: %d partitions in the GPT, %d in the kernel; want 1, 1", d, tb, k)
		}
	}
	for _, id := range []string{vid(1), vid(2)} {
		if err := r.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{d1, d2} {
		if tb, k := partitions(t, d); tb != 0 || k != 0 {
			t.Fatalf("%s after Delete: %d partitions in the GPT, %d in the kernel; want 0, 0", d, tb, k)
		}
	}
}

// TestHostEnsureRefuses: a disk with data, or with partitions of others, is never labelled.
func TestHostEnsureRefuses(t *testing.T) {
	hostPrereqs(t)
	ctx := context.Background()
	fs, foreign := loopDisk(t, 32<<20), loopDisk(t, 32<<20)
	sh(t, "mkfs.ext4", "-q", fs)
	cmd := exec.Command("sfdisk", "--quiet", foreign)
	cmd.Stdin = strings.NewReader("label: gpt\nsize=4MiB, name=data\n")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("sfdisk: %v: %s", err, out)
	}
	sh(t, "partx", "-a", foreign)
	for _, dev := range []string{fs, foreign} {
		r, err := New(Config{Devices: []string{dev}})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Ensure(ctx); !errors.Is(err, backend.ErrDeviceNotEmpty) {
			t.Fatalf("Ensure on %s: %v, want ErrDeviceNotEmpty", dev, err)
		}
	}
	if got := probeAt(t, fs, 0); got != "ext4" {
		t.Fatalf("the refused disk's filesystem: %q, want ext4 untouched", got)
	}
	// a partition is refused as a disk
	r, err := New(Config{Devices: []string{foreign + "p1"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Ensure(ctx); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Fatalf("Ensure on a partition: %v, want ErrInvalidArgument", err)
	}
}

// TestHostStampArea: on a real GPT written by sfdisk, the stamp area lies below the first
// usable LBA sfdisk records; stamping a GPT and a Whole volume leaves the table valid
// (sfdisk --verify), the disk's signatures as they were (only the GPT), and the partitions'
// data unchanged; the stamps are read back through another loop device of the same image
// (from the disk, not a cache), and Delete clears the slot.
func TestHostStampArea(t *testing.T) {
	hostPrereqs(t)
	ctx := context.Background()
	for _, mode := range []string{GPT, Whole} {
		t.Run(mode, func(t *testing.T) {
			dev := loopDisk(t, 32<<20)
			r, err := New(Config{Devices: []string{dev}, Partitioning: mode})
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Ensure(ctx); err != nil {
				t.Fatal(err)
			}
			d, err := r.readDisk(ctx, dev)
			if err != nil {
				t.Fatal(err)
			}
			if d.t.FirstLBA*d.t.SectorSize < StampAreaOffset+StampSlots*StampSlotBytes {
				t.Fatalf("sfdisk's first usable byte %d is inside the stamp area", d.t.FirstLBA*d.t.SectorSize)
			}
			id := vid(1)
			v, err := r.Create(ctx, id, 4<<20)
			if err != nil {
				t.Fatal(err)
			}
			sh(t, "dd", "if=/dev/urandom", "of="+v.DevicePath, "bs=1M", "count=4", "conv=fsync", "status=none")
			dataSum := sh(t, "sh", "-c", "sha256sum < "+v.DevicePath)
			signatures := sh(t, "wipefs", "-n", "--noheadings", dev)
			s := testStamp(id)
			if err := r.Stamp(ctx, s); err != nil {
				t.Fatal(err)
			}
			sh(t, "sfdisk", "--verify", dev)
			if got := sh(t, "wipefs", "-n", "--noheadings", dev); got != signatures {
				t.Errorf("signatures after stamping:\n%s\nwant\n%s", got, signatures)
			}
			if got := sh(t, "sh", "-c", "sha256sum < "+v.DevicePath); got != dataSum {
				t.Error("stamping changed the volume's data")
			}
			// the same image through a second loop device: the stamp is on the disk
			back := strings.TrimSpace(sh(t, "losetup", "--find", "--show", "--read-only", dev))
			t.Cleanup(func() { exec.Command("losetup", "-d", back).Run() }) //nolint:errcheck
			d2 := &disk{declared: back, dev: back, t: d.t}
			vb := &backend.Volume{ID: id}
			r.readStamps(d2, map[int]*backend.Volume{1: vb})
			if vb.Stamp == nil || *vb.Stamp != s || vb.StampErr != nil {
				t.Errorf("read through %s: %+v, %v; want %+v", back, vb.Stamp, vb.StampErr, s)
			}
			if err := r.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
			if got := sh(t, "sh", "-c", fmt.Sprintf("dd if=%s bs=4096 skip=%d count=1 status=none | tr -d '\\000' | wc -c", dev, StampAreaOffset/StampSlotBytes)); strings.TrimSpace(got) != "0" {
				t.Errorf("slot 1 after Delete holds %s non-zero bytes", got)
			}
		})
	}
}
