package capacity

import (
	"context"
	"math"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	fwk "k8s.io/kube-scheduler/framework"

	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestScoreMonotonicSmallCapacities: scores are monotonic in free bytes and strictly ordered
// where free bytes differ; a node with no room is filtered. Spreadout and Binpack are mirror
// images.
func TestScoreMonotonicSmallCapacities(t *testing.T) {
	for _, tc := range []struct {
		class string
		order []string // strictly increasing score
	}{
		{"spread", []string{"b", "c", "d", "e"}},
		{"binpack", []string{"e", "d", "c", "b"}},
	} {
		t.Run(tc.class, func(t *testing.T) {
			f := newFixture(t)
			frees := map[string]int64{"a": 0, "b": 512 * MiB, "c": 3 * GiB / 2, "d": 3 * GiB, "e": TiB}
			var nodes []nodeInfo
			for _, n := range []string{"a", "b", "c", "d", "e"} {
				f.store("pool-a", n, avail(frees[n]))
				nodes = append(nodes, mkNode(n, nil))
			}
			r := f.cycle(f.pod("p", tc.class, 256*MiB), nodes...)
			if r.filter["a"].IsSuccess() || r.filter["a"].Code() != fwk.Unschedulable {
				t.Fatalf("node a (0 free) passed or wrong code: %v", r.filter["a"])
			}
			for i := 1; i < len(tc.order); i++ {
				lo, hi := tc.order[i-1], tc.order[i]
				if r.scores[lo] >= r.scores[hi] {
					t.Errorf("score %s=%d not < %s=%d (all %v)", lo, r.scores[lo], hi, r.scores[hi], r.scores)
				}
			}
			if r.scores[tc.order[0]] != fwk.MinNodeScore || r.scores[tc.order[len(tc.order)-1]] != fwk.MaxNodeScore {
				t.Errorf("scores %v do not span 0..100", r.scores)
			}
		})
	}
}

// normalize keeps strict order for up to 101 distinct values and monotonic order beyond,
// for clustered and extreme byte values.
func TestNormalizeStrictAndMonotonic(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vals   []int64
		strict bool
	}{
		{"clustered", []int64{1, 2, 3, 4, 5, 6, 7, 8, 9, math.MaxInt64}, true},
		{"101 distinct", seq(101, 1), true},
		{"101 distinct bytes apart", seq(101, 1<<40), true},
		{"500 distinct", seq(500, 7), false},
		{"duplicates", []int64{5, 5, 9, 9, 0}, true},
		{"one", []int64{42}, true},
	} {
		for _, binpack := range []bool{false, true} {
			list := make(fwk.NodeScoreList, len(tc.vals))
			for i, v := range tc.vals {
				list[i] = fwk.NodeScore{Name: string(rune('A' + i%26)), Score: v}
			}
			normalize(list, binpack)
			for i := range tc.vals {
				if s := list[i].Score; s < 0 || s > 100 {
					t.Fatalf("%s: score %d out of range", tc.name, s)
				}
				for j := range tc.vals {
					better := tc.vals[i] > tc.vals[j]
					if binpack {
						better = tc.vals[i] < tc.vals[j]
					}
					switch {
					case tc.vals[i] == tc.vals[j] && list[i].Score != list[j].Score:
						t.Fatalf("%s binpack=%v: equal values, different scores", tc.name, binpack)
					case better && list[i].Score < list[j].Score:
						t.Fatalf("%s binpack=%v: not monotonic", tc.name, binpack)
					case better && tc.strict && list[i].Score == list[j].Score:
						t.Fatalf("%s binpack=%v: %d and %d share score %d", tc.name, binpack, tc.vals[i], tc.vals[j], list[i].Score)
					}
				}
			}
			if len(tc.vals) == 1 && list[0].Score != fwk.MaxNodeScore {
				t.Fatalf("single node should get the neutral top score, got %d", list[0].Score)
			}
		}
	}
}

func seq(n int, step int64) []int64 {
	v := make([]int64, n)
	for i := range v {
		v[i] = int64(i) * step
	}
	return v
}

// TestBadCapacityData: a node without a Store, without capacity, with invalid or zero capacity
// is unschedulable with a distinct reason, never a panic; a pod without our claims is skipped.
func TestBadCapacityData(t *testing.T) {
	f := newFixture(t)
	f.store("pool-a", "n1", &storev1.Capacity{Total: 100 * GiB, Allocatable: 100 * GiB, Available: 100 * GiB})
	f.store("pool-a", "n2", nil)
	f.store("pool-a", "n3", &storev1.Capacity{Total: 100 * GiB, Allocatable: -1, Available: 100 * GiB})
	f.store("pool-a", "n4", &storev1.Capacity{})
	f.store("pool-a", "n6", &storev1.Capacity{Total: GiB, Allocatable: 2 * GiB, Available: 100 * GiB})
	nodes := []nodeInfo{mkNode("n1", nil), mkNode("n2", nil), mkNode("n3", nil), mkNode("n4", nil), mkNode("n5", nil), mkNode("n6", nil)}
	r := f.cycle(f.pod("p", "binpack", 10*GiB), nodes...)
	if !r.filter["n1"].IsSuccess() {
		t.Fatalf("n1: %v", r.filter["n1"])
	}
	want := map[string]string{"n2": FilterReasonNoCapacity, "n3": FilterReasonBadCapacity, "n4": FilterReasonNoAllocatable,
		"n5": FilterReasonNoStore, "n6": FilterReasonBadCapacity}
	for n, reason := range want {
		s := r.filter[n]
		if s.Code() != fwk.UnschedulableAndUnresolvable || !strings.HasPrefix(s.Message(), reason) {
			t.Errorf("%s: got %v %q, want UnschedulableAndUnresolvable %q", n, s.Code(), s.Message(), reason)
		}
	}
	if len(r.scores) != 1 || r.scores["n1"] != fwk.MaxNodeScore {
		t.Errorf("scores %v", r.scores)
	}

	// A pod with no claims of our classes: PreFilter skips (Filter and Score never run).
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: "default"}}
	if _, s := f.p.PreFilter(context.Background(), newCycleState(), plain, nil); !s.IsSkip() {
		t.Errorf("pod without claims: %v, want Skip", s)
	}
	other := f.pod("other", "not-ours", GiB)
	if _, s := f.p.PreFilter(context.Background(), newCycleState(), other, nil); !s.IsSkip() {
		t.Errorf("pod with another class: %v, want Skip", s)
	}
}

// A Store marked plinth.dev/draining (its node left the pool's policy while it holds volumes),
// or evacuated (spec.evacuate: its pool lists the node in evacuateNodes), takes no new volumes:
// its node is filtered out with its own reason however much room it reports, and is
// schedulable again once the mark is cleared.
func TestDrainingStoreTakesNoNewVolumes(t *testing.T) {
	for _, evacuate := range []bool{false, true} {
		t.Run(map[bool]string{false: "draining", true: "evacuated"}[evacuate], func(t *testing.T) {
			testStoreTakesNoNewVolumes(t, evacuate)
		})
	}
}

func testStoreTakesNoNewVolumes(t *testing.T, evacuate bool) {
	f := newFixture(t)
	f.store("pool-a", "n1", avail(10*GiB))
	f.store("pool-a", "n2", avail(100*GiB))
	drain := func(mark bool) {
		st := &storev1.Store{
			ObjectMeta: metav1.ObjectMeta{Name: storev1.StoreName("pool-a", "n2"), Labels: map[string]string{
				policyv1.LabelPool: storev1.NameLabelValue("pool-a"), policyv1.LabelNode: storev1.NameLabelValue("n2")}},
			Spec:   storev1.StoreSpec{Pool: "pool-a", NodeName: "n2"},
			Status: storev1.StoreStatus{Capacity: avail(100 * GiB)},
		}
		switch {
		case mark && evacuate:
			st.Spec.Evacuate = true
		case mark:
			st.Annotations = map[string]string{storev1.AnnotationDraining: "true"}
		}
		f.p.cache.upsertStore(st)
	}
	drain(true)
	r := f.cycle(f.pod("p", "binpack", GiB), mkNode("n1", nil), mkNode("n2", nil))
	if !r.filter["n1"].IsSuccess() {
		t.Fatalf("n1: %v", r.filter["n1"])
	}
	if s := r.filter["n2"]; s.Code() != fwk.UnschedulableAndUnresolvable || !strings.HasPrefix(s.Message(), FilterReasonDraining) {
		t.Errorf("draining n2: got %v %q, want UnschedulableAndUnresolvable %q", s.Code(), s.Message(), FilterReasonDraining)
	}
	drain(false)
	r = f.cycle(f.pod("q", "binpack", GiB), mkNode("n1", nil), mkNode("n2", nil))
	if !r.filter["n2"].IsSuccess() {
		t.Errorf("n2 after the mark is cleared: %v, want success", r.filter["n2"])
	}
}

// TestRaceForSameSpace: the first pod's Reserve books the space; the second sees none on that
// node; Unreserve gives it back; a claim bound and then counted by the agent releases the
// booking.
func TestRaceForSameSpace(t *testing.T) {
	f := newFixture(t)
	f.store("pool-a", "x", avail(2*GiB))
	x := mkNode("x", nil)
	ctx := context.Background()

	p1 := f.pod("p1", "binpack", 2*GiB)
	r1 := f.cycle(p1, x)
	if !r1.filter["x"].IsSuccess() {
		t.Fatalf("p1 filtered: %v", r1.filter["x"])
	}
	if s := f.p.Reserve(ctx, r1.state, p1, "x"); !s.IsSuccess() {
		t.Fatal(s)
	}
	p2 := f.pod("p2", "binpack", 2*GiB)
	if s := f.cycle(p2, x).filter["x"]; s.Code() != fwk.Unschedulable || !strings.HasPrefix(s.Message(), FilterReasonInsufficient) {
		t.Fatalf("p2 on x after p1's Reserve: %v", s)
	}
	f.p.Unreserve(ctx, r1.state, p1, "x")
	if s := f.cycle(p2, x).filter["x"]; !s.IsSuccess() {
		t.Fatalf("p2 after p1's Unreserve: %v", s)
	}

	// p1 reserved again, its claim is bound: the booking stays until the agent's report
	// changes, then goes (no double count, no gap).
	if s := f.p.Reserve(ctx, r1.state, p1, "x"); !s.IsSuccess() {
		t.Fatal(s)
	}
	f.p.cache.claimBound("default/p1-c0")
	if got := f.p.cache.reservedOn("pool-a", "x"); got != 2*GiB {
		t.Fatalf("booking released before the Store reported the volume: %d", got)
	}
	f.store("pool-a", "x", avail(0))
	if got := f.p.cache.reservedOn("pool-a", "x"); got != 0 {
		t.Fatalf("booking kept after the Store counted the volume: %d", got)
	}
	if s := f.cycle(p2, x).filter["x"]; s.IsSuccess() {
		t.Fatal("p2 fits on a full node")
	}
}

// A Store report releases only the bookings it accounts for: two claims bound on one node,
// a report that counts one volume releases one booking and keeps the other's bytes taken; a
// report that shrank releases none; the next report that counts both releases the rest.
func TestStoreReportReleasesOnlyBookingsItCounts(t *testing.T) {
	f := newFixture(t)
	now := time.Unix(1000, 0)
	f.p.cache.now = func() time.Time { return now }
	f.store("pool-a", "x", avail(10*GiB))
	x := mkNode("x", nil)
	ctx := context.Background()
	book := func(name string, size int64) {
		t.Helper()
		p := f.pod(name, "binpack", size)
		r := f.cycle(p, x)
		if !r.filter["x"].IsSuccess() {
			t.Fatalf("%s filtered: %v", name, r.filter["x"])
		}
		if s := f.p.Reserve(ctx, r.state, p, "x"); !s.IsSuccess() {
			t.Fatal(s)
		}
		now = now.Add(time.Second)
	}
	book("p1", 3*GiB)
	book("p2", 2*GiB)
	f.p.cache.claimBound("default/p1-c0")
	f.p.cache.claimBound("default/p2-c0")
	if got := f.p.cache.reservedOn("pool-a", "x"); got != 5*GiB {
		t.Fatalf("booked before any report: %d, want %d", got, 5*GiB)
	}
	// The report counts p2's volume only (2 GiB more provisioned).
	f.store("pool-a", "x", avail(8*GiB))
	if got := f.p.cache.reservedOn("pool-a", "x"); got != 3*GiB {
		t.Fatalf("after a report counting one volume: booked %d, want %d (p1's)", got, 3*GiB)
	}
	if s := f.cycle(f.pod("p3", "binpack", 6*GiB), x).filter["x"]; s.IsSuccess() {
		t.Fatal("p3 (6 GiB) fits where 8 GiB are free of which 3 GiB are still booked")
	}
	// A volume of someone else deleted: provisioned shrinks below the bookings' baseline.
	f.store("pool-a", "x", avail(12*GiB))
	if got := f.p.cache.reservedOn("pool-a", "x"); got != 3*GiB {
		t.Fatalf("after a report that shrank: booked %d, want %d", got, 3*GiB)
	}
	// The report now counts p1's volume as well.
	f.store("pool-a", "x", avail(9*GiB))
	if got := f.p.cache.reservedOn("pool-a", "x"); got != 0 {
		t.Fatalf("after a report counting both volumes: booked %d, want 0", got)
	}
}

// Two pods racing, timeout path: bookings not accounted for by the agent expire.
func TestBookingTimeout(t *testing.T) {
	f := newFixture(t)
	now := time.Unix(1000, 0)
	f.p.cache.now = func() time.Time { return now }
	f.store("pool-a", "x", avail(2*GiB))
	p1 := f.pod("p1", "binpack", GiB)
	r := f.cycle(p1, mkNode("x", nil))
	f.p.Reserve(context.Background(), r.state, p1, "x")
	now = now.Add(299 * time.Second)
	if n := f.p.cache.expire(); n != 0 {
		t.Fatalf("expired early: %d", n)
	}
	now = now.Add(time.Second)
	if n := f.p.cache.expire(); n != 1 || f.p.cache.reservedOn("pool-a", "x") != 0 {
		t.Fatalf("expired %d, reserved %d", n, f.p.cache.reservedOn("pool-a", "x"))
	}
}

// TestByteExactBoundaries: byte-exact boundaries, no GiB rounding, zero means no demand.
func TestByteExactBoundaries(t *testing.T) {
	const alloc = 117 * GiB // 125627793408
	for _, tc := range []struct {
		req  int64
		pass bool
	}{
		{125627793408, true},
		{125627793409, false},
		{1, true},
		{0, true},
	} {
		f := newFixture(t)
		f.store("pool-a", "n", &storev1.Capacity{Total: alloc, Allocatable: alloc, Available: alloc})
		r := f.cycle(f.pod("p", "spread", tc.req), mkNode("n", nil))
		if got := r.filter["n"].IsSuccess(); got != tc.pass {
			t.Errorf("request %d: pass=%v want %v (%v)", tc.req, got, tc.pass, r.filter["n"])
		}
		if tc.req == 0 && !r.skipped {
			t.Errorf("zero request should skip scoring (neutral), got %v", r.scores)
		}
	}
	if !fits(5, 0, 5) || fits(5, 1, 5) || !fits(0, 0, 0) || fits(0, 0, 1) || free(3, 10) != 0 {
		t.Error("fits/free arithmetic")
	}
}

// TestNodeVanished: Reserve refuses a node that left the snapshot; Filter and Score only see
// snapshot nodes, so a Store whose Node vanished is never chosen.
func TestNodeVanished(t *testing.T) {
	f := newFixture(t)
	f.nodes["here"] = true
	f.store("pool-a", "here", avail(GiB))
	f.store("pool-a", "node-gone", avail(TiB))
	p := f.pod("p", "spread", GiB)
	r := f.cycle(p, mkNode("here", nil))
	if len(r.scores) != 1 || !r.filter["here"].IsSuccess() {
		t.Fatalf("%v %v", r.filter, r.scores)
	}
	if s := f.p.Reserve(context.Background(), r.state, p, "node-gone"); s.IsSuccess() {
		t.Fatal("Reserve accepted a vanished node")
	}
	if f.p.cache.reservedOn("pool-a", "node-gone") != 0 {
		t.Fatal("booked on a vanished node")
	}
}

// NVMe-oF claims need the initiator label and no local Store.
func TestNVMeoFInitiator(t *testing.T) {
	f := newFixture(t)
	r := f.cycle(f.pod("p", "remote", 10*GiB),
		mkNode("ini", map[string]string{policyv1.LabelNVMeInitiator: "true"}),
		mkNode("no", nil),
		mkNode("false", map[string]string{policyv1.LabelNVMeInitiator: "false"}))
	if !r.filter["ini"].IsSuccess() {
		t.Fatal(r.filter["ini"])
	}
	for _, n := range []string{"no", "false"} {
		if s := r.filter[n]; s.Code() != fwk.UnschedulableAndUnresolvable || !strings.HasPrefix(s.Message(), FilterReasonNoInitiator) {
			t.Errorf("%s: %v", n, s)
		}
	}
	if !r.skipped {
		t.Error("NVMe-oF only pod should not be scored by capacity")
	}
}

// Several claims on one pool add up; a bound local volume's node scores max.
func TestSumAndBoundVolumes(t *testing.T) {
	f := newFixture(t)
	f.store("pool-a", "n1", avail(3*GiB))
	f.store("pool-a", "n2", avail(4*GiB))
	r := f.cycle(f.pod("p", "spread", 2*GiB, 2*GiB), mkNode("n1", nil), mkNode("n2", nil))
	if r.filter["n1"].IsSuccess() || !r.filter["n2"].IsSuccess() {
		t.Fatalf("sum not enforced: %v", r.filter)
	}

	f.store("pool-a", "n3", avail(TiB))
	_ = f.pvs.Add(&corev1.PersistentVolume{ObjectMeta: metav1.ObjectMeta{Name: "pv-bound"}, Spec: corev1.PersistentVolumeSpec{
		PersistentVolumeSource: corev1.PersistentVolumeSource{CSI: &corev1.CSIPersistentVolumeSource{Driver: policyv1.DriverName, VolumeHandle: "vol-x"}},
		NodeAffinity: &corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{NodeSelectorTerms: []corev1.NodeSelectorTerm{{
			MatchExpressions: []corev1.NodeSelectorRequirement{{Key: policyv1.TopologyKeyNode, Operator: corev1.NodeSelectorOpIn, Values: []string{"n2"}}}}}}},
	}})
	pod := f.pod("q", "spread", GiB)
	sc := "spread"
	_ = f.pvcs.Add(&corev1.PersistentVolumeClaim{ObjectMeta: metav1.ObjectMeta{Name: "bound", Namespace: "default"},
		Spec: corev1.PersistentVolumeClaimSpec{StorageClassName: &sc, VolumeName: "pv-bound"}})
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "b", VolumeSource: corev1.VolumeSource{
		PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "bound"}}})
	r = f.cycle(pod, mkNode("n2", nil), mkNode("n3", nil))
	if r.scores["n2"] != fwk.MaxNodeScore || r.scores["n3"] >= r.scores["n2"] {
		t.Fatalf("bound node not preferred: %v", r.scores)
	}
}

func TestArgs(t *testing.T) {
	a, err := decodeArgs(&runtime.Unknown{Raw: []byte(`{"reservationTimeoutSeconds": 60, "defaultStrategy": "Spreadout"}`)})
	if err != nil || a.ReservationTimeoutSeconds != 60 || a.DefaultStrategy != policyv1.StrategySpreadout {
		t.Fatal(a, err)
	}
	if a, err := decodeArgs(nil); err != nil || a != DefaultArgs() {
		t.Fatal(a, err)
	}
	for _, bad := range []string{`{"reservationTimeoutSeconds": -1}`, `{"defaultStrategy": "Random"}`, `{`} {
		if _, err := decodeArgs(&runtime.Unknown{Raw: []byte(bad)}); err == nil {
			t.Errorf("%s accepted", bad)
		}
	}
}

func TestUnknownProtocolWaits(t *testing.T) {
	f := newFixture(t)
	f.class("later", "x", "pool-a", "not-yet")
	_, s := f.p.PreFilter(context.Background(), newCycleState(), f.pod("p", "later", GiB), nil)
	if s.Code() != fwk.Unschedulable {
		t.Fatalf("%v", s)
	}
}

// A PVC's plinth.dev/strategy annotation turns the score around only where its Placement
// allows the override; a value the schema refuses, or an override not allowed, keeps the
// placement's strategy.
func TestStrategyOverrideByPVC(t *testing.T) {
	annotation := policyv1.OverrideAnnotations[policyv1.OverrideStrategy]
	for _, tc := range []struct {
		name        string
		overridable bool
		value       string
		mostFree    bool // the node with the most free bytes scores highest
	}{
		{"allowed", true, "Spreadout", true},
		{"not allowed", false, "Spreadout", false},
		{"invalid value", true, "spreadout", false},
		{"same as placement", true, "Binpack", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.p.cache.setStrategy("fast-binpack", policyv1.StrategyBinpack, tc.overridable)
			f.store("pool-a", "small", avail(2*GiB))
			f.store("pool-a", "large", avail(TiB))
			pod := f.pod("p", "binpack", GiB)
			obj, _, _ := f.pvcs.GetByKey("default/p-c0")
			pvc := obj.(*corev1.PersistentVolumeClaim).DeepCopy()
			pvc.Annotations = map[string]string{annotation: tc.value}
			if err := f.pvcs.Update(pvc); err != nil {
				t.Fatal(err)
			}
			r := f.cycle(pod, mkNode("small", nil), mkNode("large", nil))
			if len(r.scores) != 2 {
				t.Fatalf("scores %v, want both nodes scored", r.scores)
			}
			if got := r.scores["large"] > r.scores["small"]; got != tc.mostFree {
				t.Errorf("scores %v: most free node first = %v, want %v", r.scores, got, tc.mostFree)
			}
		})
	}
}

// Until its Store, Placement and Protocol caches have synced, PreFilter answers an error for a
// pod with claims, never Unschedulable: the scheduler retries an error with backoff, while an
// Unschedulable pod would wait for a Store or policy event the initial list already delivered.
// Once synced, the same pod is scheduled.
func TestUnsyncedCachesAreRetriedNotUnschedulable(t *testing.T) {
	f := newFixture(t)
	f.store("pool-a", "n1", avail(100*GiB))
	synced := false
	f.p.synced = func() bool { return synced }
	pod := f.pod("p", "binpack", GiB)
	if _, s := f.p.PreFilter(context.Background(), newCycleState(), pod, nil); s.Code() != fwk.Error || !strings.Contains(s.Message(), "caches to sync") {
		t.Fatalf("unsynced PreFilter: %v %q, want Error (retried with backoff)", s.Code(), s.Message())
	}
	synced = true
	if r := f.cycle(pod, mkNode("n1", nil)); !r.filter["n1"].IsSuccess() {
		t.Errorf("synced: n1 %v", r.filter["n1"])
	}
}
