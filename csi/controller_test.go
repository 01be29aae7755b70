package csi_test

import (
	"context"
	"fmt"
	"sort"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

const (
	gib    = int64(1) << 30
	mib    = int64(1) << 20
	extent = 4 * mib
)

// env is one pool with a local and an NVMe-oF placement on the shared control plane, the
// controller service in this process, and the fake agent.
type env struct {
	c        client.WithWatch
	ctrl     csipb.ControllerClient
	agent    *fakeAgent
	local    map[string]string // StorageClass parameters
	nvme     map[string]string
	pool     string
	storeFor map[string]string // node → store name
}

func create(t testing.TB, c client.Client, obj client.Object) {
	t.Helper()
	if err := c.Create(context.Background(), obj); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatalf("create %T %s: %v", obj, obj.GetName(), err)
	}
}

// setup creates the policy objects, Nodes (standing in for kubelet's registration, with the
// annotations the node plugin would add) and one Store per node with available bytes.
func setup(t testing.TB, c client.WithWatch, pool string, avail map[string]int64) *env {
	t.Helper()
	e := &env{c: c, pool: pool, storeFor: map[string]string{}}
	create(t, c, &policyv1.StoragePool{ObjectMeta: metav1.ObjectMeta{Name: pool}, Spec: policyv1.StoragePoolSpec{
		Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/var/lib/plinth/" + pool}}}})
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pool + "-local"}, Spec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}})
	create(t, c, &policyv1.Protocol{ObjectMeta: metav1.ObjectMeta{Name: pool + "-nvme"}, Spec: policyv1.ProtocolSpec{NVMeoFTCP: &policyv1.NVMeoFTCPProtocol{Port: 4420, BindCIDR: "127.0.0.0/8", MaxQueueSize: 256}}})
	for _, proto := range []string{"local", "nvme"} {
		create(t, c, &policyv1.Placement{ObjectMeta: metav1.ObjectMeta{Name: pool + "-" + proto}, Spec: policyv1.PlacementSpec{
			PoolRef:      policyv1.LocalObjectReference{Name: pool},
			ProtocolRef:  policyv1.LocalObjectReference{Name: pool + "-" + proto},
			StorageClass: policyv1.StorageClassTemplate{Name: pool + "-" + proto},
			Filesystem:   policyv1.Filesystem{FSType: "xfs"},
			Strategy:     policyv1.StrategyBinpack,
		}})
	}
	e.local = map[string]string{policyv1.ParamPlacement: pool + "-local", policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-local"}
	e.nvme = map[string]string{policyv1.ParamPlacement: pool + "-nvme", policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-nvme"}
	for node, bytes := range avail {
		create(t, c, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: node,
			Labels:      map[string]string{policyv1.LabelNVMeInitiator: "true"},
			Annotations: map[string]string{policyv1.AnnotationHostNQN: "nqn.2014-08.org.nvmexpress:uuid:" + node}}})
		st := &storev1.Store{
			ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName(pool, node), Labels: map[string]string{
				policyv1.LabelPool: storev1.NameLabelValue(pool), policyv1.LabelNode: storev1.NameLabelValue(node)}},
			Spec: storev1.StoreSpec{Pool: pool, NodeName: node, Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/x"}}},
		}
		create(t, c, st)
		st.Status = storev1.StoreStatus{Capacity: &storev1.Capacity{Total: bytes, Allocatable: bytes, Available: bytes}, ExtentBytes: extent}
		if err := c.Status().Update(context.Background(), st); err != nil {
			t.Fatal(err)
		}
		e.storeFor[node] = st.Name
	}
	return e
}

func controllerEnv(t testing.TB, pool string, avail map[string]int64) *env {
	cp := sharedControlPlane(t)
	c := kubeClient(t, cp.Admin.Config)
	e := setup(t, c, pool, avail)
	e.agent = startFakeAgent(t, c)
	conn := startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config})
	e.ctrl = csipb.NewControllerClient(conn)
	return e
}

func mountCap(mode csipb.VolumeCapability_AccessMode_Mode) []*csipb.VolumeCapability {
	return []*csipb.VolumeCapability{{
		AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: mode},
	}}
}

var rwo = csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER

func topology(nodes ...string) []*csipb.Topology {
	var out []*csipb.Topology
	for _, n := range nodes {
		out = append(out, &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: n}})
	}
	return out
}

func wantCode(t *testing.T, what string, err error, code codes.Code) {
	t.Helper()
	if status.Code(err) != code {
		t.Errorf("%s: %v, want %v", what, err, code)
	}
}

// Sizes round UP to the store's extent; capacity_bytes is the real size.
func TestCreateVolumeRoundsUp(t *testing.T) {
	e := controllerEnv(t, "roundup", map[string]int64{"roundup-node": 100 * gib})
	ctx := t.Context()
	for _, tc := range []struct {
		name     string
		required int64
		want     int64
	}{{"roundup-a", 1, 4194304}, {"roundup-b", 1073741825, 1077936128}} {
		resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: tc.name, CapacityRange: &csipb.CapacityRange{RequiredBytes: tc.required},
			VolumeCapabilities: mountCap(rwo), Parameters: e.local})
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		v := resp.GetVolume()
		if v.GetCapacityBytes() != tc.want || v.GetVolumeId() != storev1.VolumeID(tc.name) {
			t.Errorf("%s: %d bytes id %s, want %d and %s", tc.name, v.GetCapacityBytes(), v.GetVolumeId(), tc.want, storev1.VolumeID(tc.name))
		}
		if got := v.GetAccessibleTopology(); len(got) != 1 || got[0].GetSegments()[policyv1.TopologyKeyNode] != "roundup-node" {
			t.Errorf("%s: topology %v", tc.name, got)
		}
		vs := &storev1.VolumeState{}
		if err := e.c.Get(ctx, client.ObjectKey{Name: v.GetVolumeId()}, vs); err != nil {
			t.Fatal(err)
		}
		if vs.Spec.CSIName != tc.name || vs.Spec.Policy.Backend.File == nil || vs.Spec.Policy.ProtocolSpec.Local == nil ||
			vs.Spec.Policy.Filesystem.FSType != "ext4" || vs.Labels[policyv1.LabelNode] != "roundup-node" {
			t.Errorf("%s: VolumeState spec %+v labels %v: want the frozen policy", tc.name, vs.Spec, vs.Labels)
		}
	}
	// A range no extent multiple fits: OUT_OF_RANGE.
	_, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "roundup-c", CapacityRange: &csipb.CapacityRange{RequiredBytes: 1, LimitBytes: mib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	wantCode(t, "limit below one extent", err, codes.OutOfRange)
}

// Idempotent by name; incompatible repeats are ALREADY_EXISTS.
func TestCreateVolumeIdempotent(t *testing.T) {
	e := controllerEnv(t, "idempotent", map[string]int64{"idempotent-node-a": 100 * gib})
	ctx := t.Context()
	req := func(required, limit int64, requisite ...string) *csipb.CreateVolumeRequest {
		r := &csipb.CreateVolumeRequest{Name: "idempotent", CapacityRange: &csipb.CapacityRange{RequiredBytes: required, LimitBytes: limit}, VolumeCapabilities: mountCap(rwo), Parameters: e.local}
		if len(requisite) > 0 {
			r.AccessibilityRequirements = &csipb.TopologyRequirement{Requisite: topology(requisite...)}
		}
		return r
	}
	first, err := e.ctrl.CreateVolume(ctx, req(10*gib, 10*gib))
	if err != nil {
		t.Fatal(err)
	}
	if first.GetVolume().GetCapacityBytes() != 10*gib {
		t.Errorf("1: %d bytes, want exactly %d", first.GetVolume().GetCapacityBytes(), 10*gib)
	}
	again, err := e.ctrl.CreateVolume(ctx, req(10*gib, 10*gib))
	if err != nil || again.GetVolume().GetVolumeId() != first.GetVolume().GetVolumeId() {
		t.Errorf("2: %v, %v", again, err)
	}
	_, err = e.ctrl.CreateVolume(ctx, req(20*gib, 20*gib))
	wantCode(t, "3 (20 GiB)", err, codes.AlreadyExists)
	smaller, err := e.ctrl.CreateVolume(ctx, req(8*gib, 0))
	if err != nil || smaller.GetVolume().GetVolumeId() != first.GetVolume().GetVolumeId() {
		t.Errorf("4 (≥ 8 GiB): %v, %v", smaller, err)
	}
	_, err = e.ctrl.CreateVolume(ctx, req(10*gib, 10*gib, "other-node"))
	wantCode(t, "5 (other topology)", err, codes.AlreadyExists)
	var list storev1.VolumeStateList
	if err := e.c.List(ctx, &list, client.MatchingLabels{policyv1.LabelPool: "idempotent"}); err != nil || len(list.Items) != 1 {
		t.Errorf("VolumeStates of pool idempotent: %d, %v; want exactly 1", len(list.Items), err)
	}
}

// Unknown or malformed ids delete OK; empty id is INVALID_ARGUMENT; delete waits for the
// agent's finalizer.
func TestDeleteVolume(t *testing.T) {
	e := controllerEnv(t, "deleteid", map[string]int64{"deleteid-node": 10 * gib})
	ctx := t.Context()
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "deleteid", VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	for _, bad := range []string{"vg0/never-existed", "%%%not-an-id", storev1.VolumeID("never-created"), id, id} {
		if _, err := e.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: bad}); err != nil {
			t.Errorf("DeleteVolume(%q): %v", bad, err)
		}
	}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
		t.Errorf("VolumeState after DeleteVolume returned: %v, want gone", err)
	}
	_, err = e.ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{})
	wantCode(t, "empty id", err, codes.InvalidArgument)
}

// No room on the selected node → RESOURCE_EXHAUSTED, decided from Store status and also
// when the agent itself reports InsufficientCapacity (the VolumeState is then removed).
func TestCreateVolumeNoRoom(t *testing.T) {
	e := controllerEnv(t, "noroom", map[string]int64{"noroom-node-1": 30 * gib, "noroom-node-2": 100 * gib})
	ctx := t.Context()
	_, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "noroom", CapacityRange: &csipb.CapacityRange{RequiredBytes: 40 * gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local, AccessibilityRequirements: &csipb.TopologyRequirement{Preferred: topology("noroom-node-1")}})
	wantCode(t, "40 GiB on a 30 GiB node", err, codes.ResourceExhausted)
	// Store status says 30 GiB but the backend has only 1 GiB: the agent's answer counts.
	e.agent.setFree(e.storeFor["noroom-node-1"], gib)
	_, err = e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "noroom-agent", CapacityRange: &csipb.CapacityRange{RequiredBytes: 2 * gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local, AccessibilityRequirements: &csipb.TopologyRequirement{Preferred: topology("noroom-node-1")}})
	wantCode(t, "agent reports InsufficientCapacity", err, codes.ResourceExhausted)
	id := storev1.VolumeID("noroom-agent")
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := e.c.Get(ctx, client.ObjectKey{Name: id}, &storev1.VolumeState{})
		if apierrors.IsNotFound(err) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("VolumeState the agent had no room for still exists: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The same request without a preferred node lands where there is room.
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "noroom-anywhere", CapacityRange: &csipb.CapacityRange{RequiredBytes: 40 * gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	if err != nil || resp.GetVolume().GetAccessibleTopology()[0].GetSegments()[policyv1.TopologyKeyNode] != "noroom-node-2" {
		t.Errorf("40 GiB anywhere: %v, %v; want node-2", resp, err)
	}
}

// Expansion completes at ≥ requested; repeats and smaller requests change nothing.
func TestControllerExpand(t *testing.T) {
	e := controllerEnv(t, "expand", map[string]int64{"expand-node": 10 * gib})
	ctx := t.Context()
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "expand", CapacityRange: &csipb.CapacityRange{RequiredBytes: 104857600},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	for i, required := range []int64{212860928, 212860928, 104857600} {
		got, err := e.ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: required},
			VolumeCapability: mountCap(rwo)[0]})
		if err != nil {
			t.Fatalf("expand %d: %v", i, err)
		}
		if got.GetCapacityBytes() != 213909504 || !got.GetNodeExpansionRequired() {
			t.Errorf("expand %d to %d: %d bytes, node expansion %v; want 213909504, true", i, required, got.GetCapacityBytes(), got.GetNodeExpansionRequired())
		}
	}
	vs := &storev1.VolumeState{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil || vs.Generation != 2 {
		t.Errorf("VolumeState generation %d (%v): want 2 (one spec change for three calls)", vs.Generation, err)
	}
	// No room to grow: RESOURCE_EXHAUSTED.
	e.agent.setFree(e.storeFor["expand-node"], 0)
	_, err = e.ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: gib}})
	wantCode(t, "expand without room", err, codes.ResourceExhausted)
	_, err = e.ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: storev1.VolumeID("nope"), CapacityRange: &csipb.CapacityRange{RequiredBytes: gib}})
	wantCode(t, "expand unknown", err, codes.NotFound)
}

// NVMe-oF publish: the node's host NQN joins spec.publications with a bumped
// publicationGeneration; the publish context carries the export; RWO across nodes is
// FAILED_PRECONDITION; unpublish removes it.
func TestPublishNVMe(t *testing.T) {
	e := controllerEnv(t, "pub", map[string]int64{"pub-a": 10 * gib, "pub-b": 10 * gib})
	ctx := t.Context()
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pub", VolumeCapabilities: mountCap(rwo), Parameters: e.nvme})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	var nodes []string
	for _, tp := range resp.GetVolume().GetAccessibleTopology() {
		nodes = append(nodes, tp.GetSegments()[policyv1.TopologyKeyNode])
	}
	sort.Strings(nodes)
	if !strings.Contains(strings.Join(nodes, ","), "pub-a,pub-b") {
		t.Errorf("NVMe-oF topology %v: want the initiator nodes", nodes)
	}
	pub := func(node string) (*csipb.ControllerPublishVolumeResponse, error) {
		return e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: node, VolumeCapability: mountCap(rwo)[0]})
	}
	got, err := pub("pub-a")
	if err != nil {
		t.Fatal(err)
	}
	pc := got.GetPublishContext()
	// maxQueueSize travels to the node, which connects with queue_size (csi/nvme ConnectOptions).
	if pc[csi.PublishQueueSize] != "256" {
		t.Errorf("publish context %v: want %s=256 from the protocol's maxQueueSize", pc, csi.PublishQueueSize)
	}
	if pc[csi.PublishNQN] != "nqn.2014-08.dev.plinth:"+id || pc[csi.PublishAddress] != "127.0.0.1" || pc[csi.PublishPort] != "4420" || pc[csi.ContextKind] != "nvmeofTcp" {
		t.Errorf("publish context %v", pc)
	}
	vs := &storev1.VolumeState{}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil {
		t.Fatal(err)
	}
	// the storage node, whose keys the node plugin asks the key server for
	var st storev1.Store
	if err := e.c.Get(ctx, client.ObjectKey{Name: vs.Spec.StoreName}, &st); err != nil {
		t.Fatal(err)
	}
	if pc[csi.PublishTargetNode] == "" || pc[csi.PublishTargetNode] != st.Spec.NodeName {
		t.Errorf("publish context %s = %q, want the Store's node %q", csi.PublishTargetNode, pc[csi.PublishTargetNode], st.Spec.NodeName)
	}
	if len(vs.Spec.Publications) != 1 || vs.Spec.Publications[0].HostNQN != "nqn.2014-08.org.nvmexpress:uuid:pub-a" || vs.Spec.PublicationGeneration != 1 {
		t.Errorf("publications %+v generation %d", vs.Spec.Publications, vs.Spec.PublicationGeneration)
	}
	if _, err := pub("pub-a"); err != nil {
		t.Errorf("publish again: %v", err)
	}
	_, err = pub("pub-b")
	wantCode(t, "RWO publish to a second node", err, codes.FailedPrecondition)
	_, err = pub("no-such-node")
	wantCode(t, "publish to a missing node", err, codes.NotFound)
	if _, err := e.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "pub-a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := pub("pub-b"); err != nil {
		t.Errorf("publish to b after unpublish from a: %v", err)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil || vs.Spec.PublicationGeneration != 3 || vs.Status.ObservedPublicationGeneration != 3 {
		t.Errorf("publication generation %d observed %d (%v), want 3 and 3", vs.Spec.PublicationGeneration, vs.Status.ObservedPublicationGeneration, err)
	}
}

// Local publish: only the volume's node; the device path comes back.
func TestPublishLocal(t *testing.T) {
	e := controllerEnv(t, "lpub", map[string]int64{"lpub-a": 10 * gib, "lpub-b": gib})
	ctx := t.Context()
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "lpub", CapacityRange: &csipb.CapacityRange{RequiredBytes: 5 * gib}, VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	if err != nil {
		t.Fatal(err)
	}
	id := resp.GetVolume().GetVolumeId()
	got, err := e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "lpub-a", VolumeCapability: mountCap(rwo)[0]})
	if err != nil || got.GetPublishContext()[csi.PublishDevicePath] != "/dev/fake/"+id {
		t.Errorf("local publish: %v, %v", got, err)
	}
	_, err = e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "lpub-b", VolumeCapability: mountCap(rwo)[0]})
	wantCode(t, "local publish elsewhere", err, codes.FailedPrecondition)
	// The publication is recorded (no host NQN): the same publish again is OK, a read-only one
	// to the same node ALREADY_EXISTS, and unpublish removes it.
	vs := &storev1.VolumeState{}
	want := storev1.Publication{NodeName: "lpub-a", AccessMode: rwo.String()}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil || len(vs.Spec.Publications) != 1 || vs.Spec.Publications[0] != want {
		t.Errorf("publications %+v (%v), want only %+v", vs.Spec.Publications, err, want)
	}
	if _, err := e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "lpub-a", VolumeCapability: mountCap(rwo)[0]}); err != nil {
		t.Errorf("local publish again: %v", err)
	}
	_, err = e.ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: "lpub-a", VolumeCapability: mountCap(rwo)[0], Readonly: true})
	wantCode(t, "local publish read-only after read-write", err, codes.AlreadyExists)
	if _, err := e.ctrl.ControllerUnpublishVolume(ctx, &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: "lpub-a"}); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Get(ctx, client.ObjectKey{Name: id}, vs); err != nil || len(vs.Spec.Publications) != 0 {
		t.Errorf("publications after unpublish %+v (%v), want none", vs.Spec.Publications, err)
	}
}

func TestCapacityAndList(t *testing.T) {
	e := controllerEnv(t, "cap", map[string]int64{"cap-a": 10 * gib, "cap-b": 3 * gib})
	ctx := t.Context()
	all, err := e.ctrl.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: e.local})
	if err != nil || all.GetAvailableCapacity() != 13*gib || all.GetMaximumVolumeSize().GetValue() != 10*gib {
		t.Errorf("pool capacity %v, %v; want 13 GiB, max 10 GiB", all, err)
	}
	one, err := e.ctrl.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: e.local, AccessibleTopology: topology("cap-b")[0]})
	if err != nil || one.GetAvailableCapacity() != 3*gib {
		t.Errorf("node capacity %v, %v; want 3 GiB", one, err)
	}
	for _, n := range []string{"cap-1", "cap-2", "cap-3"} {
		if _, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: n, CapacityRange: &csipb.CapacityRange{RequiredBytes: mib}, VolumeCapabilities: mountCap(rwo), Parameters: e.local}); err != nil {
			t.Fatal(err)
		}
	}
	seen := map[string]bool{}
	token := ""
	for page := 0; page < 100; page++ {
		resp, err := e.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{MaxEntries: 2, StartingToken: token})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.GetEntries()) > 2 {
			t.Fatalf("page of %d entries, max 2", len(resp.GetEntries()))
		}
		for _, en := range resp.GetEntries() {
			seen[en.GetVolume().GetVolumeId()] = true
		}
		if token = resp.GetNextToken(); token == "" {
			break
		}
	}
	for _, n := range []string{"cap-1", "cap-2", "cap-3"} {
		if !seen[storev1.VolumeID(n)] {
			t.Errorf("ListVolumes misses %s", n)
		}
	}
	_, err = e.ctrl.ListVolumes(ctx, &csipb.ListVolumesRequest{StartingToken: "garbage"})
	wantCode(t, "bad token", err, codes.Aborted)
}

// A Store marked plinth.dev/draining (it left the policy while holding volumes) offers no
// capacity and is never chosen for a new volume, even when it is the binpack choice; asked for
// its node by preference, CreateVolume has no room there (RESOURCE_EXHAUSTED).
func TestDrainingStoreGetsNoNewVolumes(t *testing.T) {
	e := controllerEnv(t, "drn", map[string]int64{"drn-a": 10 * gib, "drn-b": 50 * gib})
	ctx := t.Context()
	var st storev1.Store
	if err := e.c.Get(ctx, client.ObjectKey{Name: e.storeFor["drn-a"]}, &st); err != nil {
		t.Fatal(err)
	}
	st.Annotations = map[string]string{storev1.AnnotationDraining: "true"}
	if err := e.c.Update(ctx, &st); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		c, err := e.ctrl.GetCapacity(ctx, &csipb.GetCapacityRequest{Parameters: e.local, AccessibleTopology: topology("drn-a")[0]})
		if err == nil && c.GetAvailableCapacity() == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("capacity of the draining Store's node: %v, %v; want 0", c, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "drn-1", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local})
	if err != nil || resp.GetVolume().GetAccessibleTopology()[0].GetSegments()[policyv1.TopologyKeyNode] != "drn-b" {
		t.Errorf("binpack with drn-a draining: %v, %v; want drn-b", resp, err)
	}
	_, err = e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "drn-2", CapacityRange: &csipb.CapacityRange{RequiredBytes: gib},
		VolumeCapabilities: mountCap(rwo), Parameters: e.local, AccessibilityRequirements: &csipb.TopologyRequirement{Preferred: topology("drn-a")}})
	wantCode(t, "preferred node's Store draining", err, codes.ResourceExhausted)
}

// BenchmarkCreateVolume measures CreateVolume against the real API server with the fake agent
// answering at once, and reports the controller's overhead above the agent's own work (the
// fake's first sight of the VolumeState → its Ready status written): p50 and p99 in ms.
func BenchmarkCreateVolume(b *testing.B) {
	e := controllerEnv(b, "bench", map[string]int64{"bench-node": 1 << 50})
	ctx := context.Background()
	// head: CreateVolume called → the agent sees the VolumeState (store choice, the create,
	// the API server's watch fan-out); tail: the agent's Ready written → CreateVolume returns
	// (the watch back to the driver, the answer). overhead = head + tail.
	// api: the floor under the same load, measured in the same iterations — one VolumeState
	// written by a plain client until its watch event arrives (the fake ignores it).
	var overheads, heads, tails, api []time.Duration
	w, err := e.c.Watch(ctx, &storev1.VolumeStateList{}, client.HasLabels{fakeIgnore})
	if err != nil {
		b.Fatal(err)
	}
	defer w.Stop()
	run := time.Now().UnixNano()
	i := 0
	for b.Loop() {
		base := &storev1.VolumeState{ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("base-%d-%d", run, i), Labels: map[string]string{fakeIgnore: "true"}},
			Spec: storev1.VolumeStateSpec{CSIName: "base", StoreName: e.storeFor["bench-node"], CapacityBytes: mib, VolumeMode: "Filesystem",
				Policy: storev1.FrozenPolicy{Backend: policyv1.Backend{File: &policyv1.FileBackend{Directory: "/x"}}, ProtocolSpec: policyv1.ProtocolSpec{Local: &policyv1.LocalProtocol{}}}}}
		t0 := time.Now()
		if err := e.c.Create(ctx, base); err != nil {
			b.Fatal(err)
		}
		for ev := range w.ResultChan() {
			if o, ok := ev.Object.(*storev1.VolumeState); ok && o.Name == base.Name {
				break
			}
		}
		api = append(api, time.Since(t0))

		name := fmt.Sprintf("bench-%d-%d", run, i)
		i++
		start := time.Now()
		resp, err := e.ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: mib}, VolumeCapabilities: mountCap(rwo), Parameters: e.local})
		end := time.Now()
		if err != nil {
			b.Fatal(err)
		}
		if seen, done, ok := e.agent.times(resp.GetVolume().GetVolumeId()); ok {
			overheads = append(overheads, end.Sub(start)-done.Sub(seen))
			heads = append(heads, seen.Sub(start))
			tails = append(tails, end.Sub(done))
		}
	}
	reportQuantiles(b, "overhead", overheads)
	reportQuantiles(b, "head", heads)
	reportQuantiles(b, "tail", tails)
	reportQuantiles(b, "api-write-watch", api)
}

// reportQuantiles reports the p50 and p99 of ds in milliseconds as <name>-p50-ms and <name>-p99-ms.
func reportQuantiles(b *testing.B, name string, ds []time.Duration) {
	if len(ds) == 0 {
		return
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	q := func(p float64) float64 {
		return float64(ds[min(len(ds)-1, int(p*float64(len(ds))))].Microseconds()) / 1000
	}
	b.ReportMetric(q(0.50), name+"-p50-ms")
	b.ReportMetric(q(0.99), name+"-p99-ms")
}
