package csi_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
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
// a group of two raw block volumes in use is FAILED_PRECONDITION and leaves no member (two thin
// LVs are taken under the consumers' freeze, and a block volume has no filesystem to freeze),
// and a group of one is taken. FrozenThinLVM and FrozenTwoStores prove the instant of groups
// taken under the freeze, with filesystem volumes.
func TestInGuestGroupSnapshot(t *testing.T) {
	sock := inGuestSocket(t)
	conn := dialUnix(t, sock)
	g := guestGroup{ctrl: csipb.NewControllerClient(conn), node: csipb.NewNodeClient(conn), group: csipb.NewGroupControllerClient(conn),
		nodeName: os.Getenv("PLINTH_CSI_GUEST_NODE")}
	for _, class := range []struct{ name, env string }{{"ZFS", "PLINTH_CSI_GUEST_ZFS_PARAMS"}, {"LVMThinNVMeoF", "PLINTH_CSI_GUEST_PARAMS"}} {
		t.Run(class.name, func(t *testing.T) {
			params := readParams(t, class.env)
			if class.name == "ZFS" {
				g.instant(t, strings.ToLower(class.name), params)
			} else {
				g.thinLVM(t, strings.ToLower(class.name), params)
			}
		})
	}
	// Groups the backend cannot take alone, taken under the consumers' freeze by the node
	// plugin: two thin LVs of one Store, and a thin LV and a zvol (two Stores).
	t.Run("FrozenThinLVM", func(t *testing.T) {
		p := readParams(t, "PLINTH_CSI_GUEST_PARAMS")
		g.frozenInstant(t, "frz-lvm", p, p)
		thinPoolHealthy(t, g, p)
	})
	t.Run("FrozenTwoStores", func(t *testing.T) {
		g.frozenInstant(t, "frz-two", readParams(t, "PLINTH_CSI_GUEST_PARAMS"), readParams(t, "PLINTH_CSI_GUEST_ZFS_PARAMS"))
	})
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

// thinLVM: a group of two raw block thin LVs in use is refused before anything is taken (no
// filesystem to freeze, and lvm2 snapshots one origin per command); a group of one is a
// snapshot that restores, and goes with its group.
func (g guestGroup) thinLVM(t *testing.T, prefix string, params map[string]string) {
	ctx := t.Context()
	a := g.create(t, prefix+"-group-a", params, "")
	b := g.create(t, prefix+"-group-b", params, "")
	_, err := g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: prefix + "-group", SourceVolumeIds: []string{a.id, b.id}})
	wantCode(t, "group of two raw block thin LVs", err, codes.FailedPrecondition)
	if err != nil && !strings.Contains(err.Error(), "raw block") {
		t.Errorf("the refusal does not say the volume is raw block: %v", err)
	}
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

// mounted is a filesystem volume staged and published on this node at target.
type mounted struct {
	id, staging, target string
}

// createFS makes a filesystem volume (from snapshot src when set) and mounts it here.
func (g guestGroup) createFS(t *testing.T, name string, params map[string]string, src string) mounted {
	t.Helper()
	ctx := t.Context()
	fsc := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: rwo}}
	req := &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: 320 << 20},
		VolumeCapabilities: []*csipb.VolumeCapability{fsc}, Parameters: params}
	if src != "" {
		req.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: src}}}
	}
	cv, err := g.ctrl.CreateVolume(ctx, req)
	if err != nil {
		t.Fatalf("CreateVolume %s: %v", name, err)
	}
	v := cv.GetVolume()
	pub, err := g.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: g.nodeName,
		VolumeCapability: fsc, VolumeContext: v.GetVolumeContext()})
	if err != nil {
		t.Fatalf("ControllerPublish %s: %v", name, err)
	}
	dir := t.TempDir()
	m := mounted{id: v.GetVolumeId(), staging: filepath.Join(dir, "staging"), target: filepath.Join(dir, "target")}
	if _, err := g.node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: m.id, PublishContext: pub.GetPublishContext(),
		StagingTargetPath: m.staging, VolumeCapability: fsc, VolumeContext: v.GetVolumeContext()}); err != nil {
		t.Fatalf("NodeStage %s: %v", name, err)
	}
	if _, err := g.node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: m.id, PublishContext: pub.GetPublishContext(),
		StagingTargetPath: m.staging, TargetPath: m.target, VolumeCapability: fsc, VolumeContext: v.GetVolumeContext()}); err != nil {
		t.Fatalf("NodePublish %s: %v", name, err)
	}
	t.Cleanup(func() { g.remove(t, attached{id: m.id, staging: m.staging, path: m.target}) })
	return m
}

// fileRecords returns the highest n such that records 1..n are, in order, in the file at path
// (16 bytes each: the magic number and n).
func fileRecords(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for ; (n+1)*16 <= len(data); n++ {
		r := data[n*16:]
		if binary.BigEndian.Uint64(r) != groupRecordMagic || binary.BigEndian.Uint64(r[8:]) != uint64(n+1) {
			break
		}
	}
	return n
}

// frozenInstant proves the instant of a group taken under the consumers' freeze: a writer
// appends numbered 16-byte records to a file on filesystem volume A (params pa), then to one
// on B (params pb), each append synchronous (O_DSYNC), while CreateVolumeGroupSnapshot runs;
// in the restored pair B's last record is never ahead of A's. The writer keeps writing after
// the group (every filesystem thawed), and every member says it was taken under the freeze.
func (g guestGroup) frozenInstant(t *testing.T, prefix string, pa, pb map[string]string) {
	ctx := t.Context()
	a := g.createFS(t, prefix+"-a", pa, "")
	b := g.createFS(t, prefix+"-b", pb, "")
	open := func(m mounted) *os.File {
		f, err := os.OpenFile(filepath.Join(m.target, "records"), os.O_WRONLY|os.O_CREATE|os.O_APPEND|unix.O_DSYNC, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	fa, fb := open(a), open(b)
	var written atomic.Int64
	stop := make(chan struct{})
	werr := make(chan error, 1)
	go func() {
		rec := make([]byte, 16)
		for n := 1; ; n++ {
			select {
			case <-stop:
				werr <- nil
				return
			default:
			}
			binary.BigEndian.PutUint64(rec, groupRecordMagic)
			binary.BigEndian.PutUint64(rec[8:], uint64(n))
			if _, err := fa.Write(rec); err != nil {
				werr <- fmt.Errorf("append record %d to A: %w", n, err)
				return
			}
			if _, err := fb.Write(rec); err != nil {
				werr <- fmt.Errorf("append record %d to B: %w", n, err)
				return
			}
			written.Store(int64(n))
		}
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
				t.Fatalf("%s: the writer wrote %d records in 2 minutes, want %d (a filesystem left frozen?)", what, written.Load(), min)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	waitWritten(20, "before the group snapshot")
	start := time.Now()
	// the guest emulates its CPU (TCG): each lvcreate takes seconds, so the freeze gets a minute
	resp, err := g.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: prefix + "-group", SourceVolumeIds: []string{a.id, b.id},
		Parameters: map[string]string{"plinth.dev/freeze-timeout-seconds": "60"}})
	took := time.Since(start)
	atSnap := written.Load()
	if err != nil {
		close(stop)
		t.Fatalf("CreateVolumeGroupSnapshot: %v", err)
	}
	waitWritten(atSnap+20, "after the group snapshot")
	close(stop)
	if err := <-werr; err != nil {
		t.Fatal(err)
	}
	gs := resp.GetGroupSnapshot()
	t.Logf("group snapshot %s under the freeze in %s, %d records written when it returned", gs.GetGroupSnapshotId(), took.Round(time.Millisecond), atSnap)
	if !gs.GetReadyToUse() || len(gs.GetSnapshots()) != 2 {
		t.Fatalf("group snapshot %v: want ready, 2 members", gs)
	}
	snapOf := map[string]string{}
	for _, s := range gs.GetSnapshots() {
		snapOf[s.GetSourceVolumeId()] = s.GetSnapshotId()
	}
	ra := g.createFS(t, prefix+"-ra", pa, snapOf[a.id])
	rb := g.createFS(t, prefix+"-rb", pb, snapOf[b.id])
	la, lb := fileRecords(t, filepath.Join(ra.target, "records")), fileRecords(t, filepath.Join(rb.target, "records"))
	t.Logf("restored: A's last record %d, B's %d (writer at %d when the group returned)", la, lb, atSnap)
	if lb > la {
		t.Errorf("B's last record %d is ahead of A's %d: the members are not of one instant", lb, la)
	}
	if la < 20 || lb < 19 || la > int(atSnap)+1 {
		t.Errorf("restored records A %d, B %d: want at least 20 and 19 and at most %d", la, lb, atSnap+1)
	}
	if _, err := g.group.DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId()}); err != nil {
		t.Fatalf("DeleteVolumeGroupSnapshot: %v", err)
	}
}

// thinPoolHealthy proves lvm2's metadata and the thin pool agree after groups of several thin
// LVs: the pool's transaction id in the kernel (dmsetup status) is lvm2's (lvs), and a new
// thin LV (CreateVolume, lvcreate) and its removal (lvremove) succeed.
func thinPoolHealthy(t *testing.T, g guestGroup, params map[string]string) {
	t.Helper()
	out, err := exec.Command("lvs", "--noheadings", "-o", "transaction_id", "plinth-csi/pool").CombinedOutput()
	if err != nil {
		t.Fatalf("lvs: %v\n%s", err, out)
	}
	lvmID := strings.TrimSpace(string(out))
	st, err := exec.Command("dmsetup", "status", "plinth--csi-pool-tpool").CombinedOutput()
	if err != nil {
		t.Fatalf("dmsetup status: %v\n%s", err, st)
	}
	// thin-pool status: <start> <len> thin-pool <transaction id> ...
	f := strings.Fields(string(st))
	if len(f) < 4 || f[2] != "thin-pool" || f[3] != lvmID {
		t.Errorf("thin pool transaction id: kernel %q, lvm2 %q; want equal", st, lvmID)
	}
	v := g.create(t, "frz-lvm-after", params, "")
	t.Logf("after the groups: thin pool transaction id %s in lvm2 and the kernel; a new thin LV %s made", lvmID, v.id)
}
