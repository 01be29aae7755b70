package nvmet_test

// Guest tests: they run inside the qemu guest with Debian's kernel (make
// test-kernel; test/kernel/run.sh) against the real nvmet configfs and the
// real nvme-tcp initiator on 127.0.0.1. The spare disk /dev/vdc is reserved
// for this package (test/kernel/README.md).

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
	"syscall"
	"testing"
	"time"

	"github.com/plinth-storage/plinth/agents/nvmet"
)

const (
	guestDisk = "/dev/vdc"
	guestVG   = "plinth-nvmet"
)

func requireGuest(t *testing.T) {
	t.Helper()
	if os.Getenv("PLINTH_KERNEL_TEST") != "1" {
		t.Skip("kernel test: set PLINTH_KERNEL_TEST=1 (runs in the qemu guest via make test-kernel)")
	}
	if _, err := os.Stat(nvmet.DefaultRoot); err != nil {
		t.Fatalf("nvmet configfs not available: %v", err)
	}
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return strings.TrimSpace(string(out))
}

func timed(t *testing.T, op string, f func()) time.Duration {
	t.Helper()
	start := time.Now()
	f()
	d := time.Since(start)
	t.Logf("TIMING %-28s %8.3fs", op, d.Seconds())
	return d
}

// setupVG creates the test VG on the reserved disk and removes it afterwards.
func setupVG(t *testing.T) {
	t.Helper()
	timed(t, "vgcreate", func() {
		run(t, "pvcreate", "-ff", "-y", guestDisk)
		run(t, "vgcreate", "-y", guestVG, guestDisk)
	})
	t.Cleanup(func() {
		if out, err := exec.Command("vgremove", "-ff", "-y", guestVG).CombinedOutput(); err != nil {
			t.Errorf("vgremove: %v\n%s", err, out)
		}
		_ = exec.Command("pvremove", "-ff", "-y", guestDisk).Run()
	})
}

func lvcreate(t *testing.T, name, size string) string {
	t.Helper()
	timed(t, "lvcreate "+size, func() { run(t, "lvcreate", "-y", "-Wy", "-Zy", "-L", size, "-n", name, guestVG) })
	return "/dev/" + guestVG + "/" + name
}

func volumeID(name string) string {
	s := sha256.Sum256([]byte(name))
	return "vol-" + hex.EncodeToString(s[:])[:40]
}

// findNamespace returns /dev/nvmeXnY of the subsystem nqn, found through
// /sys/class/nvme-subsystem/*/subsysnqn (never the hidden nvmeXcYnZ path
// node of native multipath), and the subsystem's sysfs dir. It polls up to
// about 10 s (bounded attempts, no wall-clock assertion).
func findNamespace(t *testing.T, nqn string) (dev, subsys string) {
	t.Helper()
	for range 200 {
		ms, _ := filepath.Glob("/sys/class/nvme-subsystem/*/subsysnqn")
		for _, m := range ms {
			b, err := os.ReadFile(m)
			if err != nil || strings.TrimSpace(string(b)) != nqn {
				continue
			}
			dir := filepath.Dir(m)
			ns, _ := filepath.Glob(filepath.Join(dir, "nvme*n*"))
			for _, n := range ns {
				if _, err := os.Stat("/dev/" + filepath.Base(n)); err == nil {
					return "/dev/" + filepath.Base(n), dir
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Fatalf("no namespace of %s under /sys/class/nvme-subsystem", nqn)
	return "", ""
}

func subsystemGone(nqn string) bool {
	ms, _ := filepath.Glob("/sys/class/nvme-subsystem/*/subsysnqn")
	for _, m := range ms {
		if b, err := os.ReadFile(m); err == nil && strings.TrimSpace(string(b)) == nqn {
			return false
		}
	}
	return true
}

func sysAttr(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

func blockSize(t *testing.T, dev string) int64 {
	t.Helper()
	n, err := strconv.ParseInt(run(t, "blockdev", "--getsize64", dev), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func fileSHA256(t *testing.T, path string) string {
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

// TestKernelExportConnectResize is the NVMe-oF proof: export an LV,
// connect with the kernel initiator on 127.0.0.1, find the namespace by
// subsystem NQN, mkfs, write and checksum data, grow the LV online and see
// the new size without reconnecting, disconnect, unexport, remove the LV.
func TestKernelExportConnectResize(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	setupVG(t)
	volID := volumeID("pvc-kernel-export")
	dev := lvcreate(t, volID, "256M")
	nqn, err := nvmet.VolumeNQN(volID)
	if err != nil {
		t.Fatal(err)
	}
	hostNQN := sysAttr(t, "/etc/nvme/hostnqn")
	hostID := sysAttr(t, "/etc/nvme/hostid")
	tg := nvmet.New("")
	spec := nvmet.ExportSpec{
		NQN: nqn, DevicePath: dev, ACL: true, Hosts: []string{hostNQN},
		Endpoint: nvmet.Endpoint{Address: "127.0.0.1", ServiceID: "4420"},
	}
	t.Cleanup(func() {
		_ = exec.Command("umount", "/tmp/nvmet-mnt").Run()
		_ = exec.Command("nvme", "disconnect", "-n", nqn).Run()
		if err := tg.Unexport(ctx, nqn); err != nil {
			t.Errorf("cleanup unexport: %v", err)
		}
	})

	var res nvmet.Result
	timed(t, "export", func() {
		if res, err = tg.Export(ctx, spec); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("exported %s as %s on port %+v with %d configfs changes", dev, nqn, res.Port, len(res.Changes))
	// Idempotence against the real kernel's read-back formats (uuid, nguid,
	// padded serial, port attributes): a second Export writes nothing.
	timed(t, "export (converged, no-op)", func() {
		again, err := tg.Export(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		if len(again.Changes) != 0 {
			t.Fatalf("second export on the real kernel changed %q", again.Changes)
		}
	})

	// ACL: a host that is not allowed cannot connect.
	stranger := "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000ff"
	timed(t, "refused connect (ACL)", func() {
		if out, err := exec.Command("nvme", "connect", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420", "-n", nqn,
			"--hostnqn="+stranger, "--hostid=00000000-0000-4000-8000-0000000000ff").CombinedOutput(); err == nil {
			t.Fatalf("host outside the ACL connected: %s", out)
		}
	})

	timed(t, "connect (until namespace)", func() {
		run(t, "nvme", "connect", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420", "-n", nqn,
			"--hostnqn="+hostNQN, "--hostid="+hostID)
	})
	var ndev, sdir string
	timed(t, "find namespace in sysfs", func() { ndev, sdir = findNamespace(t, nqn) })
	t.Logf("initiator sees %s (%s)", ndev, sdir)

	id := nvmet.DeriveIdentity(nqn)
	blk := filepath.Join("/sys/block", filepath.Base(ndev))
	if got := sysAttr(t, filepath.Join(blk, "uuid")); got != id.UUID {
		t.Errorf("host sees namespace uuid %s, want derived %s", got, id.UUID)
	}
	if got := sysAttr(t, filepath.Join(blk, "nguid")); got != id.NGUID {
		t.Errorf("host sees namespace nguid %s, want derived %s", got, id.NGUID)
	}
	if got := sysAttr(t, filepath.Join(sdir, "serial")); got != id.Serial {
		t.Errorf("host sees serial %q, want derived %q", got, id.Serial)
	}
	if got := blockSize(t, ndev); got != 256<<20 {
		t.Fatalf("%s is %d bytes, want %d", ndev, got, 256<<20)
	}

	mnt := "/tmp/nvmet-mnt"
	if err := os.MkdirAll(mnt, 0o755); err != nil {
		t.Fatal(err)
	}
	timed(t, "mkfs.ext4", func() { run(t, "mkfs.ext4", "-q", "-F", ndev) })
	run(t, "mount", "-t", "ext4", ndev, mnt)
	data := filepath.Join(mnt, "data")
	timed(t, "write 16 MiB + fsync", func() {
		run(t, "dd", "if=/dev/urandom", "of="+data, "bs=1M", "count=16", "conv=fsync")
	})
	sum := fileSHA256(t, data)

	// Grow online: lvextend, revalidate_size, the connected host sees the
	// new size without reconnecting.
	timed(t, "lvextend +128M", func() { run(t, "lvextend", "-L", "+128M", guestVG+"/"+volID) })
	want := int64(384 << 20)
	var seen int64
	timed(t, "revalidate_size until seen", func() {
		if err := tg.RevalidateSize(ctx, nqn); err != nil {
			t.Fatal(err)
		}
		for range 200 {
			if seen = blockSize(t, ndev); seen == want {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
	if seen != want {
		t.Fatalf("after revalidate_size the host sees %d bytes, want %d", seen, want)
	}
	run(t, "resize2fs", ndev)
	run(t, "sync")
	run(t, "sh", "-c", "echo 3 > /proc/sys/vm/drop_caches")
	if got := fileSHA256(t, data); got != sum {
		t.Fatalf("checksum after resize %s, want %s", got, sum)
	}
	run(t, "umount", mnt)
	run(t, "e2fsck", "-f", "-n", ndev)

	timed(t, "disconnect", func() {
		run(t, "nvme", "disconnect", "-n", nqn)
		for range 200 {
			if subsystemGone(nqn) {
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		t.Fatal("subsystem still present after disconnect")
	})

	// The LV is held by the enabled namespace until unexport.
	if out, err := exec.Command("lvremove", "-y", guestVG+"/"+volID).CombinedOutput(); err == nil {
		t.Fatalf("lvremove succeeded while exported: %s", out)
	}
	timed(t, "unexport", func() {
		if err := tg.Unexport(ctx, nqn); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := os.Stat(filepath.Join(nvmet.DefaultRoot, "subsystems", nqn)); !os.IsNotExist(err) {
		t.Fatalf("subsystem left in configfs: %v", err)
	}
	if _, err := os.Stat(filepath.Join(nvmet.DefaultRoot, "ports", strconv.Itoa(int(res.Port.ID)))); !os.IsNotExist(err) {
		t.Fatalf("port left without links: %v", err)
	}
	if _, err := os.Stat(filepath.Join(nvmet.DefaultRoot, "hosts", hostNQN)); !os.IsNotExist(err) {
		t.Fatalf("host entry left: %v", err)
	}
	timed(t, "lvremove (device released)", func() { run(t, "lvremove", "-y", guestVG+"/"+volID) })
}

// TestKernelOrderingRules checks on the real kernel the configfs rules the
// package (and its kernelRulesFS test double) depend on, and that the package
// handles them: EBUSY, EACCES, EEXIST, EINVAL, and the silent acceptance of
// an over-long subsystem name (the NQN is silently truncated).
func TestKernelOrderingRules(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	setupVG(t)
	lv1 := lvcreate(t, "rules1", "16M")
	lv2 := lvcreate(t, "rules2", "16M")
	root := nvmet.DefaultRoot
	fs := nvmet.OSFS{}
	tg := nvmet.New("")
	nqn, _ := nvmet.VolumeNQN(volumeID("rules"))
	host := "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa"
	ep := nvmet.Endpoint{Address: "127.0.0.1", ServiceID: "4421"}
	t.Cleanup(func() {
		if err := tg.Unexport(ctx, nqn); err != nil {
			t.Errorf("cleanup unexport: %v", err)
		}
		_ = fs.Rmdir(filepath.Join(root, "hosts", host))
	})
	res, err := tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: lv1, Endpoint: ep})
	if err != nil {
		t.Fatal(err)
	}
	sdir := filepath.Join(root, "subsystems", nqn)
	ns := filepath.Join(sdir, "namespaces", "1")
	pdir := filepath.Join(root, "ports", strconv.Itoa(int(res.Port.ID)))

	expect := func(what string, err error, want syscall.Errno) {
		t.Helper()
		var ce *nvmet.ConfigfsError
		if !errors.Is(err, want) || !errors.As(err, &ce) {
			t.Errorf("%s: %v, want %v wrapped with its configfs path", what, err, want)
			return
		}
		t.Logf("kernel: %s → %v (%s)", what, want, ce.Path)
	}
	expect("device_path write while enabled", fs.WriteAttr(filepath.Join(ns, "device_path"), lv2), syscall.EBUSY)
	expect("device_uuid write while enabled", fs.WriteAttr(filepath.Join(ns, "device_uuid"), "00000000-0000-4000-8000-000000000001"), syscall.EBUSY)
	expect("addr_trsvcid write on enabled port", fs.WriteAttr(filepath.Join(pdir, "addr_trsvcid"), "4422"), syscall.EACCES)
	expect("duplicate port link", fs.Symlink(sdir, filepath.Join(pdir, "subsystems", nqn)), syscall.EEXIST)
	expect("mkdir namespaces/0", fs.Mkdir(filepath.Join(sdir, "namespaces", "0")), syscall.EINVAL)
	expect("mkdir namespaces/0xffffffff", fs.Mkdir(filepath.Join(sdir, "namespaces", "4294967295")), syscall.EINVAL)
	if err := fs.Mkdir(filepath.Join(root, "hosts", host)); err != nil && !errors.Is(err, syscall.EEXIST) {
		t.Fatal(err)
	}
	expect("allowed host link while allow_any_host=1", fs.Symlink(filepath.Join(root, "hosts", host), filepath.Join(sdir, "allowed_hosts", host)), syscall.EINVAL)
	expect("empty device_path", func() error {
		// on a disabled scratch namespace
		d := filepath.Join(sdir, "namespaces", "2")
		if err := fs.Mkdir(d); err != nil {
			return err
		}
		defer fs.Rmdir(d)
		return fs.WriteAttr(filepath.Join(d, "device_path"), "\n")
	}(), syscall.EINVAL)

	// The package handles EBUSY: a new device path is applied by disable,
	// write, enable; the same path leaves the namespace alone.
	var ch nvmet.Result
	timed(t, "export with new device_path", func() {
		if ch, err = tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: lv2, Endpoint: ep}); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("changes: %q", ch.Changes)
	if got, _ := fs.ReadAttr(filepath.Join(ns, "device_path")); got != lv2 {
		t.Fatalf("device_path %q, want %q", got, lv2)
	}
	// ACL on, then off, on the live subsystem (the order avoids EINVAL).
	if _, err := tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: lv2, Endpoint: ep, ACL: true, Hosts: []string{host}}); err != nil {
		t.Fatal(err)
	}
	expect("allow_any_host=1 with allowed hosts", fs.WriteAttr(filepath.Join(sdir, "attr_allow_any_host"), "1"), syscall.EINVAL)
	expect("duplicate allowed host link", fs.Symlink(filepath.Join(root, "hosts", host), filepath.Join(sdir, "allowed_hosts", host)), syscall.EEXIST)
	if _, err := tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: lv2, Endpoint: ep}); err != nil {
		t.Fatal(err)
	}
	ex, err := tg.Inspect(ctx, nqn)
	if err != nil {
		t.Fatal(err)
	}
	if !ex.AllowAnyHost || len(ex.Hosts) != 0 || len(ex.Ports) != 1 || ex.Namespaces[0].DevicePath != lv2 || !ex.Namespaces[0].Enabled {
		t.Fatalf("inspect %+v", ex)
	}

	// On the real kernel: a crash left the namespace enabled but no port
	// link; Export relinks without touching the namespace.
	if err := fs.Unlink(filepath.Join(pdir, "subsystems", nqn)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(pdir); err != nil {
		t.Fatalf("port removed by the kernel when its last link went: %v", err)
	}
	relinked, err := tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: lv2, Endpoint: ep})
	if err != nil {
		t.Fatal(err)
	}
	if len(relinked.Changes) != 1 || !strings.HasPrefix(relinked.Changes[0], "symlink "+filepath.Join(pdir, "subsystems", nqn)) {
		t.Fatalf("convergence after a lost port link changes %q, want only the port link", relinked.Changes)
	}

	// An address on no interface fails when the first link binds
	// the port; the error is surfaced and the port is not left behind.
	bad := nvmet.Endpoint{Address: "192.0.2.10", ServiceID: "4420"}
	badNQN, _ := nvmet.VolumeNQN(volumeID("unbindable"))
	_, err = tg.Export(ctx, nvmet.ExportSpec{NQN: badNQN, DevicePath: lv1, Endpoint: bad})
	t.Logf("export on an unassigned address: %v", err)
	var ce *nvmet.ConfigfsError
	if err == nil || !errors.As(err, &ce) {
		t.Fatalf("export on an unassigned address: %v, want a configfs link error", err)
	}
	badPort := nvmet.DerivePortID(nvmet.Port{Transport: "tcp", Family: "ipv4", Address: bad.Address, ServiceID: bad.ServiceID})
	if _, err := os.Stat(filepath.Join(root, "ports", strconv.Itoa(int(badPort)))); !os.IsNotExist(err) {
		t.Fatalf("unbindable port left: %v", err)
	}
	if err := tg.Unexport(ctx, badNQN); err != nil {
		t.Fatal(err)
	}

	// The kernel accepts an over-long subsystem directory (and keeps
	// only 223 bytes of the NQN), which is why names are validated first.
	long := "nqn.2026-01.io.example.storage:" + strings.Repeat("p", 200)
	if err := fs.Mkdir(filepath.Join(root, "subsystems", long)); err != nil {
		t.Logf("kernel refused a %d-byte subsystem name: %v", len(long), err)
	} else {
		t.Logf("kernel accepted a %d-byte subsystem name (truncation is silent)", len(long))
		if err := fs.Rmdir(filepath.Join(root, "subsystems", long)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := tg.Export(ctx, nvmet.ExportSpec{NQN: long, DevicePath: lv1, Endpoint: ep}); !errors.Is(err, nvmet.ErrInvalidNQN) {
		t.Fatalf("export of a %d-byte NQN: %v, want ErrInvalidNQN", len(long), err)
	}
}

// TestKernelRevokedHostIsCut shows on the real kernel why Export drops and re-makes the port
// link when a host leaves the ACL: removing the allowed_hosts link alone leaves the host's live
// controller working (its next direct read succeeds), while Export with the host gone cuts it —
// the controller leaves and, its reconnects refused, the initiator removes it (ctrl_loss_tmo 2 s).
func TestKernelRevokedHostIsCut(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	setupVG(t)
	volID := volumeID("pvc-kernel-revoke")
	dev := lvcreate(t, volID, "64M")
	nqn, err := nvmet.VolumeNQN(volID)
	if err != nil {
		t.Fatal(err)
	}
	hostNQN := sysAttr(t, "/etc/nvme/hostnqn")
	hostID := sysAttr(t, "/etc/nvme/hostid")
	tg := nvmet.New("")
	spec := nvmet.ExportSpec{NQN: nqn, DevicePath: dev, ACL: true, Hosts: []string{hostNQN},
		Endpoint: nvmet.Endpoint{Address: "127.0.0.1", ServiceID: "4420"}}
	t.Cleanup(func() {
		_ = exec.Command("nvme", "disconnect", "-n", nqn).Run()
		if err := tg.Unexport(ctx, nqn); err != nil {
			t.Errorf("cleanup unexport: %v", err)
		}
	})
	if _, err := tg.Export(ctx, spec); err != nil {
		t.Fatal(err)
	}
	run(t, "nvme", "connect", "-t", "tcp", "-a", "127.0.0.1", "-s", "4420", "-n", nqn,
		"--hostnqn="+hostNQN, "--hostid="+hostID, "--ctrl-loss-tmo=2", "--reconnect-delay=1")
	ndev, _ := findNamespace(t, nqn)
	read := func() error {
		return exec.Command("dd", "if="+ndev, "of=/dev/null", "bs=4096", "count=1", "iflag=direct").Run()
	}

	// The kernel's own behaviour: the ACL link removed by hand, the connection still serves I/O.
	link := filepath.Join(nvmet.DefaultRoot, "subsystems", nqn, "allowed_hosts", hostNQN)
	if err := os.Remove(link); err != nil {
		t.Fatal(err)
	}
	if err := read(); err != nil {
		t.Errorf("read after the ACL link alone was removed: %v (the kernel cut the host itself?)", err)
	}
	if err := os.Symlink(filepath.Join(nvmet.DefaultRoot, "hosts", hostNQN), link); err != nil {
		t.Fatal(err)
	}

	// Export without the host: the host link goes, then the port link is dropped and made again.
	res, err := tg.Export(ctx, nvmet.ExportSpec{NQN: nqn, DevicePath: dev, ACL: true, Endpoint: spec.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("revocation: %q", res.Changes)
	gone := false
	for range 600 { // bounded: ctrl_loss_tmo 2 s of refused reconnects, ~30 s at most under TCG
		if gone = subsystemGone(nqn); gone {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !gone {
		t.Fatalf("the revoked host's controller of %s is still there", nqn)
	}
	if err := read(); err == nil {
		t.Error("the revoked host still reads the namespace")
	}
}
