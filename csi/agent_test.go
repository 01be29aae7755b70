package csi_test

import (
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/prereq"
)

// TestRealAgentLifecycle runs the whole volume lifecycle through the driver (all mode, in this
// process) with the REAL agent (`plinth agent`) and the file backend on this host: the agent
// creates a sparse file on a loop device, the node service formats and mounts it, grows it
// after ControllerExpandVolume, and DeleteVolume waits for the agent to remove it.
func TestRealAgentLifecycle(t *testing.T) {
	prereq.Root(t, "the file backend and mount")
	cp := sharedControlPlane(t)
	plinth := buildPlinth(t, t.TempDir())
	params := fileBackendNode(t, cp, plinth, "life")
	conn := startDriver(t, csi.Options{Mode: csi.ModeAll, Config: cp.Admin.Config, NodeName: "life-node", HostNQNFile: filepath.Join(t.TempDir(), "none")})
	ctrl, node := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := t.Context()
	xfs := fsCap("", rwo)
	resp, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "life", CapacityRange: &csipb.CapacityRange{RequiredBytes: 320<<20 + 1},
		VolumeCapabilities: []*csipb.VolumeCapability{xfs}, Parameters: params})
	if err != nil {
		t.Fatal(err)
	}
	v := resp.GetVolume()
	var st storev1.Store
	if err := kubeClient(t, cp.Admin.Config).Get(ctx, clientKey(storev1.StoreName("life", "life-node")), &st); err != nil {
		t.Fatal(err)
	}
	unit := st.Status.ExtentBytes // the file backend's unit, as the agent reports it (sizes round up)
	if want := (320<<20 + 1 + unit - 1) / unit * unit; unit <= 0 || v.GetCapacityBytes() != want {
		t.Errorf("capacity %d, want %d (unit %d)", v.GetCapacityBytes(), want, unit)
	}
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: "life-node", VolumeCapability: xfs, VolumeContext: v.GetVolumeContext()})
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
	if err := os.WriteFile(filepath.Join(target, "hello"), []byte("world"), 0o644); err != nil {
		t.Fatal(err)
	}
	exp, err := ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: v.GetVolumeId(), CapacityRange: &csipb.CapacityRange{RequiredBytes: 500 << 20}, VolumeCapability: xfs})
	if err != nil || exp.GetCapacityBytes() != 500<<20 || !exp.GetNodeExpansionRequired() {
		t.Fatalf("controller expand: %v, %v", exp, err)
	}
	nexp, err := node.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: v.GetVolumeId(), VolumePath: target, StagingTargetPath: staging,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 500 << 20}, VolumeCapability: xfs})
	if err != nil || nexp.GetCapacityBytes() < 500<<20 {
		t.Fatalf("node expand: %v, %v", nexp, err)
	}
	stats, err := node.NodeGetVolumeStats(ctx, &csipb.NodeGetVolumeStatsRequest{VolumeId: v.GetVolumeId(), VolumePath: target})
	if err != nil || stats.GetUsage()[0].GetTotal() < 400<<20 {
		t.Errorf("filesystem after expand: %v, %v", stats, err)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), TargetPath: target}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: v.GetVolumeId(), StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.GetVolumeId(), NodeId: "life-node"}); err != nil {
		t.Fatal(err)
	}
	if _, err := ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	c := kubeClient(t, cp.Admin.Config)
	if err := c.Get(ctx, clientKey(v.GetVolumeId()), &storev1.VolumeState{}); err == nil {
		t.Error("VolumeState still exists after DeleteVolume returned")
	}
}
