package csi_test

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rawPart is one partition as `sfdisk --json` reports it (sectors).
type rawPart struct {
	Node        string `json:"node"`
	Start, Size int64
	Name        string `json:"name"`
}

// rawParts lists the partitions of the GPTs of disks.
func rawParts(t *testing.T, disks []string) []rawPart {
	t.Helper()
	var all []rawPart
	for _, d := range disks {
		var doc struct {
			PartitionTable struct {
				Partitions []rawPart `json:"partitions"`
			} `json:"partitiontable"`
		}
		if err := json.Unmarshal([]byte(run(t, "sfdisk", "--json", d)), &doc); err != nil {
			t.Fatal(err)
		}
		all = append(all, doc.PartitionTable.Partitions...)
	}
	return all
}

// signatureAt is what blkid finds at byte offset off of disk ("" for nothing).
// The whole disk's buffer cache is flushed and dropped first (blockdev --flushbufs): a
// partition written through its own device (mkfs on /dev/vdb1) is not seen through pages of the
// whole disk's device read before, which blkid would otherwise be handed.
func signatureAt(disk string, off int64) string {
	if out, err := exec.Command("blockdev", "--flushbufs", disk).CombinedOutput(); err != nil {
		// neither "" (nothing there) nor a filesystem: every caller's check fails on it
		return fmt.Sprintf("(blockdev --flushbufs %s: %v %s)", disk, err, out)
	}
	out, err := exec.Command("blkid", "-p", "-O", strconv.FormatInt(off, 10), "-o", "value", "-s", "TYPE", disk).Output()
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(out))
}

// TestInGuestRaw runs INSIDE the qemu guest of TestGuestCSISanityLVMNVMeoF, next to `plinth
// csi --mode all` and the agent, on real virtio disks: a raw GPT pool (two disks) and a raw
// Whole pool (two disks). Through the CSI driver: partitions appear and go (counted in the
// GPT), a partition with another right after it cannot grow (OUT_OF_RANGE, and its size stays
// what it is), the last one grows and the kernel sees it, a mounted volume is not deleted
// (DeleteVolume does not succeed, the partition and its filesystem stay) until it is
// unstaged, deletion wipes the filesystem's signature; a whole-disk volume takes the smallest
// disk that holds it, cannot grow, has no snapshots (INVALID_ARGUMENT), and GetCapacity
// offers the largest free disk, not the sum.
func TestInGuestRaw(t *testing.T) {
	sock := inGuestSocket(t)
	gptParams, wholeParams := readParams(t, "PLINTH_CSI_GUEST_RAW_PARAMS"), readParams(t, "PLINTH_CSI_GUEST_WHOLE_PARAMS")
	gptDisks := strings.Split(os.Getenv("PLINTH_CSI_GUEST_RAW_DISKS"), ",")
	wholeDisks := strings.Split(os.Getenv("PLINTH_CSI_GUEST_WHOLE_DISKS"), ",")
	nodeName := os.Getenv("PLINTH_CSI_GUEST_NODE")
	conn := dialUnix(t, sock)
	ctrl, node := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := t.Context()
	capability := fsCap("ext4", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
	create := func(name string, bytes int64, params map[string]string) *csipb.Volume {
		t.Helper()
		cv, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: bytes},
			VolumeCapabilities: []*csipb.VolumeCapability{capability}, Parameters: params})
		if err != nil {
			t.Fatalf("CreateVolume %s: %v", name, err)
		}
		return cv.GetVolume()
	}
	del := func(id string) {
		t.Helper()
		if _, err := ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Fatalf("DeleteVolume %s: %v", id, err)
		}
	}
	expand := func(id string, bytes int64) (*csipb.ControllerExpandVolumeResponse, error) {
		return ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id,
			CapacityRange: &csipb.CapacityRange{RequiredBytes: bytes}, VolumeCapability: capability})
	}
	r := &guestRaw{ctrl: ctrl, node: node, capability: capability, nodeName: nodeName, gptParams: gptParams, wholeParams: wholeParams,
		gptDisks: gptDisks, wholeDisks: wholeDisks, create: create, del: del, expand: expand}

	t.Run("GPT", func(t *testing.T) { guestRawGPT(t, r) })

	t.Run("Whole", func(t *testing.T) { guestRawWhole(t, r) })
}

// guestRaw is what the subtests of TestInGuestRaw share: the clients, the capability they
// stage with, the node, the classes' parameters and disks, and helpers that create, delete
// and expand a volume (failing the test that made them).
type guestRaw struct {
	ctrl                   csipb.ControllerClient
	node                   csipb.NodeClient
	capability             *csipb.VolumeCapability
	nodeName               string
	gptParams, wholeParams map[string]string
	gptDisks, wholeDisks   []string
	create                 func(name string, bytes int64, params map[string]string) *csipb.Volume
	del                    func(id string)
	expand                 func(id string, bytes int64) (*csipb.ControllerExpandVolumeResponse, error)
}

// guestRawGPT: volumes of the GPT class are partitions of the raw disks, through their life.
func guestRawGPT(t *testing.T, r *guestRaw) {
	ctx := t.Context()
	ctrl, node, capability, nodeName, gptParams, gptDisks, create, del, expand := r.ctrl, r.node, r.capability, r.nodeName, r.gptParams, r.gptDisks, r.create, r.del, r.expand
	before := len(rawParts(t, gptDisks))
	a := create("raw-a", 64<<20, gptParams)
	b := create("raw-b", 64<<20, gptParams)
	parts := rawParts(t, gptDisks)
	if len(parts) != before+2 || a.GetCapacityBytes() != 64<<20 || b.GetCapacityBytes() != 64<<20 {
		t.Fatalf("after two CreateVolume: %d partitions (want %d), capacities %d, %d (want 64 MiB)", len(parts), before+2, a.GetCapacityBytes(), b.GetCapacityBytes())
	}
	// b starts right where a ends (the largest free region's start): a cannot grow
	_, err := expand(a.GetVolumeId(), 128<<20)
	if status.Code(err) != codes.OutOfRange || !strings.Contains(err.Error(), "right after it") {
		t.Fatalf("ControllerExpand of a partition with another right after it: %v, want OUT_OF_RANGE saying why", err)
	}
	// the refused size is not kept: the volume is still what it is
	if again := create("raw-a", 64<<20, gptParams); again.GetVolumeId() != a.GetVolumeId() || again.GetCapacityBytes() != 64<<20 {
		t.Errorf("CreateVolume again after the refused expansion: %s, %d bytes; want %s, 64 MiB", again.GetVolumeId(), again.GetCapacityBytes(), a.GetVolumeId())
	}
	ex, err := expand(b.GetVolumeId(), 96<<20)
	if err != nil || ex.GetCapacityBytes() != 96<<20 || !ex.GetNodeExpansionRequired() {
		t.Fatalf("ControllerExpand of the last partition: %+v, %v", ex, err)
	}
	if len(rawParts(t, gptDisks)) != before+2 {
		t.Errorf("expansion changed the number of partitions")
	}

	// a staged (mounted) volume is never deleted silently
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: a.GetVolumeId(), NodeId: nodeName, VolumeCapability: capability})
	if err != nil {
		t.Fatal(err)
	}
	staging := filepath.Join(t.TempDir(), "staging")
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: a.GetVolumeId(), PublishContext: pub.GetPublishContext(),
		StagingTargetPath: staging, VolumeCapability: capability, VolumeContext: a.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	var dev string
	for _, l := range strings.Split(run(t, "cat", "/proc/self/mountinfo"), "\n") {
		if f := strings.Fields(l); len(f) > 9 && f[4] == staging {
			dev = f[len(f)-2]
		}
	}
	var pa rawPart
	disk := ""
	for _, d := range gptDisks {
		for _, p := range rawParts(t, []string{d}) {
			if p.Node == dev {
				pa, disk = p, d
			}
		}
	}
	if disk == "" {
		t.Fatalf("staging %s is mounted from %q, not a partition of %v", staging, dev, gptDisks)
	}
	if sig := signatureAt(disk, pa.Start*512); sig != "ext4" {
		t.Fatalf("staged partition %s holds %q, want ext4", dev, sig)
	}
	// unpublished but still mounted: what the agent sees when a node's unmount failed
	if _, err := ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: a.GetVolumeId(), NodeId: nodeName}); err != nil {
		t.Fatal(err)
	}
	short, cancel := context.WithTimeout(ctx, 20*time.Second)
	_, err = ctrl.DeleteVolume(short, &csipb.DeleteVolumeRequest{VolumeId: a.GetVolumeId()})
	cancel()
	if err == nil {
		t.Fatalf("DeleteVolume of a mounted raw volume succeeded")
	}
	t.Logf("DeleteVolume while mounted: %v", err)
	if n := len(rawParts(t, gptDisks)); n != before+2 || signatureAt(disk, pa.Start*512) != "ext4" {
		t.Fatalf("the mounted volume was touched: %d partitions (want %d), signature %q", n, before+2, signatureAt(disk, pa.Start*512))
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: a.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	del(a.GetVolumeId()) // the agent retries the deletion; now it goes through
	if n := len(rawParts(t, gptDisks)); n != before+1 {
		t.Fatalf("after deleting a: %d partitions, want %d", n, before+1)
	}
	if sig := signatureAt(disk, pa.Start*512); sig != "" {
		t.Errorf("a's area still carries a %s signature after DeleteVolume", sig)
	}
	del(b.GetVolumeId())
	if n := len(rawParts(t, gptDisks)); n != before {
		t.Fatalf("after deleting both: %d partitions, want %d", n, before)
	}
}

// guestRawWhole: a volume of the whole-disk class takes all of the smallest free disk; it
// cannot grow and has no snapshots.
func guestRawWhole(t *testing.T, r *guestRaw) {
	ctx := t.Context()
	ctrl, wholeParams, wholeDisks, create, del, expand := r.ctrl, r.wholeParams, r.wholeDisks, r.create, r.del, r.expand
	gc, err := ctrl.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: wholeParams})
	if err != nil {
		t.Fatal(err)
	}
	// the disks are 128 and 192 MiB: each offers its size less 2 MiB (GPT, alignment), and
	// the largest free disk bounds a volume
	if gc.GetAvailableCapacity() != 190<<20 {
		t.Errorf("GetCapacity of the whole-disk pool: %d, want 190 MiB (the largest free disk, not the sum)", gc.GetAvailableCapacity())
	}
	w := create("raw-whole", 20<<20, wholeParams)
	if w.GetCapacityBytes() != 126<<20 {
		t.Errorf("whole-disk volume of 20 MiB: %d bytes, want 126 MiB (all of the smallest disk)", w.GetCapacityBytes())
	}
	if parts := rawParts(t, wholeDisks[:1]); len(parts) != 1 || parts[0].Size*512 != 126<<20 {
		t.Errorf("the smallest disk holds %+v, want one partition of 126 MiB", parts)
	}
	if _, err := expand(w.GetVolumeId(), 127<<20); status.Code(err) != codes.OutOfRange {
		t.Errorf("ControllerExpand of a whole-disk volume: %v, want OUT_OF_RANGE", err)
	}
	_, err = ctrl.CreateSnapshot(ctx, &csipb.CreateSnapshotRequest{Name: "raw-snap", SourceVolumeId: w.GetVolumeId()})
	if status.Code(err) != codes.InvalidArgument {
		t.Errorf("CreateSnapshot of a raw volume: %v, want INVALID_ARGUMENT", err)
	}
	del(w.GetVolumeId())
	if n := len(rawParts(t, wholeDisks)); n != 0 {
		t.Errorf("after DeleteVolume: %d partitions on the whole disks, want 0", n)
	}
}
