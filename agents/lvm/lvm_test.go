package lvm

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

const (
	mib = int64(1) << 20
	gib = int64(1) << 30
)

// fakeLVM answers vgs/lvs from an in-memory VG and records every command; it
// stands in for lvm2 in unit tests (the real commands run in the guest tests).
type fakeLVM struct {
	vgSize, vgFree, extent int64
	lvs                    []map[string]string
	calls                  []string
	fail                   map[string]string // command name → stderr, exit 5
	txn                    uint64            // the thin pool's transaction id (Status)
}

func (f *fakeLVM) run(_ context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	if se, ok := f.fail[name]; ok {
		return nil, []byte(se), 5, nil
	}
	switch name {
	case "vgs":
		return []byte(fmt.Sprintf(`{"report":[{"vg":[{"vg_name":"vg0","vg_size":"%d","vg_free":"%d","vg_extent_size":"%d","lv_count":"%d","pv_count":"1"}]}]}`,
			f.vgSize, f.vgFree, f.extent, len(f.lvs))), nil, 0, nil
	case "lvs":
		var rows []string
		target := args[len(args)-1]
		for _, lv := range f.lvs {
			if strings.Contains(target, "/") && target != "vg0/"+lv["lv_name"] {
				continue
			}
			var kv []string
			for k, v := range lv {
				kv = append(kv, fmt.Sprintf("%q:%q", k, v))
			}
			rows = append(rows, "{"+strings.Join(kv, ",")+"}")
		}
		return []byte(`{"report":[{"lv":[` + strings.Join(rows, ",") + `]}]}`), nil, 0, nil
	case "lvcreate":
		var n, size, pool string
		for i := 0; i < len(args)-1; i++ {
			switch args[i] {
			case "-n":
				n = args[i+1]
			case "-L", "-V":
				size = strings.TrimSuffix(args[i+1], "b")
			case "--thinpool":
				pool = args[i+1]
			}
		}
		seg := "linear"
		if pool != "" {
			seg = "thin,sparse"
		}
		f.lvs = append(f.lvs, map[string]string{"lv_name": n, "lv_size": size, "lv_tags": TagManaged, "lv_layout": seg, "pool_lv": pool, "lv_active": "active"})
		return nil, []byte("  WARNING: Sum of all thin volume sizes exceeds the size of thin pool.\n"), 0, nil
	case "lvextend":
		for _, lv := range f.lvs {
			if "vg0/"+lv["lv_name"] == args[2] {
				lv["lv_size"] = strings.TrimSuffix(args[1], "b")
			}
		}
		return nil, nil, 0, nil
	case "lvremove":
		for i, lv := range f.lvs {
			if "vg0/"+lv["lv_name"] == args[1] {
				f.lvs = append(f.lvs[:i], f.lvs[i+1:]...)
			}
		}
		return nil, nil, 0, nil
	}
	return nil, nil, 0, nil
}

func newFake(t *testing.T, f *fakeLVM, cfg Config) *LVM {
	t.Helper()
	cfg.VolumeGroup = "vg0"
	cfg.Run = f.run
	if cfg.DeviceMapper == nil {
		cfg.DeviceMapper = f
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Byte-precise sizes are rounded UP to the 4 MiB extent.
func TestCreateRoundsUpToExtent(t *testing.T) {
	f := &fakeLVM{vgSize: 100 * gib, vgFree: 100 * gib, extent: 4 * mib}
	l := newFake(t, f, Config{})
	ctx := context.Background()
	for _, tt := range []struct {
		name      string
		req, want int64
	}{{"one-byte", 1, 4194304}, {"gib-plus-one", 1073741825, 1077936128}} {
		v, err := l.Create(ctx, backend.VolumeID(tt.name), tt.req)
		if err != nil {
			t.Fatal(err)
		}
		if v.SizeBytes != tt.want {
			t.Errorf("%s: size %d, want %d", tt.name, v.SizeBytes, tt.want)
		}
		// idempotent: same request returns the same volume, no lvcreate
		n := len(f.calls)
		v2, err := l.Create(ctx, backend.VolumeID(tt.name), tt.req)
		if err != nil || v2 != v {
			t.Errorf("repeat create: %+v, %v", v2, err)
		}
		for _, c := range f.calls[n:] {
			if strings.HasPrefix(c, "lvcreate") {
				t.Errorf("repeat create ran %s", c)
			}
		}
	}
	// bigger request for an existing id → ErrAlreadyExists
	if _, err := l.Create(ctx, backend.VolumeID("one-byte"), 8*mib); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("grown re-create: %v", err)
	}
}

// The reserve is honoured on create, not only in reporting.
func TestCreateHonoursReserve(t *testing.T) {
	f := &fakeLVM{vgSize: 100 * gib, vgFree: 40 * gib, extent: 4 * mib}
	// each Capacity reads anew: the VG's free space changes below with no LV to show it
	l := newFake(t, f, Config{ReserveBytes: 20 * gib, ResyncInterval: -1})
	ctx := context.Background()
	c, err := l.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.Available(20*gib, 0); got != 21474836480 {
		t.Errorf("available %d", got)
	}
	if _, err := l.Create(ctx, backend.VolumeID("into-reserve"), 30*gib); !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Errorf("create into reserve: %v", err)
	}
	for _, c := range f.calls {
		if strings.HasPrefix(c, "lvcreate") {
			t.Errorf("lvcreate ran: %s", c)
		}
	}
	f.vgFree = 10 * gib
	c, _ = l.Capacity(ctx)
	if got := c.Available(20*gib, 0); got != 0 {
		t.Errorf("reserve above VG free: available %d, want 0", got)
	}
}

// Thin capacity comes from the pool, never from VG free.
func TestThinCapacityFromPool(t *testing.T) {
	f := &fakeLVM{vgSize: 100 * gib, vgFree: 0, extent: 4 * mib, lvs: []map[string]string{
		{"lv_name": "pool0", "lv_layout": "thin,pool", "lv_size": fmt.Sprint(99 * gib), "data_percent": "10.00", "metadata_percent": "2.00"},
		{"lv_name": backend.VolumeID("a"), "lv_layout": "thin,sparse", "pool_lv": "pool0", "lv_size": fmt.Sprint(15 * gib), "lv_tags": TagManaged},
		{"lv_name": backend.VolumeID("b"), "lv_layout": "thin,sparse", "pool_lv": "pool0", "lv_size": fmt.Sprint(5 * gib), "lv_tags": TagManaged + ",other"},
		{"lv_name": "foreign", "lv_layout": "thin,sparse", "pool_lv": "pool0", "lv_size": fmt.Sprint(50 * gib)},
	}}
	thin := newFake(t, f, Config{ThinPool: "pool0", OvercommitPercent: 1000})
	c, err := thin.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if !c.Thin || c.TotalBytes != 99*gib || c.ProvisionedBytes != 20*gib || c.DataUsedRatio != 0.1 || c.MetadataUsedRatio != 0.02 {
		t.Errorf("thin capacity %+v", c)
	}
	if got := c.Available(0, 1000); got != 970*gib {
		t.Errorf("thin available %d, want 970 GiB", got)
	}
	pool := float64(99 * gib)
	if got, want := c.FreeBytes, 99*gib-int64(pool*0.1); got != want {
		t.Errorf("pool free %d, want %d (89.1 GiB)", got, want)
	}
	thick := newFake(t, f, Config{})
	c, _ = thick.Capacity(context.Background())
	if got := c.Available(0, 0); got != 0 {
		t.Errorf("thick available %d, want 0", got)
	}
	// thin create: -V into the pool, the stderr warning is not an error
	v, err := thin.Create(context.Background(), backend.VolumeID("c"), 1*gib)
	if err != nil || !v.Thin || v.SizeBytes != gib {
		t.Fatalf("thin create %+v, %v", v, err)
	}
	vols, err := thin.List(context.Background())
	if err != nil || len(vols) != 3 {
		t.Errorf("list %+v, %v (foreign LV must not be listed)", vols, err)
	}
}

// Frugal: an observation is exactly one vgs and one lvs (here each call observes anew).
func TestRefreshIsOnePair(t *testing.T) {
	f := &fakeLVM{vgSize: 10 * gib, vgFree: 10 * gib, extent: 4 * mib}
	for i := 0; i < 50; i++ {
		f.lvs = append(f.lvs, map[string]string{"lv_name": backend.VolumeID(fmt.Sprint(i)), "lv_layout": "linear", "lv_size": "4194304", "lv_tags": TagManaged})
	}
	l := newFake(t, f, Config{ResyncInterval: -1})
	if _, err := l.List(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := l.Capacity(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(f.calls) != 4 {
		t.Errorf("calls %v, want 2 × (vgs, lvs)", f.calls)
	}
}

func TestErrorsCarryCommandAndStderr(t *testing.T) {
	f := &fakeLVM{vgSize: 10 * gib, vgFree: 10 * gib, extent: 4 * mib, fail: map[string]string{"lvcreate": `  Volume group "vg0" has insufficient free space (991 extents): 25600 required.`}}
	l := newFake(t, f, Config{})
	_, err := l.Create(context.Background(), backend.VolumeID("x"), gib)
	var ce *backend.CommandError
	if !errors.As(err, &ce) || !errors.Is(err, backend.ErrInsufficientCapacity) {
		t.Fatalf("err %v", err)
	}
	if !strings.Contains(err.Error(), "lvcreate -y -n vol-") || !strings.Contains(err.Error(), "insufficient free space") {
		t.Errorf("message lacks command or stderr: %v", err)
	}
	f.fail = map[string]string{"vgs": `  Volume group "vg0" not found` + "\n  Cannot process volume group vg0"}
	if _, err := l.List(context.Background()); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("missing vg: %v", err)
	}
}

func TestDeleteLeavesForeignLV(t *testing.T) {
	id := backend.VolumeID("x")
	f := &fakeLVM{vgSize: 10 * gib, vgFree: 10 * gib, extent: 4 * mib, lvs: []map[string]string{{"lv_name": id, "lv_layout": "linear", "lv_size": "4194304"}}}
	l := newFake(t, f, Config{})
	if err := l.Delete(context.Background(), id); err != nil {
		t.Fatal(err)
	}
	if len(f.lvs) != 1 {
		t.Errorf("untagged LV was removed")
	}
	if _, err := l.Create(context.Background(), id, 1); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("create over foreign LV: %v", err)
	}
	if err := l.Delete(context.Background(), backend.VolumeID("absent")); err != nil {
		t.Errorf("delete absent: %v", err)
	}
}

// Observe (the agent's periodic refresh) is capacity and volumes from ONE pair.
func TestObserveIsOnePair(t *testing.T) {
	f := &fakeLVM{vgSize: 10 * gib, vgFree: 6 * gib, extent: 4 * mib}
	for i := 0; i < 3; i++ {
		f.lvs = append(f.lvs, map[string]string{"lv_name": backend.VolumeID(fmt.Sprint(i)), "lv_layout": "linear", "lv_size": "4194304", "lv_tags": TagManaged})
	}
	f.lvs = append(f.lvs, map[string]string{"lv_name": "foreign", "lv_layout": "linear", "lv_size": "4194304"})
	l := newFake(t, f, Config{})
	c, vols, err := l.Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 3 || c.ProvisionedBytes != 3*4*mib || c.TotalBytes != 10*gib || c.FreeBytes != 6*gib {
		t.Errorf("Observe = %+v, %d volumes", c, len(vols))
	}
	if len(f.calls) != 2 || !strings.HasPrefix(f.calls[0], "vgs ") || !strings.HasPrefix(f.calls[1], "lvs ") {
		t.Errorf("calls %v, want one vgs and one lvs", f.calls)
	}
}
