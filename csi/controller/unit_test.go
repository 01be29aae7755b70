package controller

import (
	"errors"
	"math"
	"math/big"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

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
		wantKind  error
	}{
		{"preferred node full", false, "", &csipb.TopologyRequirement{Preferred: topo("node-1")}, 40 * gib, "", volume.ErrInsufficientCapacity},
		{"preferred node has room", false, "", &csipb.TopologyRequirement{Preferred: topo("node-3", "node-2"), Requisite: topo("node-1", "node-2", "node-3")}, 40 * gib, "p.node-3", nil},
		{"binpack: fullest that fits", false, policyv1.StrategyBinpack, nil, 40 * gib, "p.node-3", nil},
		{"spreadout: emptiest", false, policyv1.StrategySpreadout, nil, 1, "p.node-2", nil},
		{"requisite restricts", false, policyv1.StrategySpreadout, &csipb.TopologyRequirement{Requisite: topo("node-1", "node-3")}, 1, "p.node-3", nil},
		{"nvme ignores consumer topology", true, policyv1.StrategySpreadout, &csipb.TopologyRequirement{Preferred: topo("node-1")}, 40 * gib, "p.node-2", nil},
		{"nothing anywhere", false, "", nil, 200 * gib, "", volume.ErrInsufficientCapacity},
		{"unknown node", false, "", &csipb.TopologyRequirement{Requisite: topo("elsewhere")}, 1, "", volume.ErrInsufficientCapacity},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, size, err := chooseStore(stores, tc.nvme, tc.strategy, tc.req, tc.required, 0)
			if volume.KindOf(err) != tc.wantKind {
				t.Fatalf("kind %v (%v), want %v", volume.KindOf(err), err, tc.wantKind)
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
	if _, _, err := chooseStore([]storev1.Store{unreported}, false, "", nil, 1, 0); volume.KindOf(err) != volume.ErrInsufficientCapacity {
		t.Errorf("store without capacity: %v", err)
	}
	// required > limit: OUT_OF_RANGE.
	if _, _, err := chooseStore(stores, false, "", nil, 2*gib, gib); volume.KindOf(err) != volume.ErrOutOfRange {
		t.Errorf("required > limit: %v", err)
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

// FuzzRoundSize feeds arbitrary CapacityRange bounds and store allocation units to RoundSize.
// Properties: an accepted size is positive, a multiple of the unit and within the range
// (InRange agrees); a refusal wraps ErrOutOfRange and happens only when no positive multiple
// of the unit fits (counted in big integers, so no overflow hides one).
func FuzzRoundSize(f *testing.F) {
	f.Add(int64(1), int64(0), int64(4<<20))
	f.Add(int64(1073741825), int64(2147483648), int64(4<<20))
	f.Add(int64(0), int64(10<<20+5), int64(4<<20))
	f.Add(int64(math.MaxInt64-1), int64(0), int64(4<<20))
	f.Fuzz(func(t *testing.T, req, lim, unit int64) {
		got, err := RoundSize(req, lim, unit)
		u := unit
		if u <= 0 {
			u = DefaultExtentBytes
		}
		if err == nil {
			if got <= 0 || got < req || (lim > 0 && got > lim) || got%u != 0 || !InRange(got, req, lim) {
				t.Fatalf("RoundSize(%d, %d, %d) = %d", req, lim, unit, got)
			}
			return
		}
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("RoundSize(%d, %d, %d): %v does not wrap ErrOutOfRange", req, lim, unit, err)
		}
		if req < 0 || lim < 0 || (lim > 0 && req > lim) {
			return
		}
		// the smallest positive multiple of u at or above req (the default size when req is 0
		// may be rounded down to the limit instead)
		bu := big.NewInt(u)
		least := new(big.Int).Mul(new(big.Int).Div(new(big.Int).Add(big.NewInt(max(req, 1)), big.NewInt(u-1)), bu), bu)
		if req == 0 && lim > 0 {
			least = bu
		}
		top := big.NewInt(math.MaxInt64)
		if lim > 0 {
			top = big.NewInt(lim)
		}
		if least.Cmp(top) <= 0 {
			t.Fatalf("RoundSize(%d, %d, %d): %v, but %s fits", req, lim, unit, err, least)
		}
	})
}
