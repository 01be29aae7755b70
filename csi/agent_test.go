package csi_test

import (
	"maps"
	"os"
	"path/filepath"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/prereq"
)

// TestRealAgentLifecycle runs the whole volume lifecycle through the driver (all mode, in this
// process) with the REAL agent (`plinth agent`) and the file backend on this host: the agent
// creates a sparse file on a loop device, the node service formats and mounts it, grows it
// after ControllerExpandVolume, and DeleteVolume waits for the agent to remove it. The driver's
// controller's own VolumeState writes are counted at its transport: CreateVolume makes exactly
// one (the create, finalizer and labels in it; the agent writes the status) and DeleteVolume one
// (the delete; the agent releases the finalizer).
func TestRealAgentLifecycle(t *testing.T) {
	prereq.Root(t, "the file backend and mount")
	noLeftovers(t)
	cp := sharedControlPlane(t)
	plinth := buildPlinth(t, t.TempDir())
	params := fileBackendNode(t, cp, plinth, "life")
	writes := controlplane.NewWriteCounter("volumestates")
	conn := startDriver(t, csi.Options{Mode: csi.ModeAll, Config: writes.Wrap(cp.Admin.Config), NodeName: "life-node", HostNQNFile: filepath.Join(t.TempDir(), "none")})
	ctrl, node := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := t.Context()
	xfs := fsCap("", rwo)
	resp, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "life", CapacityRange: &csipb.CapacityRange{RequiredBytes: 320<<20 + 1},
		VolumeCapabilities: []*csipb.VolumeCapability{xfs}, Parameters: params})
	if err != nil {
		t.Fatal(err)
	}
	v := resp.GetVolume()
	if got, want := writes.Of(""), map[string]int{"POST": 1}; !maps.Equal(got, want) {
		t.Errorf("CreateVolume: VolumeState creates %v, want %v", got, want)
	}
	if got := writes.Of(v.GetVolumeId()); len(got) != 0 {
		t.Errorf("CreateVolume: writes to the new VolumeState %v, want none (the agent writes its status)", got)
	}
	root := t.TempDir()
	staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
	// registered before the first step: a failure half-way still unwinds what was done
	t.Cleanup(func() { teardown(t, ctrl, node, v.GetVolumeId(), "life-node", staging, target) })
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
	writes.Reset()
	if _, err := ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: v.GetVolumeId()}); err != nil {
		t.Fatal(err)
	}
	// the node service of this process reports status.appliedAttributes of the volumes it stages
	// (and drops its entry after the unstage) on its own rounds; the controller writes no status
	got := writes.Of(v.GetVolumeId())
	delete(got, "PUT /status")
	if want := map[string]int{"DELETE": 1}; !maps.Equal(got, want) {
		t.Errorf("DeleteVolume: VolumeState writes %v, want %v", got, want)
	}
	c := kubeClient(t, cp.Admin.Config)
	if err := c.Get(ctx, clientKey(v.GetVolumeId()), &storev1.VolumeState{}); err == nil {
		t.Error("VolumeState still exists after DeleteVolume returned")
	}
}
