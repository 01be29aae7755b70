package guestnode

import (
	"fmt"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// Expected: a thin LV volume on the storage node holds a file written by worker A over NVMe-oF.
// CreateSnapshot (the CSI controller service, as csi-snapshotter calls it) answers ready_to_use
// with the source's size, and the storage guest holds one more LV (the thin snapshot). A
// volume restored from it (CreateVolume with the snapshot as content source, no topology: an
// NVMe-oF class) is made on the storage node's Store, exported, published to worker A and
// staged there over the network — worker A has no LVM and no snapshot: only the NVMe-oF
// connection — and the file reads back with the source's sha256 (not reformatted: same
// filesystem UUID as the source). The Store reports the snapshot's space (at least the 8 MiB
// file: assertSnapshotSpace). DeleteSnapshot while the restored volume exists answers OK,
// its VolumeSnapshotState is gone, and the restored volume still reads the file; then both
// volumes are deleted: the storage guest has exactly the LVs it had before the test, and no
// VolumeState or VolumeSnapshotState of the test remains (no finalizer left behind).
func testSnapshotRestore(t *testing.T, s *suite) {
	lvCount := func() int {
		out := s.storage.sh(t, time.Minute, fmt.Sprintf("lvs --noheadings -o lv_name %s", vg))
		return len(strings.Fields(out))
	}
	before := lvCount()
	src := s.createVolume(t, "pvc-crossnode-snapsrc", pool+"-nvme", 64<<20)
	s.publish(t, src, workerA)
	s.stage(t, s.nodeA, src)
	sum := s.writeFile(t, src, "data", 8)
	_, srcUUID := mounted(t, s.worker, src)
	// quiesced as a CO does before a snapshot of a mounted filesystem: unstaged
	s.unstage(t, s.nodeA, src)
	if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: src.id, NodeId: workerA}); err != nil {
		t.Fatalf("ControllerUnpublish source: %v", err)
	}

	snap, err := s.ctrl.CreateSnapshot(t.Context(), &csipb.CreateSnapshotRequest{Name: "snapshot-crossnode-0", SourceVolumeId: src.id})
	if err != nil {
		t.Fatalf("CreateSnapshot: %v", err)
	}
	sn := snap.GetSnapshot()
	t.Logf("snapshot %s of %s: ready %v, %d bytes", sn.GetSnapshotId(), sn.GetSourceVolumeId(), sn.GetReadyToUse(), sn.GetSizeBytes())
	if !sn.GetReadyToUse() || sn.GetSizeBytes() < 64<<20 {
		t.Errorf("snapshot ready_to_use %v size %d, want true and at least %d", sn.GetReadyToUse(), sn.GetSizeBytes(), 64<<20)
	}
	if n := lvCount(); n != before+2 {
		t.Errorf("%d LVs with the source and its snapshot, had %d before", n, before)
	}

	s.assertSnapshotSpace(t)

	cv, err := s.ctrl.CreateVolume(t.Context(), &csipb.CreateVolumeRequest{Name: "pvc-crossnode-restored",
		VolumeCapabilities: []*csipb.VolumeCapability{src.capability}, Parameters: s.params(pool + "-nvme"),
		VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
			Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: sn.GetSnapshotId()}}}})
	if err != nil {
		t.Fatalf("CreateVolume from the snapshot: %v", err)
	}
	restored := &volume{id: cv.GetVolume().GetVolumeId(), vc: cv.GetVolume().GetVolumeContext(), capability: src.capability,
		staging: "/tmp/staging-" + cv.GetVolume().GetVolumeId()}
	if vs := s.volumeState(t, restored.id); vs.Spec.StoreName != storev1.StoreName(pool, storageNode) {
		t.Errorf("restored volume on store %s, want the source's %s", vs.Spec.StoreName, storev1.StoreName(pool, storageNode))
	}
	s.publish(t, restored, workerA)
	s.stage(t, s.nodeA, restored)
	if got := s.readSum(t, s.worker, restored, "data"); got != sum {
		t.Errorf("restored volume reads %s on worker A, the source held %s", got, sum)
	}
	if _, u := mounted(t, s.worker, restored); u != srcUUID {
		t.Errorf("restored filesystem UUID %s, source %s: not the snapshot's filesystem", u, srcUUID)
	}
	if out, _ := s.worker.try(time.Minute, "lvs --noheadings 2>/dev/null; ls /dev/mapper 2>/dev/null | grep -v control"); strings.TrimSpace(out) != "" {
		t.Errorf("worker A holds LVs or device-mapper devices: %q (it should only hold the NVMe-oF connection)", out)
	}

	// written after the snapshot: the restored volume's new blocks are its own, not the snapshot's
	s.writeFile(t, restored, "more", 4)
	s.assertSnapshotSpace(t)

	if _, err := s.ctrl.DeleteSnapshot(t.Context(), &csipb.DeleteSnapshotRequest{SnapshotId: sn.GetSnapshotId()}); err != nil {
		t.Errorf("DeleteSnapshot while a volume restored from it exists: %v", err)
	}
	if err := s.c.Get(t.Context(), client.ObjectKey{Name: sn.GetSnapshotId()}, &storev1.VolumeSnapshotState{}); !apierrors.IsNotFound(err) {
		t.Errorf("VolumeSnapshotState %s after DeleteSnapshot: %v, want not found", sn.GetSnapshotId(), err)
	}
	if got := s.readSum(t, s.worker, restored, "data"); got != sum {
		t.Errorf("restored volume reads %s after the snapshot was deleted, want %s", got, sum)
	}

	s.unstage(t, s.nodeA, restored)
	if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: restored.id, NodeId: workerA}); err != nil {
		t.Errorf("ControllerUnpublish restored: %v", err)
	}
	s.removeVolume(t, restored)
	s.removeVolume(t, src)
	controlplane.Eventually(t, time.Minute, time.Second, "the storage guest's LVs as before the test", func() error {
		if n := lvCount(); n != before {
			return fmt.Errorf("%d LVs, had %d before the test", n, before)
		}
		return nil
	})
	for name, obj := range map[string]client.Object{src.id: &storev1.VolumeState{}, restored.id: &storev1.VolumeState{}, sn.GetSnapshotId(): &storev1.VolumeSnapshotState{}} {
		if err := s.c.Get(t.Context(), client.ObjectKey{Name: name}, obj); !apierrors.IsNotFound(err) {
			t.Errorf("%T %s after the deletions: %v (finalizers %v), want not found", obj, name, err, obj.GetFinalizers())
		}
	}
}

// params are the StorageClass parameters of the class placement.
func (s *suite) params(placement string) map[string]string {
	return map[string]string{policyv1.ParamPlacement: placement, policyv1.ParamPool: pool, policyv1.ParamProtocol: placement}
}

// assertSnapshotSpace waits (up to 2 minutes: the agent refreshes the Store on its own
// schedule) until the storage node's Store reports in status.capacity.snapshots at least the
// 8 MiB file the source held when the snapshot was taken, and logs it beside what lvs reports
// for the pool's snapshot LVs (inactive: lvs has no data_percent for them; the agent reads the
// mapped bytes it recorded from the origin at creation).
func (s *suite) assertSnapshotSpace(t *testing.T) {
	t.Helper()
	out := s.storage.sh(t, time.Minute, fmt.Sprintf("lvs --noheadings --units b --nosuffix -o lv_name,lv_size,data_percent,lv_active,lv_tags %s", vg))
	var snaps []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(f[0], "snap-") {
			snaps = append(snaps, strings.Join(f, " "))
		}
	}
	var got int64
	deadline := time.Now().Add(2 * time.Minute)
	for {
		var st storev1.Store
		if err := s.c.Get(t.Context(), client.ObjectKey{Name: storev1.StoreName(pool, storageNode)}, &st); err != nil {
			t.Fatal(err)
		}
		if st.Status.Capacity != nil {
			got = st.Status.Capacity.Snapshots
		}
		if got >= 8<<20 || time.Now().After(deadline) {
			break
		}
		time.Sleep(2 * time.Second)
	}
	t.Logf("MEASURE snapshot space: Store capacity.snapshots %d bytes; lvs of the snapshot LVs (name size data_percent active tags): %q", got, snaps)
	if got < 8<<20 {
		t.Errorf("Store %s reports %d bytes of snapshots, want at least the 8 MiB its snapshot maps", storev1.StoreName(pool, storageNode), got)
	}
}
