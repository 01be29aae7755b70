package csi

import (
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func TestStripSecrets(t *testing.T) {
	req := &csipb.NodeStageVolumeRequest{
		VolumeId: "vol-1",
		Secrets:  map[string]string{"password": "hunter2"},
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "xfs"}},
		},
	}
	got := stripSecrets(req)
	if strings.Contains(got, "hunter2") || !strings.Contains(got, strippedSecret) || !strings.Contains(got, "vol-1") {
		t.Errorf("stripSecrets = %s", got)
	}
	if req.Secrets["password"] != "hunter2" {
		t.Error("stripSecrets changed the request itself")
	}
	cr := &csipb.CreateVolumeRequest{Name: "n", Secrets: map[string]string{"k": "s3cret"}}
	if strings.Contains(stripSecrets(cr), "s3cret") {
		t.Error("CreateVolume secrets logged")
	}
}

func store(name, node string, avail, extent int64) storev1.Store {
	s := storev1.Store{Spec: storev1.StoreSpec{Pool: "p", NodeName: node}}
	s.Name = name
	s.Status.Capacity = &storev1.Capacity{Available: avail}
	s.Status.ExtentBytes = extent
	return s
}

func topo(nodes ...string) []*csipb.Topology {
	var out []*csipb.Topology
	for _, n := range nodes {
		out = append(out, &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: n}})
	}
	return out
}

func TestChooseStore(t *testing.T) {
	const gib = int64(1) << 30
	const ext = 4 << 20
	stores := []storev1.Store{store("p.node-1", "node-1", 30*gib, ext), store("p.node-2", "node-2", 100*gib, ext), store("p.node-3", "node-3", 50*gib, ext)}
	for _, tc := range []struct {
		name      string
		nvme      bool
		strategy  policyv1.Strategy
		req       *csipb.TopologyRequirement
		required  int64
		wantStore string
		wantCode  codes.Code
	}{
		{"preferred node full", false, "", &csipb.TopologyRequirement{Preferred: topo("node-1")}, 40 * gib, "", codes.ResourceExhausted},
		{"preferred node has room", false, "", &csipb.TopologyRequirement{Preferred: topo("node-3", "node-2"), Requisite: topo("node-1", "node-2", "node-3")}, 40 * gib, "p.node-3", codes.OK},
		{"binpack: fullest that fits", false, policyv1.StrategyBinpack, nil, 40 * gib, "p.node-3", codes.OK},
		{"spreadout: emptiest", false, policyv1.StrategySpreadout, nil, 1, "p.node-2", codes.OK},
		{"requisite restricts", false, policyv1.StrategySpreadout, &csipb.TopologyRequirement{Requisite: topo("node-1", "node-3")}, 1, "p.node-3", codes.OK},
		{"nvme ignores consumer topology", true, policyv1.StrategySpreadout, &csipb.TopologyRequirement{Preferred: topo("node-1")}, 40 * gib, "p.node-2", codes.OK},
		{"nothing anywhere", false, "", nil, 200 * gib, "", codes.ResourceExhausted},
		{"unknown node", false, "", &csipb.TopologyRequirement{Requisite: topo("elsewhere")}, 1, "", codes.ResourceExhausted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, size, err := chooseStore(stores, tc.nvme, tc.strategy, tc.req, tc.required, 0)
			if status.Code(rpcError(err)) != tc.wantCode {
				t.Fatalf("code %v (%v), want %v", status.Code(rpcError(err)), err, tc.wantCode)
			}
			if err != nil {
				return
			}
			if st.Name != tc.wantStore || size < tc.required || size%ext != 0 {
				t.Errorf("chose %s size %d, want %s and a multiple of %d ≥ %d", st.Name, size, tc.wantStore, ext, tc.required)
			}
		})
	}
	// A store without reported capacity is never chosen.
	unreported := store("p.node-9", "node-9", 0, ext)
	unreported.Status.Capacity = nil
	if _, _, err := chooseStore([]storev1.Store{unreported}, false, "", nil, 1, 0); status.Code(rpcError(err)) != codes.ResourceExhausted {
		t.Errorf("store without capacity: %v", err)
	}
	// required > limit: OUT_OF_RANGE.
	if _, _, err := chooseStore(stores, false, "", nil, 2*gib, gib); status.Code(rpcError(err)) != codes.OutOfRange {
		t.Errorf("required > limit: %v", err)
	}
}

func TestCheckCapabilities(t *testing.T) {
	mountCap := func(fs string, m csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
		return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs}}, AccessMode: &csipb.VolumeCapability_AccessMode{Mode: m}}
	}
	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}, AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER}}
	if m, fs, err := checkCapabilities([]*csipb.VolumeCapability{mountCap("xfs", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}); err != nil || m != "Filesystem" || fs != "xfs" {
		t.Errorf("xfs RWO: %s %s %v", m, fs, err)
	}
	if m, _, err := checkCapabilities([]*csipb.VolumeCapability{blockCap}); err != nil || m != "Block" {
		t.Errorf("block RWOP: %s %v", m, err)
	}
	for name, caps := range map[string][]*csipb.VolumeCapability{
		"none":    nil,
		"btrfs":   {mountCap("btrfs", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		"RWX":     {mountCap("", csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)},
		"mixed":   {mountCap("", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), blockCap},
		"two fs":  {mountCap("ext4", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), mountCap("xfs", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		"no type": {{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
	} {
		if _, _, err := checkCapabilities(caps); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// Raw volumes, like thick LVM ones, have no snapshots or clones.
func TestSnapshotsSupported(t *testing.T) {
	for b, want := range map[*policyv1.Backend]bool{
		{Raw: &policyv1.RawBackend{Devices: []string{"/dev/vdb"}}}:                     false,
		{LVM: &policyv1.LVMBackend{VolumeGroup: "vg"}}:                                 false,
		{LVM: &policyv1.LVMBackend{VolumeGroup: "vg", ThinPool: &policyv1.ThinPool{}}}: true,
		{File: &policyv1.FileBackend{Directory: "/d"}}:                                 true,
	} {
		if got := snapshotsSupported(*b) == ""; got != want {
			t.Errorf("%s backend: snapshots %v, want %v", b.Kind(), got, want)
		}
	}
}
