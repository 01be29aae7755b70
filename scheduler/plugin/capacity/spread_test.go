package capacity

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	fwk "k8s.io/kube-scheduler/framework"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

const zoneKey = "topology.kubernetes.io/zone"

// spreadClass adds a local WaitForFirstConsumer class of placement "zonal" on pool-z that
// spreads across zoneKey, as render writes it.
func (f *fixture) spreadClass(name string) {
	wffc := storagev1.VolumeBindingWaitForFirstConsumer
	_ = f.classes.Add(&storagev1.StorageClass{
		ObjectMeta:        metav1.ObjectMeta{Name: name},
		Provisioner:       policyv1.DriverName,
		VolumeBindingMode: &wffc,
		Parameters: map[string]string{policyv1.ParamPlacement: "zonal", policyv1.ParamPool: "pool-z",
			policyv1.ParamProtocol: "local", policyv1.ParamSpreadAcross: zoneKey},
	})
}

// owned makes pod a member of the workload (a controller ownerRef, as a StatefulSet's pods
// carry) and returns it.
func owned(pod *corev1.Pod, workload string) *corev1.Pod {
	yes := true
	pod.OwnerReferences = []metav1.OwnerReference{{APIVersion: "apps/v1", Kind: "StatefulSet", Name: workload,
		UID: types.UID("uid-" + workload), Controller: &yes}}
	return pod
}

// zones builds nodes "<zone><i>" labelled with their zone, each with a Store of pool-z with
// 100 GiB free.
func (f *fixture) zones(perZone int, zones ...string) []nodeInfo {
	var nodes []nodeInfo
	for _, z := range zones {
		for i := range perZone {
			name := fmt.Sprintf("%s%d", z, i+1)
			f.store("pool-z", name, avail(100*GiB))
			nodes = append(nodes, mkNode(name, map[string]string{zoneKey: z}))
		}
	}
	return nodes
}

// passed returns the sorted names of the nodes that passed Filter, and fails the test when
// a node was rejected for another reason than want (a Filter reason prefix) with code.
func passed(t *testing.T, r result, want string, code fwk.Code) []string {
	t.Helper()
	if !r.pre.IsSuccess() {
		t.Fatalf("PreFilter: %v", r.pre)
	}
	var ok []string
	for n, s := range r.filter {
		if s.IsSuccess() {
			ok = append(ok, n)
			continue
		}
		if s.Code() != code || !strings.HasPrefix(s.Message(), want) {
			t.Errorf("node %s rejected with %v %q, want %v %q", n, s.Code(), s.Message(), code, want)
		}
	}
	slices.Sort(ok)
	return ok
}

func zoneOf(nodes []string) []string {
	var zs []string
	for _, n := range nodes {
		zs = append(zs, n[:1])
	}
	return slices.Compact(zs)
}

// One volume per pod, 3 zones × 2 nodes: each of the first three pods of a workload may only
// go to a zone that holds none of its volumes yet; the fourth may go anywhere; the fifth
// only to the zones still at one.
func TestSpreadAcrossOneVolumePerPod(t *testing.T) {
	f := newFixture(t)
	f.spreadClass("zonal")
	nodes := f.zones(2, "a", "b", "c")
	at := map[string]nodeInfo{}
	for _, n := range nodes {
		at[n.node.Name] = n
	}
	wantZones := [][]string{{"a", "b", "c"}, {"b", "c"}, {"c"}, {"a", "b", "c"}, {"b", "c"}}
	// Where each pod goes (the scheduler's choice among the passing nodes).
	choice := []string{"a1", "b2", "c1", "a2", "b1"}
	for i, want := range wantZones {
		pod := owned(f.pod(fmt.Sprintf("web-%d", i), "zonal", GiB), "web")
		r := f.cycle(pod, nodes...)
		ok := passed(t, r, FilterReasonSpreadSkew, fwk.Unschedulable)
		if got := zoneOf(ok); !slices.Equal(got, want) {
			t.Fatalf("pod %d: passing nodes %v (zones %v), want zones %v", i, ok, got, want)
		}
		if len(ok) != 2*len(want) {
			t.Fatalf("pod %d: %d nodes passed, want %d: %v", i, len(ok), 2*len(want), ok)
		}
		if !slices.Contains(ok, choice[i]) {
			t.Fatalf("pod %d: choice %s did not pass", i, choice[i])
		}
		at[choice[i]].assume(pod)
	}
}

// A node without the label never takes a volume of the placement, whatever the counts; a
// zone whose nodes have no usable Store does not hold the others back.
func TestSpreadAcrossUnlabelledNodesAndEmptyZones(t *testing.T) {
	f := newFixture(t)
	f.spreadClass("zonal")
	nodes := f.zones(1, "a", "b")
	f.store("pool-z", "bare", avail(100*GiB))
	bare := mkNode("bare", nil)
	// Zone c has a node but no Store of pool-z; zone d's Store never reported capacity.
	f.store("pool-z", "d1", nil)
	nodes = append(nodes, bare, mkNode("c1", map[string]string{zoneKey: "c"}), mkNode("d1", map[string]string{zoneKey: "d"}))
	pod0 := owned(f.pod("db-0", "zonal", GiB), "db")
	r := f.cycle(pod0, nodes...)
	if s := r.filter["bare"]; s.Code() != fwk.UnschedulableAndUnresolvable || !strings.HasPrefix(s.Message(), FilterReasonNoSpreadLabel) ||
		!strings.Contains(s.Message(), zoneKey) {
		t.Fatalf("unlabelled node: %v", s)
	}
	if !r.filter["a1"].IsSuccess() || !r.filter["b1"].IsSuccess() {
		t.Fatalf("a1 %v, b1 %v", r.filter["a1"], r.filter["b1"])
	}
	nodes[0].assume(pod0)
	nodes[1].assume(owned(f.pod("db-1", "zonal", GiB), "db"))
	// a and b hold one each; c and d cannot take volumes of pool-z, so a and b are the least
	// loaded and the third pod may use either.
	r = f.cycle(owned(f.pod("db-2", "zonal", GiB), "db"), nodes...)
	if !r.filter["a1"].IsSuccess() || !r.filter["b1"].IsSuccess() {
		t.Fatalf("empty zones held the spread back: a1 %v, b1 %v", r.filter["a1"], r.filter["b1"])
	}
	if r.filter["bare"].IsSuccess() {
		t.Fatal("unlabelled node passed")
	}
	for _, n := range []string{"c1", "d1"} {
		if s := r.filter[n]; s.IsSuccess() || !strings.HasPrefix(s.Message(), FilterReasonNoStore) && !strings.HasPrefix(s.Message(), FilterReasonNoCapacity) {
			t.Errorf("%s: %v", n, s)
		}
	}
}

// Only the pod's own workload counts: volumes of another StatefulSet, of a pod without a
// controller, and of another placement in the same zone do not.
func TestSpreadAcrossCountsOnlyTheWorkload(t *testing.T) {
	f := newFixture(t)
	f.spreadClass("zonal")
	nodes := f.zones(1, "a", "b")
	f.store("pool-a", "a1", avail(100*GiB))
	f.store("pool-a", "b1", avail(100*GiB))
	nodes[0].assume(owned(f.pod("other-0", "zonal", GiB), "other"))
	nodes[0].assume(f.pod("single", "zonal", GiB))
	nodes[0].assume(owned(f.pod("web-x", "binpack", GiB), "web"))
	r := f.cycle(owned(f.pod("web-0", "zonal", GiB), "web"), nodes...)
	if ok := passed(t, r, FilterReasonSpreadSkew, fwk.Unschedulable); !slices.Equal(ok, []string{"a1", "b1"}) {
		t.Fatalf("passed %v, want a1 and b1", ok)
	}
	// A pod without a controller is its own workload: its own claims never hold it back.
	r = f.cycle(f.pod("lonely", "zonal", GiB, GiB), nodes...)
	if ok := passed(t, r, FilterReasonSpreadSkew, fwk.Unschedulable); len(ok) != 2 {
		t.Fatalf("pod without controller: passed %v", ok)
	}
}

// A sibling that is pending again (not in the snapshot) still counts where its bound volume
// is; a sibling in the snapshot counts its bound volume on the PV's node.
func TestSpreadAcrossBoundVolumesOfPendingSiblings(t *testing.T) {
	f := newFixture(t)
	f.spreadClass("zonal")
	nodes := f.zones(1, "a", "b", "c")
	pending := owned(f.pod("web-0", "zonal", GiB), "web")
	f.bind("web-0-c0", "pv-0", "a1")
	_ = f.pods.Add(pending)
	r := f.cycle(owned(f.pod("web-1", "zonal", GiB), "web"), nodes...)
	if ok := passed(t, r, FilterReasonSpreadSkew, fwk.Unschedulable); !slices.Equal(ok, []string{"b1", "c1"}) {
		t.Fatalf("passed %v, want b1 c1 (a1 holds the pending sibling's volume)", ok)
	}
	if s := r.filter["a1"]; !strings.Contains(s.Message(), zoneKey+"=a holds 1") || !strings.Contains(s.Message(), zoneKey+"=b, "+zoneKey+"=c holds 0") {
		t.Errorf("reason does not name the counts: %q", s.Message())
	}
}

// Two claims of the placement per pod: each pod still lands in its own zone, and the fourth
// may go to any zone (the rule is "no more than the least-loaded domain", not a skew in
// volumes that two volumes per pod would always exceed).
func TestSpreadAcrossTwoVolumesPerPod(t *testing.T) {
	f := newFixture(t)
	f.spreadClass("zonal")
	nodes := f.zones(1, "a", "b", "c")
	want := [][]string{{"a1", "b1", "c1"}, {"b1", "c1"}, {"c1"}, {"a1", "b1", "c1"}}
	for i, w := range want {
		pod := owned(f.pod(fmt.Sprintf("kv-%d", i), "zonal", GiB, GiB), "kv")
		r := f.cycle(pod, nodes...)
		ok := passed(t, r, FilterReasonSpreadSkew, fwk.Unschedulable)
		if !slices.Equal(ok, w) {
			t.Fatalf("pod %d: passed %v, want %v", i, ok, w)
		}
		nodes[i%3].assume(pod)
	}
}

// The pod's node selector narrows the domains: a zone it may not use does not hold the
// spread back.
func TestSpreadAcrossHonoursNodeSelector(t *testing.T) {
	f := newFixture(t)
	f.spreadClass("zonal")
	nodes := f.zones(1, "a", "b", "c")
	for _, n := range nodes[:2] {
		n.node.Labels["tier"] = "gold"
	}
	mk := func(name string) *corev1.Pod {
		p := owned(f.pod(name, "zonal", GiB), "gold")
		p.Spec.NodeSelector = map[string]string{"tier": "gold"}
		return p
	}
	nodes[0].assume(mk("g-0"))
	nodes[1].assume(mk("g-1"))
	r := f.cycle(mk("g-2"), nodes...)
	if !r.filter["a1"].IsSuccess() || !r.filter["b1"].IsSuccess() {
		t.Fatalf("zone c (not selectable) held a and b back: a1 %v, b1 %v", r.filter["a1"], r.filter["b1"])
	}
}

// bind binds claim to a local Plinth PV on node (as csi-provisioner and the PV controller
// would).
func (f *fixture) bind(claim, pv, node string) {
	obj, ok, _ := f.pvcs.GetByKey("default/" + claim)
	if !ok {
		panic("no claim " + claim)
	}
	pvc := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
	pvc.Spec.VolumeName = pv
	_ = f.pvcs.Update(pvc)
	_ = f.pvs.Add(&corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{Name: pv},
		Spec: corev1.PersistentVolumeSpec{
			PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: policyv1.DriverName, VolumeHandle: pv}},
			NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
				MatchExpressions: []corev1.NodeSelectorRequirement{{Key: policyv1.TopologyKeyNode, Operator: corev1.NodeSelectorOpIn, Values: []string{node}}},
			}}}},
		},
	})
}
