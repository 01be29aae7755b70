package lvm

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Guest tests run in the qemu guest of test/kernel (make test-kernel) on the
// real kernel and lvm2. They own /dev/vdb (test/kernel/README.md).

const guestVG = "plinth-test"

func guestDisk() string {
	if d := os.Getenv("PLINTH_LVM_DISK"); d != "" {
		return d
	}
	return "/dev/vdb"
}

func requireGuest(t *testing.T) {
	t.Helper()
	if os.Getenv("PLINTH_KERNEL_TEST") != "1" {
		t.Skip("kernel test: set PLINTH_KERNEL_TEST=1 (runs in the qemu guest via make test-kernel)")
	}
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// timed runs op, logs its duration as a TIMING line (no assertion) and
// fails the test on error.
func timed[T any](t *testing.T, what string, op func() (T, error)) T {
	t.Helper()
	start := time.Now()
	v, err := op()
	t.Logf("TIMING %-28s %6.0f ms", what, float64(time.Since(start).Microseconds())/1000)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// mustNew logs every lvm command's duration as a TIMING line.
func mustNew(t *testing.T, cfg Config) *LVM {
	t.Helper()
	cfg.OnCommand = func(name string, args []string, d time.Duration, err error) {
		t.Logf("TIMING   cmd %-10s %6.0f ms (err=%v)", name, float64(d.Microseconds())/1000, err != nil)
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func blockSize(t *testing.T, dev string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(strings.TrimSpace(sh(t, "blockdev", "--getsize64", dev)), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func cleanupVG(t *testing.T, disk string) {
	exec.Command("vgremove", "-ff", "-y", guestVG).Run()
	exec.Command("pvremove", "-ff", "-y", disk).Run()
	exec.Command("wipefs", "-a", disk).Run()
}

// rawVG reads vgs directly, as an operator would, to compare with Capacity.
func rawVG(t *testing.T) VG {
	t.Helper()
	vgs, err := ParseVGs([]byte(sh(t, "vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", vgFields, guestVG)))
	if err != nil || len(vgs) != 1 {
		t.Fatalf("vgs: %v %v", vgs, err)
	}
	return vgs[0]
}

func rawLV(t *testing.T, name string) LV {
	t.Helper()
	lvs, err := ParseLVs([]byte(sh(t, "lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", lvFields, guestVG+"/"+name)))
	if err != nil || len(lvs) != 1 {
		t.Fatalf("lvs: %v %v", lvs, err)
	}
	return lvs[0]
}

func TestGuestRefuseNonEmptyDevice(t *testing.T) {
	requireGuest(t)
	disk := guestDisk()
	cleanupVG(t, disk)
	t.Cleanup(func() { cleanupVG(t, disk) })
	sh(t, "mkfs.ext4", "-q", "-F", disk)
	l := mustNew(t, Config{VolumeGroup: guestVG, Devices: []string{disk}})
	err := l.Ensure(context.Background())
	if !errors.Is(err, backend.ErrDeviceNotEmpty) {
		t.Fatalf("Ensure on ext4 device: %v, want ErrDeviceNotEmpty", err)
	}
	t.Logf("refused as expected: %v", err)
	if out := sh(t, "blkid", "-p", disk); !strings.Contains(out, `TYPE="ext4"`) {
		t.Errorf("device was written: %s", out)
	}
	if out, _ := exec.Command("vgs", guestVG).CombinedOutput(); !strings.Contains(string(out), "not found") {
		t.Errorf("VG was created: %s", out)
	}
}

func TestGuestLinearAndThin(t *testing.T) {
	requireGuest(t)
	disk := guestDisk()
	ctx := context.Background()
	cleanupVG(t, disk)
	t.Cleanup(func() { cleanupVG(t, disk) })

	lin := mustNew(t, Config{VolumeGroup: guestVG, Devices: []string{disk}, ReserveBytes: 256 << 20})
	timed(t, "Ensure (vgcreate)", func() (int, error) { return 0, lin.Ensure(ctx) })
	timed(t, "Ensure (existing VG)", func() (int, error) { return 0, lin.Ensure(ctx) })
	thin := mustNew(t, Config{VolumeGroup: guestVG, ThinPool: "pool0", ThinPoolSizePercent: 50, OvercommitPercent: 300})
	timed(t, "Ensure (thin pool create)", func() (int, error) { return 0, thin.Ensure(ctx) })

	// Linear, B01 rounding.
	idA, idB := backend.VolumeID("b01-a"), backend.VolumeID("b01-b")
	va := timed(t, "Create linear (lvcreate)", func() (backend.Volume, error) { return lin.Create(ctx, idA, 1) })
	vb := timed(t, "Create linear 1 GiB+1", func() (backend.Volume, error) { return lin.Create(ctx, idB, 1073741825) })
	if va.SizeBytes != 4194304 || vb.SizeBytes != 1077936128 {
		t.Errorf("B01 sizes %d %d", va.SizeBytes, vb.SizeBytes)
	}
	if got := blockSize(t, va.DevicePath); got != 4194304 {
		t.Errorf("device size %d", got)
	}
	timed(t, "Create linear (repeat)", func() (backend.Volume, error) { return lin.Create(ctx, idA, 1) })

	// Capacity equals what vgs reports.
	c := timed(t, "Capacity (vgs+lvs)", func() (backend.Capacity, error) { return lin.Capacity(ctx) })
	vg := rawVG(t)
	if c.TotalBytes != vg.SizeBytes || c.FreeBytes != vg.FreeBytes || c.ExtentBytes != vg.ExtentBytes || c.ProvisionedBytes != va.SizeBytes+vb.SizeBytes {
		t.Errorf("linear capacity %+v, vgs %+v", c, vg)
	}
	t.Logf("linear capacity: %+v available=%d", c, c.Available(256<<20, 0))

	// Expand linear.
	ve := timed(t, "Expand linear (lvextend)", func() (backend.Volume, error) { return lin.Expand(ctx, idA, 100<<20) })
	if ve.SizeBytes != 100<<20 || blockSize(t, ve.DevicePath) != 100<<20 {
		t.Errorf("expanded to %d", ve.SizeBytes)
	}
	if v, err := lin.Expand(ctx, idA, 10); err != nil || v.SizeBytes != 100<<20 {
		t.Errorf("expand smaller must be a no-op: %+v %v", v, err)
	}
	// No room: refused before lvcreate.
	if _, err := lin.Create(ctx, backend.VolumeID("huge"), 100<<30); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("huge create: %v", err)
	}

	// Thin: over-provisioned beyond the pool (warnings on stderr are not errors).
	idT := backend.VolumeID("thin-1")
	vt := timed(t, "Create thin (lvcreate -V)", func() (backend.Volume, error) { return thin.Create(ctx, idT, 3<<30) })
	if !vt.Thin || vt.SizeBytes != 3<<30 {
		t.Errorf("thin volume %+v", vt)
	}
	sh(t, "dd", "if=/dev/urandom", "of="+vt.DevicePath, "bs=1M", "count=32", "conv=fsync")
	tc := timed(t, "Capacity thin", func() (backend.Capacity, error) { return thin.Capacity(ctx) })
	pool := rawLV(t, "pool0")
	if !tc.Thin || tc.TotalBytes != pool.SizeBytes || tc.DataUsedRatio != pool.DataPercent/100 || tc.MetadataUsedRatio != pool.MetadataPercent/100 ||
		tc.FreeBytes != pool.SizeBytes-int64(float64(pool.SizeBytes)*pool.DataPercent/100) || tc.ProvisionedBytes != 3<<30 {
		t.Errorf("thin capacity %+v, lvs pool %+v", tc, pool)
	}
	if tc.DataUsedRatio <= 0 {
		t.Errorf("data written but pool use %v", tc.DataUsedRatio)
	}
	// B06: VG free is not the thin capacity.
	t.Logf("thin capacity: %+v available=%d (VG free %d)", tc, tc.Available(0, 300), rawVG(t).FreeBytes)
	if got, want := tc.Available(0, 300), pool.SizeBytes*3-3<<30; got != want {
		t.Errorf("thin available %d, want %d", got, want)
	}
	// A thin snapshot's space: the 32 MiB its origin maps, recorded at creation, equal to what
	// the kernel reports once the snapshot is activated, and unchanged by later writes.
	snapID := "snap-" + strings.Repeat("5", 40)
	timed(t, "CreateSnapshot (lvcreate -s)", func() (backend.Snapshot, error) { return thin.CreateSnapshot(ctx, snapID, idT) })
	sc := timed(t, "Capacity with a snapshot", func() (backend.Capacity, error) { return thin.Capacity(ctx) })
	// the 32 MiB written to its origin, read through data_percent's two decimals (0.01% of
	// 3 GiB is 322 KiB: 32 MiB reads as 1.04%, 33,500,744 bytes)
	if sc.SnapshotBytes < 32<<20-512<<10 || sc.SnapshotBytes > 34<<20 {
		t.Errorf("snapshot space %d bytes, want the 32 MiB written to its origin (31.5 to 34 MiB)", sc.SnapshotBytes)
	}
	if lv := rawLV(t, snapID); lv.Active {
		t.Errorf("snapshot LV is active: %+v", lv)
	}
	sh(t, "lvchange", "-ay", "-K", guestVG+"/"+snapID)
	kernel := rawLV(t, snapID)
	sh(t, "lvchange", "-an", guestVG+"/"+snapID)
	kernelBytes := int64(float64(kernel.SizeBytes) * kernel.DataPercent / 100)
	// data_percent has two decimals: 0.01% of 3 GiB is 322 KiB
	if d := kernelBytes - sc.SnapshotBytes; d > 1<<19 || d < -(1<<19) {
		t.Errorf("snapshot space %d bytes, the active snapshot maps %d (lvs data_percent %v)", sc.SnapshotBytes, kernelBytes, kernel.DataPercent)
	}
	sh(t, "dd", "if=/dev/urandom", "of="+vt.DevicePath, "bs=1M", "count=16", "seek=64", "conv=fsync")
	if c := timed(t, "Capacity after origin writes", func() (backend.Capacity, error) { return thin.Capacity(ctx) }); c.SnapshotBytes != sc.SnapshotBytes {
		t.Errorf("snapshot space %d after the origin wrote 16 MiB more, was %d", c.SnapshotBytes, sc.SnapshotBytes)
	}
	timed(t, "DeleteSnapshot (lvremove)", func() (int, error) { return 0, thin.DeleteSnapshot(ctx, snapID) })
	if c := timed(t, "Capacity without snapshots", func() (backend.Capacity, error) { return thin.Capacity(ctx) }); c.SnapshotBytes != 0 {
		t.Errorf("snapshot space %d after DeleteSnapshot", c.SnapshotBytes)
	}
	t.Logf("MEASURE thin snapshot space %d bytes, kernel (activated) %d bytes", sc.SnapshotBytes, kernelBytes)

	vt2 := timed(t, "Expand thin (lvextend)", func() (backend.Volume, error) { return thin.Expand(ctx, idT, 4<<30) })
	if vt2.SizeBytes != 4<<30 || blockSize(t, vt2.DevicePath) != 4<<30 {
		t.Errorf("thin expanded %+v", vt2)
	}

	// List separates the linear and the thin store.
	if l := timed(t, "List linear", func() ([]backend.Volume, error) { return lin.List(ctx) }); len(l) != 2 {
		t.Errorf("linear list %+v", l)
	}
	if l := timed(t, "List thin", func() ([]backend.Volume, error) { return thin.List(ctx) }); len(l) != 1 || l[0].ID != idT {
		t.Errorf("thin list %+v", l)
	}

	// Adoption after a crash: an LV with Plinth's tag and name is taken over;
	// one without the tag is not Plinth's.
	idC := backend.VolumeID("crash")
	sh(t, "lvcreate", "-y", "-Wy", "-Zy", "-L", "8m", "-n", idC, "--addtag", TagManaged, guestVG)
	if v, err := lin.Create(ctx, idC, 8<<20); err != nil || v.SizeBytes != 8<<20 {
		t.Errorf("adopt: %+v %v", v, err)
	}
	idF := backend.VolumeID("foreign")
	sh(t, "lvcreate", "-y", "-Wy", "-Zy", "-L", "8m", "-n", idF, guestVG)
	if _, err := lin.Create(ctx, idF, 8<<20); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("foreign LV: %v", err)
	}

	// Activation after reboot: deactivate everything, Ensure re-activates.
	sh(t, "vgchange", "-an", guestVG)
	if v := timed(t, "Get", func() (backend.Volume, error) { return lin.Get(ctx, idA) }); v.DevicePath != "" {
		t.Errorf("inactive LV has a device path: %+v", v)
	}
	timed(t, "Ensure (vgchange -ay)", func() (int, error) { return 0, thin.Ensure(ctx) })
	if v := timed(t, "Get", func() (backend.Volume, error) { return lin.Get(ctx, idA) }); v.DevicePath == "" {
		t.Errorf("not re-activated: %+v", v)
	}
	sh(t, "lvchange", "-an", guestVG+"/"+idB)
	p := timed(t, "DevicePath (lvchange -ay)", func() (string, error) { return lin.DevicePath(ctx, idB) })
	if blockSize(t, p) != 1077936128 {
		t.Errorf("DevicePath %s not active", p)
	}

	// Delete while open → ErrInUse with the command and stderr; then delete.
	f, err := os.Open(va.DevicePath)
	if err != nil {
		t.Fatal(err)
	}
	err = lin.Delete(ctx, idA)
	f.Close()
	var ce *backend.CommandError
	if !errors.Is(err, backend.ErrInUse) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "lvremove") {
		t.Errorf("delete of open LV: %v", err)
	} else {
		t.Logf("delete of open LV refused: %v", err)
	}
	for _, id := range []string{idA, idB, idC} {
		timed(t, "Delete linear (lvremove)", func() (int, error) { return 0, lin.Delete(ctx, id) })
	}
	timed(t, "Delete thin (lvremove)", func() (int, error) { return 0, thin.Delete(ctx, idT) })
	timed(t, "Delete absent", func() (int, error) { return 0, lin.Delete(ctx, idA) }) // idempotent
	if _, err := lin.Get(ctx, idA); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
	if out := sh(t, "lvs", "--noheadings", "-o", "lv_name", guestVG); !strings.Contains(out, idF) || strings.Contains(out, idA) {
		t.Errorf("after deletes: %s", out)
	}
}
