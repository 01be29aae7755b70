package controller

import (
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// TestSourceStore: a restore or clone is made on its source's store, never smaller than the
// source once the request is rounded to the store's unit, and for a local class only when the
// requested topology allows the source's node.
func TestSourceStore(t *testing.T) {
	const ext = 4 << 20
	// a source asked at 1,136,234,735 bytes was allocated as 271 extents of 4 MiB
	const srcBytes = 271 * ext
	stores := []storev1.Store{store("p.node-1", "node-1", 100<<30, ext), store("p.node-2", "node-2", 100<<30, ext)}
	src := &source{storeName: "p.node-1", pool: "p", minBytes: srcBytes, what: "snapshot snap-x"}
	for _, tc := range []struct {
		name            string
		pool            string
		nvme            bool
		req             *csipb.TopologyRequirement
		required, limit int64
		wantStore       string
		wantSize        int64
		wantKind        error
		wantMsg         string
	}{
		{name: "the source's own request size restores at the source's size", pool: "p", required: 1136234735, wantStore: "p.node-1", wantSize: srcBytes},
		{name: "no size: the source's", pool: "p", wantStore: "p.node-1", wantSize: srcBytes},
		{name: "larger: rounded up", pool: "p", required: srcBytes + 1, wantStore: "p.node-1", wantSize: srcBytes + ext},
		{name: "smaller after rounding", pool: "p", required: srcBytes - ext, wantKind: volume.ErrOutOfRange, wantMsg: "smaller than"},
		{name: "limit below the source", pool: "p", limit: srcBytes - ext, wantKind: volume.ErrOutOfRange},
		{name: "another pool", pool: "q", wantKind: volume.ErrInvalid, wantMsg: `lives in pool "p"`},
		{name: "local, selected node is the source's", pool: "p", req: &csipb.TopologyRequirement{Preferred: topo("node-1"), Requisite: topo("node-1", "node-2")}, wantStore: "p.node-1", wantSize: srcBytes},
		{name: "local, selected node elsewhere", pool: "p", req: &csipb.TopologyRequirement{Preferred: topo("node-2"), Requisite: topo("node-1", "node-2")}, wantKind: volume.ErrInvalid, wantMsg: "lives on node node-1"},
		{name: "local, requisite without the source's node", pool: "p", req: &csipb.TopologyRequirement{Requisite: topo("node-2")}, wantKind: volume.ErrInvalid, wantMsg: "cannot reach another node"},
		{name: "nvme-of: made on the storage node whatever the consumer", pool: "p", nvme: true, req: &csipb.TopologyRequirement{Preferred: topo("node-2")}, wantStore: "p.node-1", wantSize: srcBytes},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, size, err := sourceStore(src, stores, tc.pool, tc.nvme, policyv1.StrategyBinpack, tc.req, tc.required, tc.limit)
			if tc.wantKind != nil {
				if volume.KindOf(err) != tc.wantKind || !strings.Contains(err.Error(), tc.wantMsg) {
					t.Fatalf("err = %v, want %v containing %q", err, tc.wantKind, tc.wantMsg)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if st.Name != tc.wantStore || size != tc.wantSize {
				t.Errorf("= %s, %d bytes; want %s, %d", st.Name, size, tc.wantStore, tc.wantSize)
			}
		})
	}
	full := []storev1.Store{store("p.node-1", "node-1", srcBytes-1, ext)}
	if _, _, err := sourceStore(src, full, "p", false, policyv1.StrategyBinpack, nil, 0, 0); volume.KindOf(err) != volume.ErrInsufficientCapacity {
		t.Errorf("no room on the source's store: %v, want RESOURCE_EXHAUSTED", err)
	}
	if _, _, err := sourceStore(src, stores[1:], "p", false, policyv1.StrategyBinpack, nil, 0, 0); volume.KindOf(err) != volume.ErrPrecondition {
		t.Errorf("source's store gone: %v, want FAILED_PRECONDITION", err)
	}
}

func TestSameSource(t *testing.T) {
	snap := &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Snapshot{Snapshot: &csipb.VolumeContentSource_SnapshotSource{SnapshotId: "snap-1"}}}
	vol := &csipb.VolumeContentSource{Type: &csipb.VolumeContentSource_Volume{Volume: &csipb.VolumeContentSource_VolumeSource{VolumeId: "vol-1"}}}
	for _, tc := range []struct {
		cs   *csipb.VolumeContentSource
		spec *storev1.ContentSource
		want bool
	}{
		{nil, nil, true},
		{snap, &storev1.ContentSource{Snapshot: "snap-1"}, true},
		{vol, &storev1.ContentSource{Volume: "vol-1"}, true},
		{snap, nil, false},
		{nil, &storev1.ContentSource{Volume: "vol-1"}, false},
		{vol, &storev1.ContentSource{Snapshot: "vol-1"}, false},
	} {
		if got := sameSource(tc.cs, tc.spec); got != tc.want {
			t.Errorf("sameSource(%v, %+v) = %v, want %v", tc.cs, tc.spec, got, tc.want)
		}
	}
}

func TestSnapshotIDs(t *testing.T) {
	id := storev1.SnapshotID("CreateSnapshot/with Upper-case and a long name")
	if !storev1.IsSnapshotID(id) || storev1.IsVolumeID(id) || len(id) != 45 {
		t.Errorf("SnapshotID = %q", id)
	}
	for _, bad := range []string{"", "snap-", "vol-" + id[5:], "snap-" + strings.ToUpper(id[5:]), id + "0"} {
		if storev1.IsSnapshotID(bad) {
			t.Errorf("IsSnapshotID(%q) = true", bad)
		}
	}
}
