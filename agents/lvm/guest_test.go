package lvm

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
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

func requireGuest(t testing.TB) {
	t.Helper()
	if os.Getenv("PLINTH_KERNEL_TEST") != "1" {
		t.Skip("kernel test: set PLINTH_KERNEL_TEST=1 (runs in the qemu guest via make test-kernel)")
	}
}

func sh(t testing.TB, name string, args ...string) string {
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

func cleanupVG(t testing.TB, disk string) {
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

func rawLV(t testing.TB, name string) LV {
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

	// Linear, byte-precise sizes rounded UP to the extent.
	idA, idB := backend.VolumeID("one-byte"), backend.VolumeID("gib-plus-one")
	va := timed(t, "Create linear (lvcreate)", func() (backend.Volume, error) { return lin.Create(ctx, idA, 1) })
	vb := timed(t, "Create linear 1 GiB+1", func() (backend.Volume, error) { return lin.Create(ctx, idB, 1073741825) })
	if va.SizeBytes != 4194304 || vb.SizeBytes != 1077936128 {
		t.Errorf("sizes %d %d, want rounded up to the 4 MiB extent", va.SizeBytes, vb.SizeBytes)
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
	// VG free is not the thin capacity.
	t.Logf("thin capacity: %+v available=%d (VG free %d)", tc, tc.Available(0, 300), rawVG(t).FreeBytes)
	if got, want := tc.Available(0, 300), pool.SizeBytes*3-3<<30; got != want {
		t.Errorf("thin available %d, want %d", got, want)
	}
	// The identity stamp: LV tags written in one lvchange, read back by List, replaced (never
	// doubled) by a new stamp, refused as torn when a tag is lost; the data is not touched.
	stamp := identity.Stamp{VolumeID: idT, PVCNamespace: "shop", PVCName: "db-0", PVCUID: "u-1", PVName: "pvc-u-1",
		StorageClass: "plinth-thin", Placement: "thin", SizeBytes: 3 << 30, Filesystem: "xfs", VolumeMode: "Filesystem",
		PolicyDigest: strings.Repeat("ab", 16), StoreUID: "store-uid-1"}
	dataSum := sh(t, "sh", "-c", "head -c 33554432 "+vt.DevicePath+" | sha256sum")
	timed(t, "Stamp (lvchange --addtag)", func() (int, error) { return 0, thin.Stamp(ctx, stamp) })
	stamped := func() backend.Volume {
		t.Helper()
		vols, err := thin.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vols {
			if v.ID == idT {
				return v
			}
		}
		t.Fatalf("%s not listed", idT)
		return backend.Volume{}
	}
	if v := stamped(); v.Stamp == nil || *v.Stamp != stamp || v.StampErr != nil {
		t.Errorf("listed stamp %+v, %v; want %+v", v.Stamp, v.StampErr, stamp)
	}
	stamp.StoreUID = "store-uid-2"
	if err := thin.Stamp(ctx, stamp); err != nil {
		t.Fatal(err)
	}
	if got, err := thin.ReadStamp(ctx, idT); err != nil || got == nil || *got != stamp {
		t.Errorf("restamped %+v, %v", got, err)
	}
	n := 0
	for _, tag := range rawLV(t, idT).Tags {
		if strings.HasPrefix(tag, identity.LVTagPrefix) {
			n++
		}
	}
	if tags, _ := stamp.LVTags(); n != len(tags) {
		t.Errorf("%d stamp tags after a restamp, want %d", n, len(tags))
	}
	tags, _ := stamp.LVTags()
	sh(t, "lvchange", "--deltag", tags[len(tags)-1], guestVG+"/"+idT)
	if v := stamped(); v.Stamp != nil || !errors.Is(v.StampErr, identity.ErrTorn) {
		t.Errorf("stamp without its checksum tag listed as %+v, %v", v.Stamp, v.StampErr)
	}
	if got := sh(t, "sh", "-c", "head -c 33554432 "+vt.DevicePath+" | sha256sum"); got != dataSum {
		t.Error("stamping changed the volume's data")
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

const guestFastVG = "plinth-fast"

// guestCacheDisk is the fast VG's disk (test/kernel/README.md: /dev/vdd).
func guestCacheDisk() string {
	if d := os.Getenv("PLINTH_LVM_CACHE_DISK"); d != "" {
		return d
	}
	return "/dev/vdd"
}

// stopAllBcache stops every bcache device and cache set the kernel has registered.
func stopAllBcache() {
	for _, f := range globs("/sys/block/bcache*/bcache/stop", "/sys/fs/bcache/*-*/stop") {
		os.WriteFile(f, []byte("1"), 0o200)
	}
	for i := 0; i < 250 && len(globs("/sys/block/bcache*", "/sys/fs/bcache/*-*")) > 0; i++ {
		time.Sleep(20 * time.Millisecond)
	}
}

func globs(patterns ...string) []string {
	var out []string
	for _, p := range patterns {
		m, _ := filepath.Glob(p)
		out = append(out, m...)
	}
	return out
}

func readSys(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// deviceSum is the sha256 of the first n bytes of dev, read after dropping the page cache.
func deviceSum(t *testing.T, dev string, n int64) string {
	t.Helper()
	os.WriteFile("/proc/sys/vm/drop_caches", []byte("3"), 0o200)
	f, err := os.Open(dev)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.CopyN(h, f, n); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// TestGuestBcache: a cached volume on the real kernel's bcache — backing LV in the slow VG
// (/dev/vdb), cache LV of the ratio in the fast VG (/dev/vdd), /dev/bcacheN in the asked
// mode and attached; data reads back; capacity counts both VGs; a new backend instance (agent
// restart) re-finds the device, and after the devices are stopped and the VGs deactivated (what
// a reboot leaves) DevicePath brings the same volume back from the superblocks; a mode change
// of the policy reaches the running device; delete of a held device is refused, delete leaves
// no bcache device and no LV; without the bcache module Ensure fails before any command.
func TestGuestBcache(t *testing.T) {
	requireGuest(t)
	slow, fastDisk := guestDisk(), guestCacheDisk()
	ctx := context.Background()
	cleanup := func() {
		stopAllBcache()
		exec.Command("vgremove", "-ff", "-y", guestFastVG).Run()
		exec.Command("pvremove", "-ff", "-y", fastDisk).Run()
		exec.Command("wipefs", "-a", fastDisk).Run()
		cleanupVG(t, slow)
	}
	cleanup()
	t.Cleanup(cleanup)
	if _, err := os.Stat("/sys/fs/bcache"); err != nil {
		t.Fatalf("guest has no bcache (test/kernel/guest-init.sh loads it): %v", err)
	}
	cfg := Config{VolumeGroup: guestVG, Devices: []string{slow},
		Cache: &CacheConfig{VolumeGroup: guestFastVG, Devices: []string{fastDisk}, Mode: CacheModeWriteback, RatioPercent: 30}}
	l := mustNew(t, cfg)
	timed(t, "Ensure (two vgcreate)", func() (int, error) { return 0, l.Ensure(ctx) })

	id := backend.VolumeID("cached-1")
	v := timed(t, "Create cached (bcache)", func() (backend.Volume, error) { return l.Create(ctx, id, 512<<20) })
	if !regexp.MustCompile(`^/dev/bcache[0-9]+$`).MatchString(v.DevicePath) {
		t.Fatalf("device %q, want /dev/bcacheN", v.DevicePath)
	}
	if got := blockSize(t, v.DevicePath); v.SizeBytes < 512<<20 || got != v.SizeBytes {
		t.Errorf("volume %d bytes, device %d bytes, 512 MiB asked", v.SizeBytes, got)
	}
	sys := "/sys/block/" + filepath.Base(v.DevicePath) + "/bcache/"
	if mode := selected(readSys(t, sys+"cache_mode")); mode != CacheModeWriteback {
		t.Errorf("cache_mode %q, want writeback", mode)
	}
	set, err := os.Readlink(sys + "cache")
	if err != nil {
		t.Fatalf("not attached to a cache set: %v", err)
	}
	if state := readSys(t, sys+"state"); state != "clean" && state != "dirty" {
		t.Errorf("state %q, want clean or dirty (attached)", state)
	}
	t.Logf("device %s attached to cache set %s, state %s", v.DevicePath, filepath.Base(set), readSys(t, sys+"state"))
	// the cache LV: 30% of the 516 MiB backing LV (512 MiB + bcache's 8 KiB, in 4 MiB extents),
	// rounded up to an extent: 156 MiB
	backingLV, cacheLVRow := rawLV(t, id), rawLVIn(t, guestFastVG, id)
	if backingLV.SizeBytes != 516<<20 || cacheLVRow.SizeBytes != 156<<20 || !cacheLVRow.HasTag(TagCache) || cacheLVRow.HasTag(TagManaged) {
		t.Errorf("backing LV %d bytes, cache LV %d bytes tags %v; want 516 MiB and 156 MiB tagged %s only", backingLV.SizeBytes, cacheLVRow.SizeBytes, cacheLVRow.Tags, TagCache)
	}

	// data written through the bcache device reads back
	data := make([]byte, 24<<20)
	if _, err := rand.Read(data); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(data)
	want := hex.EncodeToString(sum[:])
	f, err := os.OpenFile(v.DevicePath, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(data); err != nil {
		t.Fatal(err)
	}
	if err := f.Sync(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if got := deviceSum(t, v.DevicePath, int64(len(data))); got != want {
		t.Errorf("read back %s, wrote %s", got, want)
	}
	for _, s := range []string{"dirty_data", "stats_total/cache_hits", "stats_total/cache_misses", "stats_total/bypassed"} {
		t.Logf("MEASURE bcache %s = %s", s, readSys(t, sys+s))
	}

	// capacity: the slow VG as the volumes' space, the fast VG as the cache space
	c := timed(t, "Capacity (two vgs+lvs)", func() (backend.Capacity, error) { return l.Capacity(ctx) })
	svg, fvg := rawVG(t), rawVGOf(t, guestFastVG)
	if c.TotalBytes != svg.SizeBytes || c.FreeBytes != svg.FreeBytes || c.ProvisionedBytes != backingLV.SizeBytes ||
		c.CacheTotalBytes != fvg.SizeBytes || c.CacheFreeBytes != fvg.FreeBytes || c.CacheProvisionedBytes != cacheLVRow.SizeBytes || c.CacheRatioPercent != 30 {
		t.Errorf("capacity %+v; slow VG %+v, fast VG %+v", c, svg, fvg)
	}
	if got, bound := c.Available(0, 0), fvg.FreeBytes*100/30; got != min(svg.FreeBytes, bound) {
		t.Errorf("available %d, want min(slow free %d, cache free ×100/30 = %d)", got, svg.FreeBytes, bound)
	}
	t.Logf("cached capacity: %+v available=%d", c, c.Available(0, 0))
	// a 1 GiB volume fits the slow VG, its 1 GiB cache (ratio 100%) not the fast VG: refused
	// before any lvcreate
	full := cfg
	full.Cache = &CacheConfig{VolumeGroup: guestFastVG, RatioPercent: 100}
	if _, err := mustNew(t, full).Create(ctx, backend.VolumeID("too-big-for-cache"), 1<<30); !errors.Is(err, backend.ErrInsufficientCapacity) || !strings.Contains(err.Error(), "cache") {
		t.Errorf("a volume whose cache does not fit the fast VG: %v, want ErrInsufficientCapacity naming the cache", err)
	} else {
		t.Logf("refused: %v", err)
	}
	if out := sh(t, "lvs", "--noheadings", "-o", "lv_name", guestVG); strings.Contains(out, backend.VolumeID("too-big-for-cache")) {
		t.Errorf("refused volume left an LV: %s", out)
	}

	// agent restart: a new backend instance finds the running device
	l2 := mustNew(t, cfg)
	if g := timed(t, "Get after restart", func() (backend.Volume, error) { return l2.Get(ctx, id) }); g.DevicePath != v.DevicePath {
		t.Errorf("after restart %q, was %q", g.DevicePath, v.DevicePath)
	}
	if vols, err := l2.List(ctx); err != nil || len(vols) != 1 || vols[0].DevicePath != v.DevicePath {
		t.Errorf("list after restart %+v %v", vols, err)
	}

	// what a reboot leaves: nothing registered, LVs inactive
	stopAllBcache()
	if left := globs("/sys/block/bcache*"); len(left) != 0 {
		t.Fatalf("bcache devices after stop: %v", left)
	}
	if out := sh(t, "bcache-super-show", "/dev/"+guestVG+"/"+id); !strings.Contains(out, "[writeback]") {
		t.Errorf("backing superblock does not keep writeback:\n%s", out)
	}
	sh(t, "vgchange", "-an", guestVG, guestFastVG)
	l3 := mustNew(t, cfg)
	timed(t, "Ensure after reboot", func() (int, error) { return 0, l3.Ensure(ctx) })
	if g, err := l3.Get(ctx, id); err != nil || g.DevicePath != "" {
		t.Errorf("unregistered volume: %+v %v, want no device path", g, err)
	}
	dev := timed(t, "DevicePath (register both)", func() (string, error) { return l3.DevicePath(ctx, id) })
	sys = "/sys/block/" + filepath.Base(dev) + "/bcache/"
	if mode := selected(readSys(t, sys+"cache_mode")); mode != CacheModeWriteback {
		t.Errorf("after re-registration cache_mode %q", mode)
	}
	if _, err := os.Readlink(sys + "cache"); err != nil {
		t.Errorf("not attached after re-registration: %v", err)
	}
	if got := deviceSum(t, dev, int64(len(data))); got != want {
		t.Errorf("after re-registration read %s, wrote %s", got, want)
	}
	t.Logf("re-found %s as %s after stop + deactivation", v.DevicePath, dev)

	// the policy's mode reaches the running device
	cfgAround := cfg
	cfgAround.Cache = &CacheConfig{VolumeGroup: guestFastVG, Mode: CacheModeWritearound, RatioPercent: 30}
	la := mustNew(t, cfgAround)
	if g, _ := la.Get(ctx, id); g.DevicePath != "" {
		t.Errorf("a device in writeback reported ready for a writearound policy: %+v", g)
	}
	if d := timed(t, "DevicePath (mode change)", func() (string, error) { return la.DevicePath(ctx, id) }); d != dev {
		t.Errorf("mode change moved the device: %s, was %s", d, dev)
	}
	if mode := selected(readSys(t, sys+"cache_mode")); mode != CacheModeWritearound {
		t.Errorf("cache_mode %q after the policy asked writearound", mode)
	}

	// delete while held (mounted holds it the same way) → ErrInUse, nothing stopped
	fd, err := syscall.Open(dev, syscall.O_RDONLY|syscall.O_EXCL, 0)
	if err != nil {
		t.Fatal(err)
	}
	err = la.Delete(ctx, id)
	syscall.Close(fd)
	if !errors.Is(err, backend.ErrInUse) {
		t.Errorf("delete of a held device: %v, want ErrInUse", err)
	} else if _, serr := os.Stat(sys); serr != nil {
		t.Errorf("refused delete stopped the device: %v", serr)
	}
	timed(t, "Delete cached", func() (int, error) { return 0, la.Delete(ctx, id) })
	if left := globs("/sys/block/bcache*", "/sys/fs/bcache/*-*"); len(left) != 0 {
		t.Errorf("after delete, still registered: %v", left)
	}
	for _, vg := range []string{guestVG, guestFastVG} {
		if out := strings.TrimSpace(sh(t, "lvs", "--noheadings", "-o", "lv_name", vg)); out != "" {
			t.Errorf("LVs left in %s: %s", vg, out)
		}
	}
	timed(t, "Delete absent", func() (int, error) { return 0, la.Delete(ctx, id) })

	// no bcache in the kernel: Ensure refuses (the agent reports the Store Stalled)
	// the cache sets' last references go asynchronously: rmmod may need a moment
	var rmErr error
	for i := 0; i < 100; i++ {
		if rmErr = exec.Command("rmmod", "bcache").Run(); rmErr == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if rmErr != nil {
		t.Fatalf("rmmod bcache: %v", rmErr)
	}
	defer sh(t, "modprobe", "bcache")
	err = mustNew(t, cfg).Ensure(ctx)
	if !errors.Is(err, backend.ErrMissingKernelModule) {
		t.Errorf("Ensure without bcache: %v, want ErrMissingKernelModule", err)
	}
	t.Logf("without the module: %v", err)
}

func rawVGOf(t *testing.T, vg string) VG {
	t.Helper()
	vgs, err := ParseVGs([]byte(sh(t, "vgs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", vgFields, vg)))
	if err != nil || len(vgs) != 1 {
		t.Fatalf("vgs %s: %v %v", vg, vgs, err)
	}
	return vgs[0]
}

func rawLVIn(t *testing.T, vg, name string) LV {
	t.Helper()
	lvs, err := ParseLVs([]byte(sh(t, "lvs", "--reportformat", "json", "--units", "b", "--nosuffix", "-o", lvFields, vg+"/"+name)))
	if err != nil || len(lvs) != 1 {
		t.Fatalf("lvs %s/%s: %v %v", vg, name, lvs, err)
	}
	return lvs[0]
}
