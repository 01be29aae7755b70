package csi_test

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/prereq"
)

// TestRealAgentGroupSnapshot takes a group snapshot through the driver (all mode) and the REAL
// agent on the file backend of this host: two mounted volumes hold a file each, written
// without fsync, so only the freeze of both filesystems (FIFREEZE writes back their dirty
// data) puts it in the copies; a member restores as a volume with that file. A retry returns
// the same group; sources on two Stores are FAILED_PRECONDITION and a missing source
// NOT_FOUND naming it, neither leaving a member; deleting the group deletes its members.
func TestRealAgentGroupSnapshot(t *testing.T) {
	prereq.Root(t, "the file backend and mount")
	cp := sharedControlPlane(t)
	plinth := buildPlinth(t, t.TempDir())
	params := fileBackendNode(t, cp, plinth, "grp")
	other := fileBackendNode(t, cp, plinth, "grpo")
	conn := startDriver(t, csi.Options{Mode: csi.ModeAll, Config: cp.Admin.Config, NodeName: "grp-node", HostNQNFile: filepath.Join(t.TempDir(), "none")})
	ctrl, node, group := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn), csipb.NewGroupControllerClient(conn)
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
			return v.GetVolumeId(), ""
		}
		pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: "grp-node", VolumeCapability: xfs, VolumeContext: v.GetVolumeContext()})
		if err != nil {
			t.Fatal(err)
		}
		root := t.TempDir()
		staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
		if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: xfs,
			PublishContext: pub.GetPublishContext(), VolumeContext: v.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: xfs,
			PublishContext: pub.GetPublishContext(), VolumeContext: v.GetVolumeContext()}); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()                                                                                                 // t.Context() is done before cleanups run
			node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: target})             //nolint:errcheck // cleanup
			node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging})         //nolint:errcheck // cleanup
			ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: "grp-node"}) //nolint:errcheck // cleanup
			ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolumeId()})                                               //nolint:errcheck // cleanup
		})
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
	// refusals leave no member
	o, _ := mounted("grpo-a", other, "")
	_, err = group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp-two-stores", SourceVolumeIds: []string{a, o}})
	wantCode(t, "group across two Stores", err, codes.FailedPrecondition)
	missing := storev1.VolumeID("grp-never-made")
	_, err = group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "grp-missing", SourceVolumeIds: []string{a, missing}})
	wantCode(t, "group with a missing member", err, codes.NotFound)
	if err != nil && !strings.Contains(err.Error(), missing) {
		t.Errorf("NOT_FOUND does not name %s: %v", missing, err)
	}
	for _, name := range []string{"grp-two-stores", "grp-missing"} {
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
