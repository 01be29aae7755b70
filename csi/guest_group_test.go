package csi_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/yaml"
)

// groupRecordBytes is one record of the group snapshot's writer: a block of the volume, at
// offset n × groupRecordBytes for record n (n ≥ 1), holding a magic number and n.
const (
	groupRecordBytes = 4096
	groupRecordMagic = 0x706c696e74686772 // "plinthgr"
)

func blockCap() *csipb.VolumeCapability {
	return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: rwo}}
}

// TestInGuestGroupSnapshot proves the instant of a group snapshot on one Store of ZFS: a writer appends numbered records to block volume
// A, then B, then A..., each write synchronous (O_DSYNC: acknowledged by the device before
// the next is issued), while CreateVolumeGroupSnapshot runs. Record n reaches B only after it
// was acknowledged on A, so in volumes restored from a crash-consistent group B's last record
// is never ahead of A's. The writer keeps writing after the snapshot (the origins were
// resumed), a retry returns the same group, a group with a missing member is NOT_FOUND naming
// it and leaves nothing, and deleting the group deletes its members. On thin LVM (over NVMe-oF)
// a group of two volumes is FAILED_PRECONDITION and leaves no member (Plinth cannot take it at
// one instant yet), and a group of one is taken.
func TestInGuestGroupSnapshot(t *testing.T) {
	sock := os.Getenv("PLINTH_CSI_GUEST_SOCKET")
	if sock == "" {
		t.Skip("runs in the qemu guest of TestGuestCSISanityLVMNVMeoF (PLINTH_GUEST_CSI=1), which sets PLINTH_CSI_GUEST_SOCKET")
	}
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) {
			return (&net.Dialer{}).DialContext(ctx, "unix", sock)
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	g := guestGroup{ctrl: csipb.NewControllerClient(conn), node: csipb.NewNodeClient(conn), group: csipb.NewGroupControllerClient(conn),
		nodeName: os.Getenv("PLINTH_CSI_GUEST_NODE")}
	for _, class := range []struct{ name, env string }{{"ZFS", "PLINTH_CSI_GUEST_ZFS_PARAMS"}, {"LVMThinNVMeoF", "PLINTH_CSI_GUEST_PARAMS"}} {
		t.Run(class.name, func(t *testing.T) {
			var params map[string]string
			data, err := os.ReadFile(os.Getenv(class.env))
			if err != nil {
				t.Fatal(err)
			}
			if err := yaml.Unmarshal(data, &params); err != nil {
				t.Fatal(err)
			}
			if class.name == "ZFS" {
				g.instant(t, strings.ToLower(class.name), params)
			} else {
				g.thinLVM(t, strings.ToLower(class.name), params)
			}
		})
	}
}

type guestGroup struct {
	ctrl     csipb.ControllerClient
	node     csipb.NodeClient
	group    csipb.GroupControllerClient
	nodeName string
}

// attached is a block volume published on this node at path.
type attached struct {
	id, staging, path string
}

// create makes a block volume (from snapshot src when set) and publishes it here.
func (g guestGroup) create(t *testing.T, name string, params map[string]string, src string) attached {
	t.Helper()
	ctx := t.Context()
	req := &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csipb.VolumeCapability{blockCap()}, Parameters: params}
	if src != "" {
		req.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: src}}}
	}
	cv, err := g.ctrl.CreateVolume(ctx, req)
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	v := cv.GetVolume()
	pub, err := g.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: g.nodeName,
		VolumeCapability: blockCap(), VolumeContext: v.GetVolumeContext()})
	if err != nil {
		t.Fatalf("ControllerPublish %s: %v", name, err)
	}
	dir := t.TempDir()
	a := attached{id: v.GetVolumeId(), staging: filepath.Join(dir, "staging"), path: filepath.Join(dir, "dev")}
	if _, err := g.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: a.id, PublishContext: pub.GetPublishContext(),
		StagingTargetPath: a.staging, VolumeCapability: blockCap(), VolumeContext: v.GetVolumeContext()}); err != nil {
		t.Fatalf("NodeStage %s: %v", name, err)
	}
	if _, err := g.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: a.id, PublishContext: pub.GetPublishContext(),
		StagingTargetPath: a.staging, TargetPath: a.path, VolumeCapability: blockCap(), VolumeContext: v.GetVolumeContext()}); err != nil {
		t.Fatalf("NodePublish %s: %v", name, err)
	}
	t.Cleanup(func() { g.remove(t, a) })
	return a
}

func (g guestGroup) remove(t *testing.T, a attached) {
	ctx := context.Background()
	if _, err := g.node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: a.id, TargetPath: a.path}); err != nil {
		t.Errorf("NodeUnpublish %s: %v", a.id, err)
	}
	if _, err := g.node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: a.id, StagingTargetPath: a.staging}); err != nil {
		t.Errorf("NodeUnstage %s: %v", a.id, err)
	}
	if _, err := g.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: a.id, NodeId: g.nodeName}); err != nil {
		t.Errorf("ControllerUnpublish %s: %v", a.id, err)
	}
	if _, err := g.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: a.id}); err != nil {
		t.Errorf("DeleteVolume %s: %v", a.id, err)
	}
}

// lastRecord returns the highest n such that records 1..n are all on the device at path.
func lastRecord(t *testing.T, path string) int {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 16)
	n := 0
	for {
		if _, err := f.ReadAt(buf, int64(n+1)*groupRecordBytes); err != nil {
			return n
		}
		if binary.BigEndian.Uint64(buf) != groupRecordMagic || binary.BigEndian.Uint64(buf[8:]) != uint64(n+1) {
			return n
		}
		n++
	}
}

func (g guestGroup) instant(t *testing.T, prefix string, params map[string]string) {
	ctx := t.Context()
	a := g.create(t, prefix+"-group-a", params, "")
	b := g.create(t, prefix+"-group-b", params, "")
	fa, err := os.OpenFile(a.path, os.O_WRONLY|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.OpenFile(b.path, os.O_WRONLY|unix.O_DSYNC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	maxRecords := int(64<<20/groupRecordBytes) - 1
	var written atomic.Int64 // records written to both
	stop := make(chan struct{})
	werr := make(chan error, 1)
	go func() {
		rec := make([]byte, groupRecordBytes)
		for n := 1; n <= maxRecords; n++ {
			select {
			case <-stop:
				werr <- nil
				return
			default:
			}
			binary.BigEndian.PutUint64(rec, groupRecordMagic)
			binary.BigEndian.PutUint64(rec[8:], uint64(n))
			if _, err := fa.WriteAt(rec, int64(n)*groupRecordBytes); err != nil {
				werr <- fmt.Errorf("write record %d to A: %w", n, err)
				return
			}
			if _, err := fb.WriteAt(rec, int64(n)*groupRecordBytes); err != nil {
				werr <- fmt.Errorf("write record %d to B: %w", n, err)
				return
			}
			written.Store(int64(n))
		}
		werr <- fmt.Errorf("the writer filled the volumes (%d records) before the test stopped it", maxRecords)
	}()
	waitWritten := func(min int64, what string) {
		t.Helper()
		deadline := time.Now().Add(2 * time.Minute)
		for written.Load() < min {
			select {
			case err := <-werr:
				t.Fatalf("%s: writer ended: %v", what, err)
			default:
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: the writer wrote %d records in 2 minutes, want %d (held I/O not resumed?)", what, written.Load(), min)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitWritten(20, "before the group snapshot")
	name := prefix + "-group"
	start := time.Now()
	resp, err := g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: []string{a.id, b.id}})
	took := time.Since(start)
	atSnap := written.Load()
	if err != nil {
		close(stop)
		t.Fatalf("CreateVolumeGroupSnapshot: %v", err)
	}
	// the origins are running again: the writer gets further
	waitWritten(atSnap+20, "after the group snapshot")
	close(stop)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	gs := resp.GetGroupSnapshot()
	t.Logf("group snapshot %s in %s, %d records written when it returned", gs.GetGroupSnapshotId(), took.Round(time.Millisecond), atSnap)
	if !gs.GetReadyToUse() || len(gs.GetSnapshots()) != 2 {
		t.Fatalf("group snapshot %v: want ready, 2 members", gs)
	}
	snapOf := map[string]string{}
	for _, s := range gs.GetSnapshots() {
		if s.GetGroupSnapshotId() != gs.GetGroupSnapshotId() || !s.GetReadyToUse() {
			t.Errorf("member %v", s)
		}
		snapOf[s.GetSourceVolumeId()] = s.GetSnapshotId()
	}
	again, err := g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: name, SourceVolumeIds: []string{b.id, a.id}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != gs.GetGroupSnapshotId() {
		t.Errorf("retried CreateVolumeGroupSnapshot: %v, %v; want group %s", again, err, gs.GetGroupSnapshotId())
	}
	ra := g.create(t, prefix+"-group-ra", params, snapOf[a.id])
	rb := g.create(t, prefix+"-group-rb", params, snapOf[b.id])
	la, lb := lastRecord(t, ra.path), lastRecord(t, rb.path)
	t.Logf("restored: A's last record %d, B's %d (writer at %d when the snapshot returned)", la, lb, atSnap)
	if lb > la {
		t.Errorf("B's last record %d is ahead of A's %d: the members are not of one instant", lb, la)
	}
	if la < 20 || lb < 19 || la > int(atSnap)+1 {
		t.Errorf("restored records A %d, B %d: want at least 20 and 19 (written before the snapshot) and at most %d", la, lb, atSnap+1)
	}
	// a missing member: NOT_FOUND naming it, no member taken
	missing := "vol-" + strings.Repeat("0", 40)
	_, err = g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: name + "-missing", SourceVolumeIds: []string{a.id, missing}})
	wantCode(t, "group with a missing member", err, codes.NotFound)
	if err != nil && !strings.Contains(err.Error(), missing) {
		t.Errorf("NOT_FOUND does not name the missing volume %s: %v", missing, err)
	}
	if list, err := g.ctrl.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{SourceVolumeId: a.id}); err != nil || len(list.GetEntries()) != 1 {
		t.Errorf("snapshots of A after the refused group: %v, %v; want only the first group's member", list.GetEntries(), err)
	}
	if _, err := g.group.DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId(),
		SnapshotIds: []string{snapOf[a.id], snapOf[b.id]}}); err != nil {
		t.Fatalf("DeleteVolumeGroupSnapshot: %v", err)
	}
	for _, id := range snapOf {
		_, err := g.ctrl.GetSnapshot(ctx, &csipb.GetSnapshotRequest{SnapshotId: id})
		wantCode(t, "member after the group's deletion", err, codes.NotFound)
	}
	_, err = g.group.GetVolumeGroupSnapshot(ctx, &csipb.GetVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId()})
	wantCode(t, "group after its deletion", err, codes.NotFound)
}

// thinLVM: a group of two thin LVs is refused before anything is taken; a group of one is a
// snapshot that restores, and goes with its group.
func (g guestGroup) thinLVM(t *testing.T, prefix string, params map[string]string) {
	ctx := t.Context()
	a := g.create(t, prefix+"-group-a", params, "")
	b := g.create(t, prefix+"-group-b", params, "")
	_, err := g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: prefix + "-group", SourceVolumeIds: []string{a.id, b.id}})
	wantCode(t, "group of two thin LVs", err, codes.FailedPrecondition)
	for _, v := range []string{a.id, b.id} {
		if list, err := g.ctrl.ListSnapshots(ctx, &csipb.ListSnapshotsRequest{SourceVolumeId: v}); err != nil || len(list.GetEntries()) != 0 {
			t.Errorf("snapshots of %s after the refused group: %v, %v; want none", v, list.GetEntries(), err)
		}
	}
	one, err := g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: prefix + "-group-one", SourceVolumeIds: []string{a.id}})
	if err != nil || !one.GetGroupSnapshot().GetReadyToUse() || len(one.GetGroupSnapshot().GetSnapshots()) != 1 {
		t.Fatalf("group of one thin LV: %v, %v", one, err)
	}
	g.create(t, prefix+"-group-ra", params, one.GetGroupSnapshot().GetSnapshots()[0].GetSnapshotId())
	if _, err := g.group.DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: one.GetGroupSnapshot().GetGroupSnapshotId()}); err != nil {
		t.Fatal(err)
	}
	_, err = g.ctrl.GetSnapshot(ctx, &csipb.GetSnapshotRequest{SnapshotId: one.GetGroupSnapshot().GetSnapshots()[0].GetSnapshotId()})
	wantCode(t, "member of the deleted group of one", err, codes.NotFound)
}
