package csi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/test/prereq"
)

// noLeftovers fails t unless, once every other cleanup of t has run (the driver's and the
// agents' stops, the tests' unpublish, unstage and delete), nothing of t is left on this host:
// no mount under t's temporary folder and no loop device backed by a file in it. A filesystem
// left frozen is such a loop device: Linux unmounts a frozen filesystem but keeps its
// superblock, frozen, holding the device with no mount and no holder to show. What it finds
// it reports, then removes (unmount; thaw through a mount of the device; detach), so one
// failed run does not leave the host to the next. Call it first in the test: cleanups run
// last-registered first.
func noLeftovers(t *testing.T) {
	t.Helper()
	root := filepath.Dir(t.TempDir()) // t's folder: every t.TempDir is under it
	t.Cleanup(func() {
		for _, err := range leftoversUnder(root) {
			t.Error(err)
		}
	})
}

// leftoversUnder finds, reports and removes the mounts under root and the loop devices backed
// by files under it; one error per leftover.
func leftoversUnder(root string) []error {
	var errs []error
	infos, err := mountinfo.GetMounts(mountinfo.PrefixFilter(root))
	if err != nil {
		return []error{fmt.Errorf("read mounts: %w", err)}
	}
	for i := len(infos) - 1; i >= 0; i-- { // the last mounted first: a bind mount before its source
		mp := infos[i].Mountpoint
		errs = append(errs, fmt.Errorf("left mounted: %s (%s from %s)", mp, infos[i].FSType, infos[i].Source))
		if err := unix.Unmount(mp, 0); err != nil {
			errs = append(errs, fmt.Errorf("remove the leftover mount %s: %w", mp, err))
		}
	}
	loops, err := filepath.Glob("/sys/block/loop*/loop/backing_file")
	if err != nil {
		return append(errs, err)
	}
	for _, bf := range loops {
		data, err := os.ReadFile(bf)
		if err != nil {
			continue // detached meanwhile
		}
		file := strings.TrimSuffix(strings.TrimSpace(string(data)), " (deleted)")
		if !strings.HasPrefix(file, root+"/") {
			continue
		}
		dev := "/dev/" + filepath.Base(filepath.Dir(filepath.Dir(bf)))
		frozen, err := removeLoop(dev)
		switch {
		case frozen:
			errs = append(errs, fmt.Errorf("left frozen: the filesystem of %s (backed by %s), unmounted but never thawed", dev, file))
		default:
			errs = append(errs, fmt.Errorf("left attached: %s backed by %s", dev, file))
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("remove the leftover %s: %w", dev, err))
		}
	}
	return errs
}

// fiThawIoctl is FITHAW, _IOWR('X', 120, int) of linux/fs.h (x/sys/unix has no name for it).
const fiThawIoctl = 0xc0045878

// removeLoop detaches loop device dev. A device something still holds (an exclusive open
// fails EBUSY) with no mount is a superblock left frozen: mounting the device again reaches
// that superblock, FITHAW thaws it (frozen: true), and the unmount then releases the device.
func removeLoop(dev string) (frozen bool, err error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		dir, merr := os.MkdirTemp("", "plinth-leftover-")
		if merr != nil {
			return false, merr
		}
		defer os.Remove(dir)
		if out, merr := exec.Command("mount", dev, dir).CombinedOutput(); merr != nil {
			return false, fmt.Errorf("held, and mount to thaw it: %v: %s", merr, out)
		}
		if d, oerr := os.Open(dir); oerr == nil {
			frozen = unix.IoctlSetInt(int(d.Fd()), fiThawIoctl, 0) == nil
			d.Close()
		}
		if uerr := unix.Unmount(dir, 0); uerr != nil {
			return frozen, fmt.Errorf("unmount %s: %w", dir, uerr)
		}
		fd, err = unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	}
	if err != nil {
		return frozen, fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return frozen, fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err)
	}
	return frozen, nil
}

// teardown undoes what a test did with volume id, as kubelet and csi-provisioner would:
// NodeUnpublish (target ""), NodeUnstage (staging ""), ControllerUnpublish from nodeID (""),
// DeleteVolume. Each call is idempotent (CSI spec), so it runs as a cleanup registered before
// the first of them, whatever the test reached; a failed call fails t.
func teardown(t *testing.T, ctrl csipb.ControllerClient, node csipb.NodeClient, id, nodeID, staging, target string) {
	t.Helper()
	// t.Context() is done before cleanups run; bounded, so a volume that cannot go (still
	// mounted, frozen) fails the test instead of hanging it
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if target != "" {
		if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
			t.Errorf("cleanup: NodeUnpublishVolume %s: %v", id, err)
		}
	}
	if staging != "" {
		if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Errorf("cleanup: NodeUnstageVolume %s: %v", id, err)
		}
	}
	if nodeID != "" {
		if _, err := ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeID}); err != nil {
			t.Errorf("cleanup: ControllerUnpublishVolume %s: %v", id, err)
		}
	}
	if _, err := ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
		t.Errorf("cleanup: DeleteVolume %s: %v", id, err)
	}
}

// TestLeftoversFindFrozenFilesystem: a filesystem frozen and then unmounted (Linux lets that
// umount succeed) leaves no mount, only its loop device held by the frozen superblock; the
// end-of-test check reports it as left frozen, and removing it thaws the superblock and
// detaches the device.
func TestLeftoversFindFrozenFilesystem(t *testing.T) {
	dev, _ := loopDevice(t, 320<<20)
	prereq.Commands(t, "mkfs.xfs", "mount")
	root := filepath.Dir(t.TempDir())
	mnt := t.TempDir()
	if out, err := exec.Command("mkfs.xfs", "-q", dev).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", dev, mnt).CombinedOutput(); err != nil {
		t.Fatalf("mount: %v: %s", err, out)
	}
	if err := mount.Freeze(mnt); err != nil {
		t.Fatal(err)
	}
	if err := unix.Unmount(mnt, 0); err != nil {
		mount.Thaw(mnt) //nolint:errcheck // the kernel refused: nothing leaks
		t.Fatalf("umount of the frozen filesystem: %v (this kernel refuses it: nothing can leak this way)", err)
	}
	errs := leftoversUnder(root)
	if len(errs) != 1 || !strings.Contains(errs[0].Error(), "left frozen: the filesystem of "+dev) {
		t.Errorf("leftovers %v; want one: %s left frozen", errs, dev)
	}
	if _, err := os.Stat(filepath.Join("/sys/block", filepath.Base(dev), "loop")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s still attached after its removal (%v)", dev, err)
	}
	if _, err := os.Stat(filepath.Join("/sys/fs/xfs", filepath.Base(dev))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the xfs superblock of %s is still there after its removal (%v)", dev, err)
	}
}
