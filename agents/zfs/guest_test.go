package zfs

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/nvmet"
	"github.com/plinth-storage/plinth/internal/identity"
)

// Guest tests run in the qemu guest of test/kernel (make test-kernel) on the
// real kernel with OpenZFS built by test/kernel/zfs.sh. They own /dev/vda
// (test/kernel/README.md) and create the pool on the whole disk, as an
// operator would.

const (
	guestPool   = "plinthz"
	guestParent = "k8s/volumes"
	guestPort   = "4431"
)

func guestDisk() string {
	if d := os.Getenv("PLINTH_ZFS_DISK"); d != "" {
		return d
	}
	return "/dev/vda"
}

func requireGuest(t *testing.T) {
	t.Helper()
	if os.Getenv("PLINTH_KERNEL_TEST") != "1" {
		t.Skip("kernel test: set PLINTH_KERNEL_TEST=1 (runs in the qemu guest via make test-kernel)")
	}
	if _, err := os.Stat("/dev/zfs"); err != nil {
		t.Fatalf("zfs module not loaded (test/kernel/guest-init.sh): %v", err)
	}
}

func sh(t *testing.T, name string, args ...string) string {
	t.Helper()
	start := time.Now()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	if name == "zpool" || name == "zfs" {
		t.Logf("TIMING   cmd %-6s %-8s %6.0f ms (test)", name, args[0], float64(time.Since(start).Microseconds())/1000)
	}
	return strings.TrimSpace(string(out))
}

// timed runs op, logs its duration as a TIMING line (no assertion) and fails
// the test on error.
func timed[T any](t *testing.T, what string, op func() (T, error)) T {
	t.Helper()
	start := time.Now()
	v, err := op()
	t.Logf("TIMING %-34s %6.0f ms", what, float64(time.Since(start).Microseconds())/1000)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

func mustNew(t *testing.T, cfg Config) *ZFS {
	t.Helper()
	cfg.Pool, cfg.ParentDataset = guestPool, guestParent
	cfg.OnCommand = func(name string, args []string, d time.Duration, err error) {
		t.Logf("TIMING   cmd %-6s %-8s %6.0f ms (err=%v)", name, args[0], float64(d.Microseconds())/1000, err != nil)
	}
	z, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return z
}

func blockSize(t *testing.T, dev string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(sh(t, "blockdev", "--getsize64", dev), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func rawDataset(t *testing.T, name string) Dataset {
	t.Helper()
	ds, err := ParseDatasets([]byte(sh(t, "zfs", listArgs(name)...)))
	if err != nil || len(ds) != 1 {
		t.Fatalf("zfs list %s: %v %v", name, ds, err)
	}
	return ds[0]
}

// setupPool creates the test pool on the whole reserved disk (libzfs labels
// it GPT and waits for the udev database entries guest-init.sh provides) and
// destroys it afterwards.
func setupPool(t *testing.T) {
	t.Helper()
	disk := guestDisk()
	destroy := func() {
		exec.Command("zpool", "destroy", "-f", guestPool).Run()
		exec.Command("wipefs", "-a", disk+"1", disk+"9").Run()
		exec.Command("wipefs", "-a", disk).Run()
	}
	destroy()
	t.Cleanup(destroy)
	timed(t, "zpool create (whole disk)", func() (string, error) {
		out, err := exec.Command("zpool", "create", "-f", "-o", "ashift=12", guestPool, disk).CombinedOutput()
		return string(out), err
	})
}

func sha(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// findNamespace returns /dev/nvmeXnY of the subsystem nqn through
// /sys/class/nvme-subsystem/*/subsysnqn (bounded polling).
func findNamespace(t *testing.T, nqn string) string {
	t.Helper()
	for range 200 {
		ms, _ := filepath.Glob("/sys/class/nvme-subsystem/*/subsysnqn")
		for _, m := range ms {
			b, err := os.ReadFile(m)
			if err != nil || strings.TrimSpace(string(b)) != nqn {
				continue
			}
			ns, _ := filepath.Glob(filepath.Join(filepath.Dir(m), "nvme*n*"))
			for _, n := range ns {
				if _, err := os.Stat("/dev/" + filepath.Base(n)); err == nil {
					return "/dev/" + filepath.Base(n)
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no namespace of %s under /sys/class/nvme-subsystem", nqn)
	return ""
}

// TestGuestZvolLifecycle: the backend on a real pool — Ensure, volsize rounding
// with volblocksize, thick and sparse zvols, capacity against zfs list, the
// /dev/zvol link from zvol_id, ext4, export over NVMe-oF/TCP through
// agents/nvmet to the kernel initiator, online growth seen after
// revalidate_size, delete refused while exported, a refused expansion that
// leaves every property as it was, adoption, delete.
func TestGuestZvolLifecycle(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	setupPool(t)

	thick := mustNew(t, Config{VolBlockSize: 16 << 10, ReserveBytes: 64 << 20, Properties: map[string]string{"compression": "lz4"}})
	timed(t, "Ensure (zfs create -p parent)", func() (int, error) { return 0, thick.Ensure(ctx) })
	timed(t, "Ensure (existing)", func() (int, error) { return 0, thick.Ensure(ctx) })
	sparse := mustNew(t, Config{VolBlockSize: 16 << 10, Sparse: true, OvercommitPercent: 400})

	// 4,000,000,000 B with volblocksize 16K → 4,000,006,144 B (sparse: bigger than the 2 GiB pool).
	idB := backend.VolumeID("decimal-4g")
	vb := timed(t, "Create sparse 4e9 B", func() (backend.Volume, error) { return sparse.Create(ctx, idB, 4000000000) })
	if vb.SizeBytes != 4000006144 || !vb.Thin {
		t.Errorf("sparse 4e9 B: %+v, want 4000006144 bytes, thin", vb)
	}
	if d := rawDataset(t, vb.Name); d.VolSizeBytes != 4000006144 || d.VolBlockSizeBytes != 16384 || d.RefReservationBytes != 0 || d.Managed != ManagedValue {
		t.Errorf("sparse 4e9 B, zfs list: %+v", d)
	}
	pb := timed(t, "DevicePath (wait for /dev/zvol link)", func() (string, error) { return sparse.DevicePath(ctx, idB) })
	if blockSize(t, pb) != 4000006144 {
		t.Errorf("sparse 4e9 B, device size %d", blockSize(t, pb))
	}

	// Thick zvol: refreservation, the link maps to /dev/zdN by the kernel's own name.
	idA := backend.VolumeID("thick-a")
	va := timed(t, "Create thick 256 MiB+1 (zfs create)", func() (backend.Volume, error) { return thick.Create(ctx, idA, 256<<20+1) })
	if va.SizeBytes != 256<<20+16384 || va.Thin {
		t.Errorf("thick: %+v", va)
	}
	da := rawDataset(t, va.Name)
	if da.RefReservationBytes < va.SizeBytes {
		t.Errorf("thick refreservation %d < volsize %d", da.RefReservationBytes, va.SizeBytes)
	}
	if got := sh(t, "zfs", "get", "-Hp", "-o", "value", "compression", va.Name); got != "lz4" {
		t.Errorf("compression %q", got)
	}
	pa := timed(t, "DevicePath thick", func() (string, error) { return thick.DevicePath(ctx, idA) })
	if pa != "/dev/zvol/"+va.Name {
		t.Errorf("device path %q", pa)
	}
	target, err := filepath.EvalSymlinks(pa)
	if err != nil || !strings.HasPrefix(target, "/dev/zd") {
		t.Fatalf("link %s → %s %v", pa, target, err)
	}
	if name := sh(t, "/lib/udev/zvol_id", target); name != va.Name {
		t.Errorf("zvol_id %s = %q, want %q", target, name, va.Name)
	}
	if got := strings.TrimSpace(sh(t, "cat", "/sys/block/"+filepath.Base(target)+"/queue/physical_block_size")); got != "16384" {
		t.Errorf("physical_block_size %s", got)
	}
	t.Logf("%s → %s", pa, target)

	// Capacity equals ZFS's accounting of the parent (one zfs list), provisioned = Σ volsize.
	c := timed(t, "Capacity (zfs list)", func() (backend.Capacity, error) { return thick.Capacity(ctx) })
	par := rawDataset(t, guestPool+"/"+guestParent)
	if c.TotalBytes != par.UsedBytes+par.AvailableBytes || c.FreeBytes != par.AvailableBytes || c.ProvisionedBytes != va.SizeBytes+vb.SizeBytes || c.ExtentBytes != 16384 {
		t.Errorf("capacity %+v, parent %+v", c, par)
	}
	pools, err := ParsePools([]byte(sh(t, "zpool", "list", "-Hp", "-o", strings.Join(poolFields, ","), guestPool)))
	if err != nil || len(pools) != 1 || pools[0].Health != "ONLINE" || c.TotalBytes > pools[0].SizeBytes {
		t.Errorf("pool %+v %v (capacity total %d)", pools, err, c.TotalBytes)
	}
	t.Logf("capacity %+v available=%d; zpool %+v", c, c.Available(64<<20, 0), pools)

	// ext4 on the zvol, data with a checksum.
	sh(t, "mkfs.ext4", "-q", "-F", pa)
	mnt := t.TempDir()
	sh(t, "mount", "-t", "ext4", pa, mnt)
	sh(t, "dd", "if=/dev/urandom", "of="+mnt+"/data", "bs=1M", "count=16", "conv=fsync")
	sum := sha(t, mnt+"/data")
	sh(t, "umount", mnt)

	// The identity stamp: one user property written by one zfs set, read back by List's one
	// zfs list, replaced (one local property, never two) by a new stamp; the same property
	// inherited from the parent names another volume and is refused as torn; the data is not
	// touched.
	stamp := testStamp(idA)
	devSum := sh(t, "sh", "-c", "head -c 33554432 "+pa+" | sha256sum")
	timed(t, "Stamp (zfs set "+PropIdentity+")", func() (int, error) { return 0, thick.Stamp(ctx, stamp) })
	listed := func(id string) backend.Volume {
		t.Helper()
		vols, err := thick.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range vols {
			if v.ID == id {
				return v
			}
		}
		t.Fatalf("%s not listed", id)
		return backend.Volume{}
	}
	if v := listed(idA); v.Stamp == nil || *v.Stamp != stamp || v.StampErr != nil {
		t.Errorf("listed stamp %+v, %v; want %+v", v.Stamp, v.StampErr, stamp)
	}
	stamp.StoreUID = "store-2"
	if err := thick.Stamp(ctx, stamp); err != nil {
		t.Fatal(err)
	}
	if got, err := thick.ReadStamp(ctx, idA); err != nil || got == nil || *got != stamp {
		t.Errorf("restamped %+v, %v", got, err)
	}
	line, _ := stamp.Line()
	if got := sh(t, "zfs", "get", "-H", "-o", "value,source", PropIdentity, va.Name); got != line+"\tlocal" {
		t.Errorf("zfs get %s: %q", PropIdentity, got)
	}
	sh(t, "zfs", "set", PropIdentity+"="+line, guestPool+"/"+guestParent)
	if v := listed(idB); v.Stamp != nil || !errors.Is(v.StampErr, identity.ErrTorn) {
		t.Errorf("stamp inherited from the parent listed as %+v, %v", v.Stamp, v.StampErr)
	}
	sh(t, "zfs", "inherit", PropIdentity, guestPool+"/"+guestParent)
	if v := listed(idB); v.Stamp != nil || v.StampErr != nil {
		t.Errorf("unstamped zvol listed with %+v, %v", v.Stamp, v.StampErr)
	}
	if got := sh(t, "sh", "-c", "head -c 33554432 "+pa+" | sha256sum"); got != devSum {
		t.Error("stamping changed the zvol's data")
	}

	// Export over NVMe-oF/TCP (agents/nvmet) and connect with the kernel initiator.
	tgt := nvmet.New(nvmet.DefaultRoot)
	nqn, err := nvmet.VolumeNQN(idA)
	if err != nil {
		t.Fatal(err)
	}
	hostNQN := sh(t, "cat", "/etc/nvme/hostnqn")
	timed(t, "nvmet Export", func() (nvmet.Result, error) {
		return tgt.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: pa, Endpoint: nvmet.Endpoint{Address: "127.0.0.1", ServiceID: guestPort}, ACL: true, Hosts: []string{hostNQN}})
	})
	t.Cleanup(func() {
		exec.Command("umount", mnt).Run()
		exec.Command("nvme", "disconnect", "-n", nqn).Run()
		tgt.Unexport(context.Background(), nqn)
	})
	timed(t, "nvme connect", func() (string, error) {
		out, err := exec.Command("nvme", "connect", "-t", "tcp", "-a", "127.0.0.1", "-s", guestPort, "-n", nqn, "--hostnqn="+hostNQN).CombinedOutput()
		return string(out), err
	})
	dev := findNamespace(t, nqn)
	if blockSize(t, dev) != va.SizeBytes {
		t.Errorf("initiator size %d, want %d", blockSize(t, dev), va.SizeBytes)
	}
	sh(t, "mount", "-t", "ext4", dev, mnt)
	if got := sha(t, mnt+"/data"); got != sum {
		t.Errorf("checksum over NVMe-oF %s, want %s", got, sum)
	}

	// Delete refused while exported (ZFS: dataset is busy) → ErrInUse with command and stderr.
	err = thick.Delete(ctx, idA)
	var ce *backend.CommandError
	if !errors.Is(err, backend.ErrInUse) || !errors.As(err, &ce) || !strings.Contains(err.Error(), "zfs destroy") {
		t.Errorf("delete while exported: %v", err)
	} else {
		t.Logf("delete while exported refused: %v", err)
	}

	// Online growth while exported and mounted: volsize, revalidate_size, resize2fs.
	ve := timed(t, "Expand thick while exported", func() (backend.Volume, error) { return thick.Expand(ctx, idA, 512<<20) })
	if ve.SizeBytes != 512<<20 || blockSize(t, pa) != 512<<20 {
		t.Errorf("expanded %+v, zvol %d", ve, blockSize(t, pa))
	}
	timed(t, "nvmet RevalidateSize", func() (int, error) { return 0, tgt.RevalidateSize(ctx, nqn) })
	grown := false
	for range 100 {
		if blockSize(t, dev) == 512<<20 {
			grown = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !grown {
		t.Errorf("initiator still sees %d after revalidate_size", blockSize(t, dev))
	}
	sh(t, "resize2fs", dev)
	sh(t, "dd", "if=/dev/urandom", "of="+mnt+"/data2", "bs=1M", "count=16", "conv=fsync")
	if got := sha(t, mnt+"/data"); got != sum {
		t.Errorf("checksum after growth %s", got)
	}

	// A refused expansion leaves every property as it was:
	// grow by all that is available; the refreservation's metadata share does not fit.
	// (A backend without reserve, so that the pre-check lets it through to ZFS.)
	noReserve := mustNew(t, Config{VolBlockSize: 16 << 10})
	before := rawDataset(t, va.Name)
	cb, _ := noReserve.Capacity(ctx)
	_, err = noReserve.Expand(ctx, idA, before.VolSizeBytes+cb.FreeBytes/16384*16384)
	if !errors.Is(err, backend.ErrInsufficientCapacity) || !strings.Contains(err.Error(), "zfs set volsize=") {
		t.Errorf("expand into the metadata share: %v", err)
	} else {
		t.Logf("refused by ZFS: %v", err)
	}
	if after := rawDataset(t, va.Name); after.VolSizeBytes != before.VolSizeBytes || after.RefReservationBytes != before.RefReservationBytes {
		t.Errorf("properties changed by a failed expansion: %+v → %+v", before, after)
	}
	if _, err := thick.Expand(ctx, idA, 64<<30); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("expand beyond the pool: %v", err)
	}

	// Teardown order: unmount, disconnect, unexport, then the zvol goes.
	sh(t, "umount", mnt)
	sh(t, "nvme", "disconnect", "-n", nqn)
	timed(t, "nvmet Unexport", func() (int, error) { return 0, tgt.Unexport(ctx, nqn) })

	// Adoption after a crash; a foreign zvol is never listed or destroyed.
	idC, idF := backend.VolumeID("crash"), backend.VolumeID("foreign")
	sh(t, "zfs", "create", "-V", "16m", "-b", "16k", "-o", PropManaged+"=true", guestPool+"/"+guestParent+"/"+idC)
	sh(t, "zfs", "create", "-V", "16m", guestPool+"/"+guestParent+"/"+idF)
	if v, err := thick.Create(ctx, idC, 16<<20); err != nil || v.SizeBytes != 16<<20 {
		t.Errorf("adopt: %+v %v", v, err)
	}
	if _, err := thick.Create(ctx, idF, 16<<20); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("foreign: %v", err)
	}
	l := timed(t, "List (zfs list)", func() ([]backend.Volume, error) { return thick.List(ctx) })
	if len(l) != 3 {
		t.Errorf("list %+v", l)
	}
	for _, v := range l {
		if v.ID == idF {
			t.Errorf("foreign listed: %+v", v)
		}
	}
	timed(t, "Get", func() (backend.Volume, error) { return thick.Get(ctx, idA) })

	for _, id := range []string{idA, idC} {
		timed(t, "Delete thick (zfs destroy)", func() (int, error) { return 0, thick.Delete(ctx, id) })
	}
	timed(t, "Delete sparse (zfs destroy)", func() (int, error) { return 0, sparse.Delete(ctx, idB) })
	timed(t, "Delete absent", func() (int, error) { return 0, thick.Delete(ctx, idA) })
	if _, err := thick.Get(ctx, idA); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("get deleted: %v", err)
	}
	// udev's job done by the guest's zvol_id handler: the links go with the zvols.
	gone := false
	for range 100 {
		if _, err := os.Lstat(pa); os.IsNotExist(err) {
			gone = true
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if !gone {
		t.Errorf("%s still there after destroy", pa)
	}
	if out := sh(t, "zfs", "list", "-H", "-o", "name", "-r", guestPool+"/"+guestParent); !strings.Contains(out, idF) || strings.Contains(out, idA) {
		t.Errorf("after deletes: %s", out)
	}
}

// TestGuestMissingPool: a pool that is not imported is ErrNotFound, never created.
func TestGuestMissingPool(t *testing.T) {
	requireGuest(t)
	z, err := New(Config{Pool: "plinthnopool", ParentDataset: "x"})
	if err != nil {
		t.Fatal(err)
	}
	err = z.Ensure(context.Background())
	if !errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "zpool list") {
		t.Errorf("Ensure without pool: %v", err)
	}
	t.Logf("missing pool: %v", err)
}
