package csi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/internal/failpoint"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
	"github.com/plinth-storage/plinth/test/prereq"
)

// TestRealAgentGroupSnapshot takes a group snapshot through the driver (all mode) and the REAL
// agent on the file backend of this host: two mounted volumes hold a file each, written
// without fsync, so only the freeze of both filesystems (FIFREEZE writes back their dirty
// data) puts it in the copies; a member restores as a volume with that file. A retry returns
// the same group; a missing source is
// NOT_FOUND naming it, leaving no member; deleting the group deletes its members. Sources
// on two Stores are taken under the freeze of the mounted one's filesystem by the node plugin
// (thawed as Taken, its unsynced file in the restored member), and a freeze held past the
// class's timeout is thawed, fails the group UNAVAILABLE and leaves no member and no frozen
// filesystem.
func TestRealAgentGroupSnapshot(t *testing.T) {
	prereq.Root(t, "the file backend and mount")
	noLeftovers(t)
	cp := sharedControlPlane(t)
	plinth := buildPlinth(t, t.TempDir())
	params := fileBackendNode(t, cp, plinth, "grp")
	other := fileBackendNode(t, cp, plinth, "grpo")
	conn := startDriver(t, csi.Options{Mode: csi.ModeAll, Config: cp.Admin.Config, NodeName: "grp-node", HostNQNFile: filepath.Join(t.TempDir(), "none")})
	ctrl, node, group := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn), csipb.NewGroupControllerClient(conn)
	// the node plugin of the other Store's node: it answers the freezes asked of that node
	startDriver(t, csi.Options{Mode: csi.ModeNode, Config: cp.Admin.Config, NodeName: "grpo-node", HostNQNFile: filepath.Join(t.TempDir(), "none")})
	c := kubeClient(t, cp.Admin.Config)
	ctx := t.Context()
	xfs := fsCap("", rwo)
	mounted := func(name string, params map[string]string, src string) (id, target string) {
		t.Helper()
		req := &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: 320 << 20},
			VolumeCapabilities: []*csipb.VolumeCapability{xfs}, Parameters: params}
		if src != "" {
			req.VolumeContentSource = &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: src}}}
		}
		resp, err := ctrl.CreateVolume(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		v := resp.GetVolume()
		if params["plinth.dev/pool"] != "grp" {
			t.Cleanup(func() { teardown(t, ctrl, node, v.GetVolumeId(), "", "", "") })
			return v.GetVolumeId(), ""
		}
		root := t.TempDir()
		staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
		// registered before the first step: a failure half-way still unwinds what was done
		t.Cleanup(func() { teardown(t, ctrl, node, v.GetVolumeId(), "grp-node", staging, target) })
		pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: "grp-node", VolumeCapability: xfs, VolumeContext: v.GetVolumeContext()})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: xfs,
			PublishContext: pub.GetPublishContext(), VolumeContext: v.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: xfs,
			PublishContext: pub.GetPublishContext(), VolumeContext: v.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		return v.GetVolumeId(), target
	}
	a, ta := mounted("grp-a", params, "")
	b, tb := mounted("grp-b", params, "")
	for _, f := range []struct{ dir, data string }{{ta, "in A"}, {tb, "in B"}} {
		if err := os.WriteFile(filepath.Join(f.dir, "data"), []byte(f.data), 0o644); err != nil { // no fsync
			t.Fatal(err)
		}
	}
	resp, err := group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp", SourceVolumeIds: []string{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	gs := resp.GetGroupSnapshot()
	if !gs.GetReadyToUse() || len(gs.GetSnapshots()) != 2 || gs.GetGroupSnapshotId() != storev1.GroupSnapshotID("grp") {
		t.Fatalf("group snapshot %v", gs)
	}
	snapOf := map[string]string{}
	for _, s := range gs.GetSnapshots() {
		snapOf[s.GetSourceVolumeId()] = s.GetSnapshotId()
		var ss storev1.VolumeSnapshotState
		if err := c.Get(ctx, client.ObjectKey{Name: s.GetSnapshotId()}, &ss); err != nil {
			t.Fatal(err)
		}
		if msg := ss.Status.Conditions[0].Message; !strings.Contains(msg, "crash-consistent") {
			t.Errorf("member %s's Ready condition does not say what instant it holds: %q", ss.Name, msg)
		}
	}
	again, err := group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp", SourceVolumeIds: []string{b, a}})
	if err != nil || again.GetGroupSnapshot().GetGroupSnapshotId() != gs.GetGroupSnapshotId() || len(again.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("retry: %v, %v", again, err)
	}
	_, err = group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp", SourceVolumeIds: []string{a}})
	wantCode(t, "same name, other sources", err, codes.AlreadyExists)
	got, err := group.GetVolumeGroupSnapshot(ctx, &csipb.GetVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId()})
	if err != nil || !got.GetGroupSnapshot().GetReadyToUse() || len(got.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Errorf("GetVolumeGroupSnapshot: %v, %v", got, err)
	}
	_, rt := mounted("grp-ra", params, snapOf[a])
	if data, err := os.ReadFile(filepath.Join(rt, "data")); err != nil || string(data) != "in A" {
		t.Errorf("restored member of A: %q, %v; want the file written before the group snapshot", data, err)
	}
	// Across two Stores: taken under the consumers' freeze. A is mounted on this node, whose
	// node plugin freezes it until both members are taken; o is published nowhere.
	o, _ := mounted("grpo-a", other, "")
	if err := os.WriteFile(filepath.Join(ta, "data2"), []byte("in A, second"), 0o644); err != nil { // no fsync: the freeze writes it back
		t.Fatal(err)
	}
	two, err := group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp-two-stores", SourceVolumeIds: []string{a, o}})
	if err != nil || !two.GetGroupSnapshot().GetReadyToUse() || len(two.GetGroupSnapshot().GetSnapshots()) != 2 {
		t.Fatalf("group across two Stores: %v, %v", two, err)
	}
	var twoSnapA string
	for _, s := range two.GetGroupSnapshot().GetSnapshots() {
		var ss storev1.VolumeSnapshotState
		if err := c.Get(ctx, client.ObjectKey{Name: s.GetSnapshotId()}, &ss); err != nil {
			t.Fatal(err)
		}
		if ss.Spec.Freeze == nil {
			t.Fatalf("member %s of a group across Stores has no spec.freeze", ss.Name)
		}
		msg := ss.Status.Conditions[0].Message
		if !strings.Contains(msg, "under the consumers' freeze") {
			t.Errorf("member %s's Ready condition does not say it was taken under the consumers' freeze: %q", ss.Name, msg)
		}
		if ss.Spec.SourceVolume != a {
			if !slices.Equal(ss.Spec.Freeze.Nodes, []string{"grpo-node"}) || len(ss.Status.Freezes) != 1 || ss.Status.Freezes[0].Phase != storev1.FreezeNotMounted {
				t.Errorf("member of the volume staged nowhere: freeze nodes %v, answers %+v; want grpo-node's NotMounted", ss.Spec.Freeze.Nodes, ss.Status.Freezes)
			}
			continue
		}
		twoSnapA = ss.Name
		if len(ss.Status.Freezes) != 1 || ss.Status.Freezes[0].Node != "grp-node" || ss.Status.Freezes[0].Phase != storev1.FreezeThawed ||
			ss.Status.Freezes[0].Reason != storev1.ReasonFreezeTaken || ss.Status.Freezes[0].FrozenAt == nil {
			t.Errorf("member of A: freezes %+v; want grp-node's, frozen and thawed as Taken", ss.Status.Freezes)
		}
	}
	_, rt2 := mounted("grp-ra2", params, twoSnapA)
	if data, err := os.ReadFile(filepath.Join(rt2, "data2")); err != nil || string(data) != "in A, second" {
		t.Errorf("restored member of A from the group across Stores: %q, %v; want the file written (unsynced) before it", data, err)
	}
	if _, err := group.DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: two.GetGroupSnapshot().GetGroupSnapshotId()}); err != nil {
		t.Fatal(err)
	}

	// A freeze that does not return within the class's timeout (held at csi.freeze.before for
	// longer): thawed, the group fails UNAVAILABLE and leaves no member, A is writable again.
	// While the freeze is under way, A's staging path is not unmounted: Linux would unmount
	// a frozen filesystem and keep it frozen with no mount to thaw it through.
	held := make(chan struct{})
	var unstageWhileFreezing error
	disable := failpoint.Enable(failpoint.CSIFreezeBefore, func() {
		_, unstageWhileFreezing = node.NodeUnstageVolume(context.Background(), &csipb.NodeUnstageVolumeRequest{VolumeId: a, StagingTargetPath: filepath.Join(filepath.Dir(ta), "staging")})
		time.Sleep(3 * time.Second)
		close(held)
	})
	_, err = group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp-hung-freeze", SourceVolumeIds: []string{a, o},
		Parameters: map[string]string{"plinth.dev/freeze-timeout-seconds": "1"}})
	wantCode(t, "group whose freeze timed out", err, codes.Unavailable)
	if err != nil && !strings.Contains(err.Error(), "Timeout") {
		t.Errorf("the failure does not name the timeout: %v", err)
	}
	<-held
	disable()
	wantCode(t, "NodeUnstageVolume of a filesystem being frozen", unstageWhileFreezing, codes.Unavailable)
	if got := mountsAt(t, filepath.Join(filepath.Dir(ta), "staging")); got != 1 {
		t.Errorf("A's staging path after the refused unstage: %d mounts, want 1", got)
	}
	writableAgain(t, ta, ta, "after-timeout", "the timed-out freeze", "its filesystem was left frozen")
	if err := wait.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		var list storev1.VolumeSnapshotStateList
		if err := c.List(ctx, &list, client.MatchingLabels{storev1.LabelGroup: storev1.GroupSnapshotID("grp-hung-freeze")}); err != nil {
			return err
		}
		if len(list.Items) != 0 {
			return fmt.Errorf("%d members", len(list.Items))
		}
		return nil
	}); err != nil {
		t.Errorf("members of the group whose freeze timed out are left: %v", err)
	}

	// refusals leave no member
	missing := storev1.VolumeID("grp-never-made")
	_, err = group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp-missing", SourceVolumeIds: []string{a, missing}})
	wantCode(t, "group with a missing member", err, codes.NotFound)
	if err != nil && !strings.Contains(err.Error(), missing) {
		t.Errorf("NOT_FOUND does not name %s: %v", missing, err)
	}
	for _, name := range []string{"grp-missing"} {
		var list storev1.VolumeSnapshotStateList
		if err := c.List(ctx, &list, client.MatchingLabels{storev1.LabelGroup: storev1.GroupSnapshotID(name)}); err != nil || len(list.Items) != 0 {
			t.Errorf("members of the refused group %s: %d, %v; want none", name, len(list.Items), err)
		}
	}
	if _, err := group.DeleteVolumeGroupSnapshot(ctx, &csipb.DeleteVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId(), SnapshotIds: []string{snapOf[a], snapOf[b]}}); err != nil {
		t.Fatal(err)
	}
	for _, id := range snapOf {
		_, err := ctrl.GetSnapshot(ctx, &csipb.GetSnapshotRequest{SnapshotId: id})
		wantCode(t, "member after DeleteVolumeGroupSnapshot", err, codes.NotFound)
	}
	_, err = group.GetVolumeGroupSnapshot(ctx, &csipb.GetVolumeGroupSnapshotRequest{GroupSnapshotId: gs.GetGroupSnapshotId()})
	wantCode(t, "group after its deletion", err, codes.NotFound)
}

// writableAgain writes and syncs file name in volume A's mount dir, which blocks while A's
// filesystem is frozen: an error names after, and a write still blocked after 30 s fails the
// test with why and thaws thawPath so the clean-up can unmount.
func writableAgain(t *testing.T, dir, thawPath, name, after, why string) {
	t.Helper()
	written := make(chan error, 1)
	go func() {
		f, err := os.Create(filepath.Join(dir, name))
		if err == nil {
			_, err = f.WriteString("written")
			err = errors.Join(err, f.Sync(), f.Close())
		}
		written <- err
	}()
	select {
	case err := <-written:
		if err != nil {
			t.Errorf("write to A after %s: %v", after, err)
		}
	case <-time.After(30 * time.Second):
		t.Errorf("a write to A blocks 30s after %s: %s", after, why)
		mount.Thaw(thawPath) //nolint:errcheck // unblock the cleanup
	}
}
