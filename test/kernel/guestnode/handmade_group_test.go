package guestnode

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
)

func init() {
	extraTests = append(extraTests, extraTest{"GroupRestoredOnAnotherNode", testGroupRestore})
}

// groupRecordLen is the length of one record of the group's writer: its number, 8 decimal
// digits, and a newline.
const groupRecordLen = 9

// Expected: two thin LVs of the storage node (A and B) are published to worker B and staged
// there (node plugin B, in the storage guest), each with its own 4 MiB file. A writer on worker B
// appends numbered records to A, then to B, each append fsynced before the next. Meanwhile one
// CreateVolumeGroupSnapshot of both, through the controller service: several thin LVs of one
// Store, so the members are taken under node plugin B's freeze of both filesystems — each
// member names worker B in spec.freeze and its status has B's freeze, Thawed with reason Taken
// (frozen, not NotMounted). The writer goes on after the group (both thawed). The storage guest
// holds one thin snapshot LV per member. Each member restores as a new volume on the
// storage node's Store, published to worker A and staged there over NVMe-oF/TCP across the relay
// (another node, another kernel): each file reads back with its source's sha256, each
// filesystem has its source's UUID, and the restored pair is of one instant — B's last record is
// never ahead of A's and at most one behind, both hold every record written before the call,
// and none written after it returned. DeleteVolumeGroupSnapshot removes both members'
// VolumeSnapshotStates and thin snapshot LVs (the restored volumes still read their files), and
// GetVolumeGroupSnapshot is then NOT_FOUND. Every volume is then deleted: the storage guest has
// the LVs it had before, and no VolumeState of the test remains.
func testGroupRestore(t *testing.T, s *suite) {
	ctx := t.Context()
	lvNames := func() []string {
		return strings.Fields(s.storage.sh(t, time.Minute, fmt.Sprintf("lvs --noheadings -o lv_name %s", vg)))
	}
	before := len(lvNames())
	a := s.createVolume(t, "pvc-group-a", pool+"-nvme", 64<<20)
	b := s.createVolume(t, "pvc-group-b", pool+"-nvme", 64<<20)
	srcs := []*volume{a, b}
	sums, uuids := map[*volume]string{}, map[*volume]string{}
	for _, v := range srcs {
		s.publish(t, v, workerB)
		s.stage(t, s.nodeB, v)
		sums[v] = writeFileOn(t, s.storage, v, "data", 4)
		_, uuids[v] = mounted(t, s.storage, v)
	}
	if sums[a] == sums[b] {
		t.Fatalf("A and B hold the same data (%s): the restore could not tell them apart", sums[a])
	}

	// the writer: record n to A, then to B, each fsynced (acknowledged by the device) first
	stop := "/tmp/group-writer.stop"
	w := background(s.storage, 15*time.Minute, fmt.Sprintf(`rm -f %[3]s; n=0
while [ ! -e %[3]s ]; do
  n=$((n+1))
  printf '%%08d\n' $n | dd of=%[1]s/records oflag=append conv=notrunc,fsync 2>/dev/null || { echo "record $n to A failed"; exit 1; }
  printf '%%08d\n' $n | dd of=%[2]s/records oflag=append conv=notrunc,fsync 2>/dev/null || { echo "record $n to B failed"; exit 1; }
done
echo $n`, a.staging, b.staging, stop))
	defer s.storage.try(time.Minute, "touch "+stop) // a failed step still stops the writer
	// written is how many records both volumes hold in the source (B's file size: B's record n
	// is written after A's)
	written := func() int {
		out, code := s.storage.try(time.Minute, fmt.Sprintf("stat -c %%s %s/records 2>/dev/null || echo 0", b.staging))
		n, err := strconv.Atoi(strings.TrimSpace(out))
		if code != 0 || err != nil {
			t.Fatalf("size of B's records: %q exit %d", out, code)
		}
		return n / groupRecordLen
	}
	waitWritten := func(min int, what string) {
		t.Helper()
		if err := wait.Poll(ctx, 2*time.Minute, 200*time.Millisecond, func() error {
			select {
			case r := <-w:
				t.Fatalf("%s: the writer ended: exit %d %s", what, r.code, r.out)
			default:
			}
			if n := written(); n < min {
				return fmt.Errorf("%d records written, want %d (a filesystem left frozen?)", n, min)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	waitWritten(20, "before the group snapshot")

	atCall := written()
	start := time.Now()
	// the storage guest emulates its CPU: each lvcreate takes seconds, so the freeze gets a minute
	resp, err := s.group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "group-crossnode", SourceVolumeIds: []string{a.id, b.id},
		Parameters: map[string]string{policyv1.ParamFreezeTimeoutSeconds: "60"}})
	took := time.Since(start)
	if err != nil {
		t.Fatalf("CreateVolumeGroupSnapshot: %v", err)
	}
	atReturn := written()
	waitWritten(atReturn+20, "after the group snapshot")
	s.storage.sh(t, time.Minute, "touch "+stop)
	if r := await(t, w, "the writer", 2*time.Minute); r.code != 0 {
		t.Fatalf("the writer: exit %d %s", r.code, r.out)
	}
	gs := resp.GetGroupSnapshot()
	t.Logf("MEASURE group snapshot of two thin LVs under worker B's freeze: %s; %d records written at the call, %d when it returned",
		took.Round(time.Millisecond), atCall, atReturn)
	if !gs.GetReadyToUse() || len(gs.GetSnapshots()) != 2 {
		t.Fatalf("group snapshot %v: want ready, 2 members", gs)
	}
	snapOf := map[*volume]string{}
	for _, m := range gs.GetSnapshots() {
		for _, v := range srcs {
			if m.GetSourceVolumeId() == v.id {
				snapOf[v] = m.GetSnapshotId()
			}
		}
		if m.GetGroupSnapshotId() != gs.GetGroupSnapshotId() || !m.GetReadyToUse() {
			t.Errorf("member %v of group %s: want ready, in the group", m, gs.GetGroupSnapshotId())
		}
	}
	if len(snapOf) != 2 {
		t.Fatalf("members %v: want one of A (%s) and one of B (%s)", gs.GetSnapshots(), a.id, b.id)
	}
	lvs := lvNames()
	for v, id := range snapOf {
		var ss storev1.VolumeSnapshotState
		if err := s.c.Get(ctx, client.ObjectKey{Name: id}, &ss); err != nil {
			t.Fatal(err)
		}
		if f := ss.Spec.Freeze; f == nil || !slices.Equal(f.Nodes, []string{workerB}) {
			t.Errorf("member %s spec.freeze %+v: want worker B, the node its source is staged on", id, f)
		}
		if fs := ss.Status.Freezes; len(fs) != 1 || fs[0].Node != workerB || fs[0].Phase != storev1.FreezeThawed ||
			fs[0].Reason != storev1.ReasonFreezeTaken || fs[0].FrozenAt == nil {
			t.Errorf("member %s status.freezes %+v: want worker B's freeze, Thawed with reason %s", id, fs, storev1.ReasonFreezeTaken)
		}
		if !slices.Contains(lvs, id) {
			t.Errorf("no thin snapshot LV %s of %s on the storage guest: %v", id, v.id, lvs)
		}
	}
	if len(lvs) != before+4 {
		t.Errorf("%d LVs with the sources and the group's members, had %d before: %v", len(lvs), before, lvs)
	}

	// each member restored on the storage node's Store and staged on worker A over the network
	restored := map[*volume]*volume{}
	for _, v := range srcs {
		cv, err := s.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-group-restored-" + v.id,
			VolumeCapabilities: []*csipb.VolumeCapability{v.capability}, Parameters: s.params(pool + "-nvme"),
			VolumeContentSource: &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{
				Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: snapOf[v]}}}})
		if err != nil {
			t.Fatalf("CreateVolume from member %s: %v", snapOf[v], err)
		}
		r := &volume{id: cv.GetVolume().GetVolumeId(), vc: cv.GetVolume().GetVolumeContext(), capability: v.capability,
			staging: "/tmp/staging-" + cv.GetVolume().GetVolumeId()}
		restored[v] = r
		s.publish(t, r, workerA)
		s.stage(t, s.nodeA, r)
	}
	for _, v := range srcs {
		r := restored[v]
		if got := s.readSum(t, s.worker, r, "data"); got != sums[v] {
			t.Errorf("restored %s reads %s on worker A, its source %s held %s", r.id, got, v.id, sums[v])
		}
		if _, u := mounted(t, s.worker, r); u != uuids[v] {
			t.Errorf("restored %s has filesystem UUID %s, its source %s: not the member's filesystem", r.id, u, uuids[v])
		}
	}
	la, lb := s.records(t, restored[a]), s.records(t, restored[b])
	t.Logf("restored on worker A: A's last record %d, B's %d (%d written at the call, %d when it returned)", la, lb, atCall, atReturn)
	if lb > la || la > lb+1 {
		t.Errorf("A's last record %d, B's %d: not of one instant (B is written after A: B never ahead, at most one behind)", la, lb)
	}
	if lb < atCall || la > atReturn+1 {
		t.Errorf("restored records A %d, B %d: want at least the %d written before the call and at most %d", la, lb, atCall, atReturn+1)
	}

	if _, err := s.group.DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId(),
		SnapshotIds: []string{snapOf[a], snapOf[b]}}); err != nil {
		t.Fatalf("DeleteVolumeGroupSnapshot: %v", err)
	}
	lvs = lvNames()
	for _, id := range snapOf {
		if err := s.c.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeSnapshotState{}); !apierrors.IsNotFound(err) {
			t.Errorf("VolumeSnapshotState %s after DeleteVolumeGroupSnapshot: %v, want not found", id, err)
		}
		if slices.Contains(lvs, id) {
			t.Errorf("thin snapshot LV %s still on the storage guest after DeleteVolumeGroupSnapshot", id)
		}
	}
	if _, err := s.group.GetVolumeGroupSnapshot(ctx, &csipb.GetVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId()}); status.Code(err) != codes.NotFound {
		t.Errorf("GetVolumeGroupSnapshot after its deletion: %v, want NOT_FOUND", err)
	}
	for _, v := range srcs {
		if got := s.readSum(t, s.worker, restored[v], "data"); got != sums[v] {
			t.Errorf("restored %s reads %s after the group was deleted, want %s", restored[v].id, got, sums[v])
		}
	}

	for _, v := range srcs {
		for node, x := range map[string]struct {
			c csipb.NodeClient
			v *volume
		}{workerA: {s.nodeA, restored[v]}, workerB: {s.nodeB, v}} {
			s.unstage(t, x.c, x.v)
			if _, err := s.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: x.v.id, NodeId: node}); err != nil {
				t.Errorf("ControllerUnpublish %s from %s: %v", x.v.id, node, err)
			}
			s.removeVolume(t, x.v)
		}
	}
	if err := wait.Poll(ctx, time.Minute, time.Second, func() error {
		if n := len(lvNames()); n != before {
			return fmt.Errorf("%d LVs, had %d before the test", n, before)
		}
		return nil
	}); err != nil {
		t.Errorf("the storage guest's LVs as before the test: %v", err)
	}
	for _, v := range append(srcs, restored[a], restored[b]) {
		if err := s.c.Get(ctx, client.ObjectKey{Name: v.id}, &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
			t.Errorf("VolumeState %s after the deletions: %v, want not found", v.id, err)
		}
	}
}

// records reads, on worker A with its page cache dropped, the writer's records in v and returns
// the highest n such that records 1..n are there, in order.
func (s *suite) records(t testing.TB, v *volume) int {
	t.Helper()
	out := s.worker.sh(t, 5*time.Minute, fmt.Sprintf("sync; echo 3 > /proc/sys/vm/drop_caches; cat %s/records", v.staging))
	n := 0
	for _, line := range strings.Split(out, "\n") {
		if line != fmt.Sprintf("%08d", n+1) {
			break
		}
		n++
	}
	return n
}
