package csi_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	mountutils "k8s.io/mount-utils"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/internal/overrides"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	"github.com/plinth-storage/plinth/test/prereq"
)

// loopDevice attaches a sparse file to a free loop device of the host's kernel and detaches it
// at cleanup; needs root and losetup (prereq).
func loopDevice(t *testing.T, size int64) (dev, file string) {
	t.Helper()
	prereq.Root(t, "the node service tests use loop devices, mkfs and mount")
	prereq.Commands(t, "losetup")
	file = filepath.Join(t.TempDir(), "disk.img")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, size); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("losetup", "--find", "--show", file).CombinedOutput()
	if err != nil {
		prereq.Missing(t, "a free loop device (losetup --find): %v: %s", err, out)
	}
	dev = strings.TrimSpace(string(out))
	t.Cleanup(func() {
		// After a failed test, mounts of dev may remain: unmount them before detaching.
		if infos, err := mountutils.ParseMountInfo("/proc/self/mountinfo"); err == nil {
			for i := len(infos) - 1; i >= 0; i-- {
				if infos[i].Source == dev {
					exec.Command("umount", infos[i].MountPoint).Run() //nolint:errcheck
				}
			}
		}
		// Only while dev is still ours (another process may have bound the number since).
		// `losetup --detach` of a device still held only marks it auto-clear: a filesystem
		// left frozen after its unmount would keep it, so removeLoop thaws that and says so.
		bf, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "backing_file"))
		if err != nil || strings.TrimSuffix(strings.TrimSpace(string(bf)), " (deleted)") != file {
			return
		}
		if frozen, err := removeLoop(dev); frozen || err != nil {
			t.Errorf("loop device %s at the end: left frozen %v, detach: %v", dev, frozen, err)
		}
	})
	return dev, file
}

type nodeEnv struct {
	state string
	node  csipb.NodeClient
	opts  csi.Options
}

// nodePlugin runs the node service (no API server: kubelet's calls only) with its stage
// records in state.
func nodePlugin(t *testing.T, state string) csipb.NodeClient {
	opts := csi.Options{Mode: csi.ModeNode, NodeName: "host-node", StateDir: state, HostNQNFile: filepath.Join(state, "no-hostnqn")}
	return csipb.NewNodeClient(startDriver(t, opts))
}

func fsCap(fs string, mode csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
	return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs}}, AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode}}
}

func isMounted(t *testing.T, path string) bool {
	t.Helper()
	m, err := mount.New().IsMounted(path)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func localPublish(dev string) map[string]string {
	return map[string]string{csi.ContextKind: "local", csi.PublishDevicePath: dev}
}

// The node lifecycle on a real loop device: stage formats the blank device, publish binds,
// stats, expand grows xfs after the device grew (ext4 online growth needs CAP_SYS_RESOURCE,
// which this test machine's sandbox withholds: resize2fs gets EPERM), unpublish and unstage clean up; a restarted
// plugin unstages from the record alone.
func TestNodeLifecycle(t *testing.T) {
	dev, file := loopDevice(t, 320<<20)
	state := filepath.Join(t.TempDir(), "state")
	node := nodePlugin(t, state)
	ctx := t.Context()
	root := t.TempDir()
	staging, target := filepath.Join(root, "staging"), filepath.Join(root, "pods", "target")
	const id = "vol-0000000000000000000000000000000000000001"
	stageReq := &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}
	if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
		t.Errorf("stage again: %v", err)
	}
	if !isMounted(t, staging) {
		t.Fatal("staging path not mounted")
	}
	if _, err := os.Stat(filepath.Join(state, id+".json")); err != nil {
		t.Errorf("no stage record: %v", err)
	}
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap("xfs", rwo)}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("kept"), 0o644); err != nil {
		t.Fatal(err)
	}
	stats, err := node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if err != nil || len(stats.GetUsage()) != 2 || stats.GetUsage()[0].GetTotal() <= 0 {
		t.Errorf("stats %v, %v", stats, err)
	}
	// Grow the device (as the agent would grow the LV/file), then expand the filesystem.
	before := stats.GetUsage()[0].GetTotal()
	if err := os.Truncate(file, 640<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity: %v %s", err, out)
	}
	exp, err := node.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging, CapacityRange: &csipb.CapacityRange{RequiredBytes: 640 << 20}})
	if err != nil || exp.GetCapacityBytes() != 640<<20 {
		t.Fatalf("expand: %v, %v", exp, err)
	}
	stats, _ = node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: id, VolumePath: target})
	if after := stats.GetUsage()[0].GetTotal(); after <= before {
		t.Errorf("filesystem %d bytes after expand, %d before", after, before)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target left behind: %v", err)
	}
	// A restarted plugin (new process, same state folder) unstages from the record.
	restarted := nodePlugin(t, state)
	if _, err := restarted.NodeStageVolume(ctx, stageReq); err != nil {
		t.Errorf("stage of a staged volume after restart: %v", err)
	}
	if _, err := restarted.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, staging) {
		t.Error("staging path still mounted after unstage returned OK")
	}
	if _, err := os.Stat(filepath.Join(state, id+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stage record left: %v", err)
	}
	// Unstage of what is not staged is OK.
	if _, err := restarted.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Errorf("unstage again: %v", err)
	}
	// The data survived: restage keeps the filesystem (no mkfs on a formatted device).
	if _, err := restarted.NodeStageVolume(ctx, stageReq); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(b) != "kept" {
		t.Errorf("data after restage: %q, %v", b, err)
	}
	if _, err := restarted.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	info, err := restarted.NodeGetInfo(ctx, &csipb.NodeGetInfoRequest{})
	if err != nil || info.GetNodeId() != "host-node" || info.GetAccessibleTopology().GetSegments()[policyv1.TopologyKeyNode] != "host-node" {
		t.Errorf("NodeGetInfo %v, %v", info, err)
	}
}

// A missing device is NOT_FOUND and nothing is formatted.
func TestNodeStageMissingDevice(t *testing.T) {
	prereq.Root(t, "NodeStageVolume checks block devices and mounts")
	node := nodePlugin(t, filepath.Join(t.TempDir(), "state"))
	_, err := node.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: "vol-x", StagingTargetPath: filepath.Join(t.TempDir(), "s"),
		VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish("/dev/plinth-gone")})
	wantCode(t, "stage of a missing device", err, codes.NotFound)
}

// Unpublish and unstage of a dead mount (xfs shut down: stat returns EIO) succeed only
// after unmounting; health reports it INACCESSIBLE before.
func TestNodeDeadMount(t *testing.T) {
	prereq.Commands(t, "xfs_io")
	dev, _ := loopDevice(t, 320<<20)
	node := nodePlugin(t, filepath.Join(t.TempDir(), "state"))
	ctx := t.Context()
	root := t.TempDir()
	staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
	const id = "vol-0000000000000000000000000000000000000017"
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap("xfs", rwo)}); err != nil {
		t.Fatal(err)
	}
	if sh, err := node.NodeGetStorageHealth(ctx, &csipb.NodeGetStorageHealthRequest{}); err != nil || len(sh.GetBackendHealth()) != 0 {
		t.Errorf("storage health with a healthy staged volume: %v, %v", sh, err)
	}
	if out, err := exec.Command("xfs_io", "-x", "-c", "shutdown", staging).CombinedOutput(); err != nil {
		t.Fatalf("xfs_io shutdown: %v %s", err, out)
	}
	h, err := node.NodeGetVolumeHealth(ctx, &csipb.NodeGetVolumeHealthRequest{VolumeId: id, VolumePublishPath: target, StagingTargetPath: staging})
	if err != nil || len(h.GetVolumeHealth().GetHealthStatuses()) == 0 || h.GetVolumeHealth().GetHealthStatuses()[0].GetStatus() != csipb.VolumeHealthErrorType_INACCESSIBLE {
		t.Errorf("health of a dead mount: %v, %v", h, err)
	}
	// The node's storage health names the volume under its reason.
	sh, err := node.NodeGetStorageHealth(ctx, &csipb.NodeGetStorageHealthRequest{})
	if b := sh.GetBackendHealth(); err != nil || len(b) != 1 || b[0].GetStatus() != csipb.StorageHealthErrorType_STORAGE_DEGRADED ||
		b[0].GetReason() != csi.ReasonMountDead || !strings.Contains(b[0].GetMessage(), id) {
		t.Errorf("storage health with a dead mount: %v, %v", sh, err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, target) {
		t.Error("dead target still mounted after OK")
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, staging) {
		t.Error("dead staging mount still mounted after OK")
	}
}

// A staging path mounted from a device that is gone, with no record, is an error — never
// a silent OK. Mountinfo is a recorded file naming a vanished device.
func TestNodeUnstageWithoutRecordDeviceGone(t *testing.T) {
	dir := t.TempDir()
	staging := filepath.Join(dir, "staging")
	info := filepath.Join(dir, "mountinfo")
	line := "100 1 259:3 / " + staging + " rw,relatime shared:1 - xfs /dev/nvme3n1 rw,nouuid\n"
	if err := os.WriteFile(info, []byte(line), 0o644); err != nil {
		t.Fatal(err)
	}
	m := mount.New()
	m.MountInfo = info
	opts := csi.Options{Mode: csi.ModeNode, NodeName: "host-node", StateDir: filepath.Join(dir, "state"), HostNQNFile: filepath.Join(dir, "none"), Mounter: m}
	node := csipb.NewNodeClient(startDriver(t, opts))
	_, err := node.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: "vol-c", StagingTargetPath: staging})
	wantCode(t, "unstage of a mount whose device vanished, no record", err, codes.Internal)
}

// A kubelet whose root dir is a symlink hands the plugin staging and target paths through it;
// mountinfo lists the resolved paths. Publish twice mounts once, and unpublish and unstage
// unmount and succeed (before, unpublish saw "not mounted", tried to remove a mount point and
// failed with "busy" on every retry).
func TestNodeSymlinkedKubeletDir(t *testing.T) {
	dev, _ := loopDevice(t, 320<<20)
	node := nodePlugin(t, filepath.Join(t.TempDir(), "state"))
	ctx := t.Context()
	root := t.TempDir()
	if err := os.Mkdir(filepath.Join(root, "real"), 0o750); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(filepath.Join(root, "real"), filepath.Join(root, "kubelet")); err != nil {
		t.Fatal(err)
	}
	staging, target := filepath.Join(root, "kubelet", "staging"), filepath.Join(root, "kubelet", "pods", "target")
	const id = "vol-0000000000000000000000000000000000000031"
	stageReq := &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}
	pubReq := &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap("xfs", rwo)}
	for range 2 {
		if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, pubReq); err != nil {
			t.Fatal(err)
		}
	}
	for _, p := range []string{staging, target} {
		if n := mountsAt(t, mount.Resolve(p)); n != 1 {
			t.Errorf("%d mounts at %s after stage and publish twice, want 1", n, mount.Resolve(p))
		}
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatalf("unpublish through the symlink: %v", err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatalf("unstage through the symlink: %v", err)
	}
	for _, p := range []string{staging, target} {
		if n := mountsAt(t, mount.Resolve(p)); n != 0 {
			t.Errorf("%d mounts left at %s", n, mount.Resolve(p))
		}
	}
	if _, err := os.Stat(target); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("target left behind: %v", err)
	}
}

// mountsAt counts the mountinfo entries whose mount point is path.
func mountsAt(t *testing.T, path string) int {
	t.Helper()
	infos, err := mountutils.ParseMountInfo("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, mi := range infos {
		if mi.MountPoint == path {
			n++
		}
	}
	return n
}

// NodeExpandVolume before the device shows the size asked (the agent has grown it part of the
// way) is UNAVAILABLE and leaves the filesystem as it is; once the device has the size it grows
// the filesystem, and asking again is success.
func TestNodeExpandWaitsForTheDevice(t *testing.T) {
	dev, file := loopDevice(t, 320<<20)
	node := nodePlugin(t, filepath.Join(t.TempDir(), "state"))
	ctx := t.Context()
	root := t.TempDir()
	staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
	const id = "vol-0000000000000000000000000000000000000032"
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}) //nolint:errcheck
	})
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap("xfs", rwo)}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		node.NodeUnpublishVolume(context.Background(), &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}) //nolint:errcheck
	})
	expand := func() (*csipb.NodeExpandVolumeResponse, error) {
		return node.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: 640 << 20}})
	}
	if err := os.Truncate(file, 480<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity: %v %s", err, out)
	}
	_, err := expand()
	wantCode(t, "expand with the device at 480 of 640 MiB", err, codes.Unavailable)
	if got, err := mount.FilesystemSize(dev, staging); err != nil || got != 320<<20 {
		t.Fatalf("filesystem %d bytes (%v) after a refused expand, want 320 MiB untouched", got, err)
	}
	if err := os.Truncate(file, 640<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity: %v %s", err, out)
	}
	for range 2 {
		if exp, err := expand(); err != nil || exp.GetCapacityBytes() != 640<<20 {
			t.Fatalf("expand once the device has 640 MiB: %v, %v", exp, err)
		}
	}
	if got, err := mount.FilesystemSize(dev, staging); err != nil || got != 640<<20 {
		t.Errorf("filesystem %d bytes (%v) after expand, want 640 MiB", got, err)
	}
}

// A torn stage record (the file cut mid-write, here to half its bytes) is reported and not
// acted on: unstage, publish and expand fail naming the record, and the staging mount stays;
// with the record whole again, unstage works.
func TestNodeTornStageRecord(t *testing.T) {
	dev, _ := loopDevice(t, 320<<20)
	state := filepath.Join(t.TempDir(), "state")
	node := nodePlugin(t, state)
	ctx := t.Context()
	root := t.TempDir()
	staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
	const id = "vol-0000000000000000000000000000000000000033"
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(state, id+".json")
	whole, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(file, whole[:len(whole)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging})
	if err == nil || !strings.Contains(err.Error(), file) {
		t.Errorf("unstage with a torn record: %v, want an error naming %s", err, file)
	}
	_, err = node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap("xfs", rwo)})
	if err == nil {
		t.Error("publish with a torn record succeeded")
	}
	if !isMounted(t, staging) {
		t.Fatal("the staging mount was acted on despite the torn record")
	}
	if err := os.WriteFile(file, whole, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if isMounted(t, staging) {
		t.Error("staging still mounted after unstage")
	}
}

// A volume restored from a snapshot larger than its source: the source's 320 MiB xfs, with a
// file, on a device of 640 MiB (the backend copied the snapshot and grew the copy). Kubelet asks
// for no NodeExpandVolume then, so NodeStageVolume grows the filesystem to the device; the data
// stays, and staging again runs no resize (the filesystem has the device's size).
func TestNodeStageGrowsARestoredFilesystem(t *testing.T) {
	prereq.Commands(t, "mkfs.xfs", "xfs_growfs")
	dev, file := loopDevice(t, 320<<20)
	m := mount.New()
	src := t.TempDir()
	if err := m.FormatAndMount(dev, src, "xfs", nil, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "data"), []byte("restored"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := m.Unmount(src, false); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(file, 640<<20); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("losetup", "--set-capacity", dev).CombinedOutput(); err != nil {
		t.Fatalf("losetup --set-capacity: %v %s", err, out)
	}
	node := nodePlugin(t, filepath.Join(t.TempDir(), "state"))
	ctx := t.Context()
	staging := filepath.Join(t.TempDir(), "staging")
	const id = "vol-0000000000000000000000000000000000000033"
	req := &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}
	if _, err := node.NodeStageVolume(ctx, req); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}) //nolint:errcheck
	})
	if got, err := mount.FilesystemSize(dev, staging); err != nil || got != 640<<20 {
		t.Errorf("filesystem %d bytes (%v) after stage, want the device's 640 MiB", got, err)
	}
	if b, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(b) != "restored" {
		t.Errorf("data after the grow: %q, %v", b, err)
	}
	if _, err := node.NodeStageVolume(ctx, req); err != nil {
		t.Errorf("stage again: %v", err)
	}
}

// A claim's allowed mkfs and mount overrides arrive on the device and the mount: the claim's
// annotations go through the controller's judging and merging (overrides.Parse, Apply) into the
// volume context, NodeStageVolume formats and mounts a loop device with them, and tune2fs -l or
// xfs_info and /proc/self/mountinfo show them. mount-utils puts its own "-F -m0" after the
// options it is given, so an ext4 "-m 1" never arrived: the node plugin now formats itself when
// there are options, its defaults first.
func TestNodeStageOptionsArrive(t *testing.T) {
	prereq.Commands(t, "tune2fs", "xfs_info", "mkfs.ext4", "mkfs.xfs")
	mkfsAnn := policyv1.OverrideAnnotations[policyv1.OverrideMkfsOptions]
	mountAnn := policyv1.OverrideAnnotations[policyv1.OverrideMountOptions]
	for _, tc := range []struct {
		fsType    string
		mkfs      string
		mount     string
		fsInfo    []string // lines (white space squeezed) tune2fs -l or xfs_info prints
		mountOpts []string // the mount's own options in mountinfo, exactly
		superOpts []string // among the filesystem's options in mountinfo
		reserved1 bool     // ext4: 1% of the blocks reserved (-m 1)
	}{
		{"ext4", "-m 1 -L claimdata -I 512", "nosuid,nodev,noexec,commit=30",
			[]string{"Filesystem volume name: claimdata", "Inode size: 512"},
			[]string{"rw", "nosuid", "nodev", "noexec", "noatime"}, []string{"commit=30"}, true},
		{"xfs", "-i size=512 -m reflink=0", "nosuid,logbsize=64k",
			[]string{"isize=512", "reflink=0"},
			[]string{"rw", "nosuid", "noatime"}, []string{"logbsize=64k", "nouuid"}, false},
	} {
		t.Run(tc.fsType, func(t *testing.T) {
			dev, _ := loopDevice(t, 320<<20)
			pl := &policyv1.Placement{}
			pl.Name = "opts"
			pl.Spec.Filesystem = policyv1.Filesystem{FSType: tc.fsType, MountOptions: []string{"noatime"}}
			pl.Spec.Overrides = &policyv1.Overrides{Allowed: []policyv1.OverrideParameter{policyv1.OverrideMkfsOptions, policyv1.OverrideMountOptions}}
			set, err := overrides.Parse(map[string]string{mkfsAnn: tc.mkfs, mountAnn: tc.mount}, pl, "")
			if err != nil {
				t.Fatal(err)
			}
			fs := pl.Spec.Filesystem
			strategy := policyv1.StrategyBinpack
			set.Apply(&fs, &strategy)
			mkfs, _ := json.Marshal(fs.MkfsOptions)
			mnt, _ := json.Marshal(fs.MountOptions)
			node := nodePlugin(t, filepath.Join(t.TempDir(), "state"))
			ctx := t.Context()
			staging := filepath.Join(t.TempDir(), "staging")
			const id = "vol-0000000000000000000000000000000000000035"
			pc := localPublish(dev)
			if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: staging,
				VolumeCapability: fsCap(tc.fsType, rwo), PublishContext: pc,
				VolumeContext: map[string]string{csi.ContextFSType: tc.fsType, csi.ContextMkfsOptions: string(mkfs), csi.ContextMountOptions: string(mnt)}}); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}) //nolint:errcheck
			})

			tool := exec.Command("tune2fs", "-l", dev)
			if tc.fsType == "xfs" {
				tool = exec.Command("xfs_info", staging)
			}
			out, err := tool.CombinedOutput()
			if err != nil {
				t.Fatalf("%v: %v %s", tool.Args, err, out)
			}
			info := strings.Join(strings.Fields(string(out)), " ")
			for _, want := range tc.fsInfo {
				if !strings.Contains(info, want) {
					t.Errorf("%v lacks %q:\n%s", tool.Args, want, out)
				}
			}
			if tc.reserved1 {
				var blocks, reserved int64
				for _, l := range strings.Split(string(out), "\n") {
					k, v, _ := strings.Cut(l, ":")
					n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
					switch k {
					case "Block count":
						blocks = n
					case "Reserved block count":
						reserved = n
					}
				}
				if blocks == 0 || reserved != blocks/100 {
					t.Errorf("tune2fs: %d of %d blocks reserved, want %d (-m 1)", reserved, blocks, blocks/100)
				}
			}

			infos, err := mountutils.ParseMountInfo("/proc/self/mountinfo")
			if err != nil {
				t.Fatal(err)
			}
			var found int
			for _, mi := range infos {
				if mi.MountPoint != mount.Resolve(staging) {
					continue
				}
				found++
				got := slices.Sorted(slices.Values(mi.MountOptions))
				if want := slices.Sorted(slices.Values(tc.mountOpts)); !slices.Equal(got, want) {
					t.Errorf("mountinfo: mount options %v, want exactly %v", got, want)
				}
				for _, o := range tc.superOpts {
					if !slices.Contains(mi.SuperOptions, o) {
						t.Errorf("mountinfo: filesystem options %v lack %s", mi.SuperOptions, o)
					}
				}
			}
			if found != 1 {
				t.Errorf("%d mounts at %s, want 1", found, staging)
			}
		})
	}
}
