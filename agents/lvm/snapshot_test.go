package lvm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// snapFake extends fakeLVM with thin snapshots (`lvcreate -s ... vg0/<origin>`): the new LV
// has its origin's size and pool and the tags given, and is inactive with the activation skip
// flag (-ky / --setactivationskip y) unless -ay -K is given. It stands in for lvm2 here; the
// real commands run in the guest.
type snapFake struct{ fakeLVM }

func (f *snapFake) run(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	if name != "lvcreate" || !slices.Contains(args, "-s") {
		return f.fakeLVM.run(ctx, name, args...)
	}
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	var n string
	var tags []string
	for i := 0; i < len(args)-1; i++ {
		switch args[i] {
		case "-n":
			n = args[i+1]
		case "--addtag":
			tags = append(tags, args[i+1])
		}
	}
	origin := strings.TrimPrefix(args[len(args)-1], "vg0/")
	for _, lv := range f.lvs {
		if lv["lv_name"] == origin {
			active := ""
			if slices.Contains(args, "-K") {
				active = "active"
			}
			f.lvs = append(f.lvs, map[string]string{"lv_name": n, "lv_size": lv["lv_size"], "lv_tags": strings.Join(tags, ","),
				"lv_layout": lv["lv_layout"], "pool_lv": lv["pool_lv"], "lv_active": active})
			return nil, nil, 0, nil
		}
	}
	return nil, []byte(fmt.Sprintf("  Failed to find logical volume \"vg0/%s\"", origin)), 5, nil
}

func TestThinSnapshotRestoreClone(t *testing.T) {
	ctx := context.Background()
	f := &snapFake{fakeLVM{vgSize: 100 * gib, vgFree: 0, extent: 4 * mib, lvs: []map[string]string{
		{"lv_name": "pool0", "lv_layout": "thin,pool", "lv_size": fmt.Sprint(99 * gib), "data_percent": "10.00", "metadata_percent": "2.00"},
	}}}
	l, err := New(Config{VolumeGroup: "vg0", ThinPool: "pool0", Run: f.run, ResyncInterval: -1}) // counts every call's commands
	if err != nil {
		t.Fatal(err)
	}
	src, snap := backend.VolumeID("source"), "snap-"+strings.Repeat("a", 40)
	// 1,136,234,735 bytes round up to 271 extents of 4 MiB
	if _, err := l.Create(ctx, src, 1136234735); err != nil {
		t.Fatal(err)
	}
	// the source maps a quarter of its blocks when the snapshot is taken
	setDataPercent := func(name, pct string) {
		for _, lv := range f.lvs {
			if lv["lv_name"] == name {
				lv["data_percent"] = pct
			}
		}
	}
	setDataPercent(src, "25.00")
	s, err := l.CreateSnapshot(ctx, snap, src)
	if err != nil {
		t.Fatal(err)
	}
	if s.SizeBytes != 271*4*mib || s.SourceVolume != src {
		t.Errorf("snapshot = %+v, want 271 extents of %s", s, src)
	}
	last := f.calls[len(f.calls)-2] // the lvcreate before the lvs that reads the snapshot back
	if !strings.Contains(last, "-s --setactivationskip y -n "+snap) || !strings.HasSuffix(last, "vg0/"+src) {
		t.Errorf("snapshot command = %q", last)
	}
	if again, err := l.CreateSnapshot(ctx, snap, src); err != nil || again != s {
		t.Errorf("CreateSnapshot again = %+v, %v", again, err)
	}
	vols, err := l.List(ctx)
	if err != nil || len(vols) != 1 {
		t.Errorf("List = %v, %v; want only the source (snapshots are not volumes)", vols, err)
	}
	// The snapshot's space: the blocks it maps, recorded from its origin at creation (lvs has
	// no data_percent for the inactive snapshot), not provisioned; the origin's later writes
	// do not change it.
	if !strings.Contains(last, "--addtag "+TagMappedPrefix+fmt.Sprint(271*mib)) {
		t.Errorf("snapshot command %q does not record the origin's %d mapped bytes", last, 271*mib)
	}
	setDataPercent(src, "50.00")
	if c, err := l.Capacity(ctx); err != nil || c.SnapshotBytes != 271*mib || c.ProvisionedBytes != 271*4*mib {
		t.Errorf("Capacity = %+v, %v; want 271 MiB of snapshots (25%% of 271 extents), provisioned only the source", c, err)
	}

	// restore at the source's requested size: the same 271 extents, no lvextend
	restored := backend.VolumeID("restored")
	v, err := l.CreateVolumeFrom(ctx, restored, snap, 1136234735)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 271*4*mib || v.DevicePath == "" {
		t.Errorf("restore = %+v, want 271 extents, active", v)
	}
	for _, c := range f.calls {
		if strings.HasPrefix(c, "lvextend") {
			t.Errorf("restore at the source's size ran %s", c)
		}
	}
	// a larger clone of the volume is grown
	clone := backend.VolumeID("clone")
	v, err = l.CreateVolumeFrom(ctx, clone, src, 2*gib)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 2*gib {
		t.Errorf("clone = %d bytes, want %d", v.SizeBytes, 2*gib)
	}
	if err := l.DeleteSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := l.GetSnapshot(ctx, snap); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("GetSnapshot after delete: %v", err)
	}
	if err := l.DeleteSnapshot(ctx, snap); err != nil {
		t.Errorf("second delete: %v", err)
	}
	if _, err := l.CreateVolumeFrom(ctx, backend.VolumeID("x"), snap, gib); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("restore of a deleted snapshot: %v, want ErrNotFound", err)
	}
}

func TestThickHasNoSnapshots(t *testing.T) {
	f := &fakeLVM{vgSize: 100 * gib, vgFree: 100 * gib, extent: 4 * mib}
	l := newFake(t, f, Config{})
	ctx := context.Background()
	if _, err := l.CreateSnapshot(ctx, "snap-"+strings.Repeat("a", 40), backend.VolumeID("a")); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("snapshot on thick LVM: %v, want ErrUnsupported", err)
	}
	if _, err := l.CreateVolumeFrom(ctx, backend.VolumeID("b"), backend.VolumeID("a"), gib); !errors.Is(err, backend.ErrUnsupported) {
		t.Errorf("clone on thick LVM: %v, want ErrUnsupported", err)
	}
	if len(f.calls) != 0 {
		t.Errorf("ran %v", f.calls)
	}
}
