package lvm

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	clocktesting "k8s.io/utils/clock/testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Devices shows the fake's active LVs as device-mapper would: "vg0-<lv>" (hyphens doubled),
// and a thin pool row as its "-tpool" device.
func (f *fakeLVM) Devices() ([]DMDevice, error) {
	var out []DMDevice
	for i, lv := range f.lvs {
		switch {
		case lv["lv_layout"] == "thin,pool":
			out = append(out, DMDevice{Name: "vg0-" + dmEscape(lv["lv_name"]) + "-tpool", Dev: unix.Mkdev(253, uint32(i))})
		case lv["lv_active"] == "active":
			out = append(out, DMDevice{Name: "vg0-" + dmEscape(lv["lv_name"]), Dev: unix.Mkdev(253, uint32(i))})
		}
	}
	// another VG whose name starts like ours is not ours
	return append(out, DMDevice{Name: "vg0--x-" + dmEscape(backend.VolumeID("other")), Dev: unix.Mkdev(253, 999)}), nil
}

// Status reports the pool row's data and metadata percentages as thin-pool usage (of 10,000
// blocks each) and the fake's transaction id.
func (f *fakeLVM) Status(name string) (string, string, error) {
	for _, lv := range f.lvs {
		if lv["lv_layout"] == "thin,pool" && name == "vg0-"+dmEscape(lv["lv_name"])+"-tpool" {
			data, _ := strconv.ParseFloat(lv["data_percent"], 64)
			meta, _ := strconv.ParseFloat(lv["metadata_percent"], 64)
			return "thin-pool", fmt.Sprintf("%d %d/10000 %d/10000 - rw discard_passdown queue_if_no_space - 1024",
				f.txn, int(meta*100), int(data*100)), nil
		}
	}
	return "", "", fmt.Errorf("device-mapper status of %s: %w", name, unix.ENXIO)
}

// An idle VG's report is kept: a second observation, and every Get, run no command; the
// agent's own write, a device-mapper change and the resync each make the next call read anew,
// and capacity and volumes are right after each.
func TestKeptReport(t *testing.T) {
	ctx := context.Background()
	ids := []string{backend.VolumeID("a"), backend.VolumeID("b"), backend.VolumeID("c")}
	d := backend.VolumeID("d")
	f := &fakeLVM{vgSize: 100 * gib, extent: 4 * mib, lvs: []map[string]string{
		{"lv_name": "pool0", "lv_layout": "thin,pool", "lv_size": fmt.Sprint(64 * gib), "data_percent": "10.00", "metadata_percent": "2.00"},
	}}
	for i, id := range ids {
		active := map[bool]string{true: "active", false: ""}[i < 2] // c is inactive
		f.lvs = append(f.lvs, map[string]string{"lv_name": id, "lv_layout": "thin,sparse", "pool_lv": "pool0", "lv_size": fmt.Sprint(gib), "lv_tags": TagManaged, "lv_active": active})
	}
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	l := newFake(t, f, Config{ThinPool: "pool0", Clock: clk})
	observe := func(step string, wantCalls int, wantIDs []string, wantProvisioned int64, wantData float64) {
		t.Helper()
		f.calls = nil
		c, vols, err := l.Observe(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		var got []string
		for _, v := range vols {
			got = append(got, v.ID)
		}
		wantIDs = append([]string(nil), wantIDs...)
		sort.Strings(wantIDs)
		if len(f.calls) != wantCalls || strings.Join(got, ",") != strings.Join(wantIDs, ",") ||
			c.ProvisionedBytes != wantProvisioned || c.DataUsedRatio != wantData {
			t.Errorf("%s: calls %q, volumes %v, provisioned %d, data %.4f; want %d calls, %v, %d, %.4f",
				step, f.calls, got, c.ProvisionedBytes, c.DataUsedRatio, wantCalls, wantIDs, wantProvisioned, wantData)
		}
	}
	observe("first", 2, ids, 3*gib, 0.10)
	observe("idle", 0, ids, 3*gib, 0.10)
	f.calls = nil
	for _, id := range ids {
		if v, err := l.Get(ctx, id); err != nil || v.SizeBytes != gib {
			t.Errorf("get %s: %+v, %v", id, v, err)
		}
	}
	if len(f.calls) != 0 {
		t.Errorf("gets ran %q, want none (the kept report)", f.calls)
	}

	// pool usage between reports comes from device-mapper
	f.lvs[0]["data_percent"] = "37.50"
	observe("pool filled", 0, ids, 3*gib, 0.375)

	// own write: Create runs its own pair, then the next observation reads anew
	if _, err := l.Create(ctx, d, 2*gib); err != nil {
		t.Fatal(err)
	}
	all := append(append([]string{}, ids...), d)
	observe("after create", 2, all, 5*gib, 0.375)
	observe("idle again", 0, all, 5*gib, 0.375)
	if _, err := l.Expand(ctx, d, 3*gib); err != nil {
		t.Fatal(err)
	}
	observe("after expand", 2, all, 6*gib, 0.375)

	// behind the back, device-mapper shows it: an active LV removed
	f.lvs = append(f.lvs[:1], f.lvs[2:]...) // a
	bcd := []string{ids[1], ids[2], d}
	observe("active LV removed", 2, bcd, 5*gib, 0.375)
	// a thin LV created or deleted while inactive moves the pool's transaction id
	f.txn++
	observe("pool transaction", 2, bcd, 5*gib, 0.375)

	// behind the back, device-mapper does not show it: the inactive c's tag removed; kept
	// until the resync
	for _, lv := range f.lvs {
		if lv["lv_name"] == ids[2] {
			lv["lv_tags"] = ""
		}
	}
	clk.SetTime(clk.Now().Add(DefaultResyncInterval - time.Second))
	observe("before resync", 0, bcd, 5*gib, 0.375)
	clk.SetTime(clk.Now().Add(time.Second))
	observe("resync", 2, []string{ids[1], d}, 4*gib, 0.375)
	observe("after resync", 0, []string{ids[1], d}, 4*gib, 0.375)
}

// The poll peer (ResyncInterval < 0) and a node whose device-mapper cannot be read run a
// pair on every call.
func TestNoKeptReport(t *testing.T) {
	for name, cfg := range map[string]Config{
		"poll":             {ResyncInterval: -1},
		"no device-mapper": {DeviceMapper: noDM{}},
	} {
		t.Run(name, func(t *testing.T) {
			f := &fakeLVM{vgSize: 10 * gib, vgFree: 10 * gib, extent: 4 * mib}
			l := newFake(t, f, cfg)
			for i := 0; i < 3; i++ {
				if _, _, err := l.Observe(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			if len(f.calls) != 6 {
				t.Errorf("calls %q, want 3 × (vgs, lvs)", f.calls)
			}
		})
	}
}

type noDM struct{}

func (noDM) Devices() ([]DMDevice, error) { return nil, fmt.Errorf("device-mapper: %w", unix.ENOENT) }
func (noDM) Status(string) (string, string, error) {
	return "", "", fmt.Errorf("device-mapper: %w", unix.ENOENT)
}

func TestParseThinPoolStatus(t *testing.T) {
	st, err := parseThinPoolStatus("7 1089/2048 3277/13107 - rw no_discard_passdown queue_if_no_space - 1024")
	if err != nil || st.transaction != 7 || st.mode != "rw" || st.usedData != 3277 || st.totalData != 13107 ||
		st.dataPercent != 3277.0/13107*100 || st.metaPercent != 1089.0/2048*100 {
		t.Errorf("status %+v, %v", st, err)
	}
	if st, err := parseThinPoolStatus("Fail"); err != nil || st.mode != "Fail" || st.totalData != 0 {
		t.Errorf("Fail: %+v, %v", st, err)
	}
	for _, bad := range []string{"", "x 1/2 3/4 - rw y", "1 12 3/4 - rw y", "1 1/0 3/4 - rw y", "1 1/2 5/4 - rw y", "1 1/2"} {
		if _, err := parseThinPoolStatus(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The kernel's dm_name_list records: dev, offset of the next, name; a first dev of 0 is none.
func TestParseNameList(t *testing.T) {
	rec := func(dev uint64, next uint32, name string) []byte {
		b := make([]byte, 12, 24)
		binary := func(off int, v uint64, n int) {
			for i := 0; i < n; i++ {
				b[off+i] = byte(v >> (8 * i))
			}
		}
		binary(0, dev, 8)
		binary(8, uint64(next), 4)
		b = append(b, name...)
		b = append(b, 0)
		for len(b)%8 != 0 || len(b) < int(next) {
			b = append(b, 0)
		}
		return b
	}
	first := rec(unix.Mkdev(253, 3), 32, "vg0-pool0-tpool")
	data := append(first, rec(unix.Mkdev(253, 4), 0, "vg0-vol--a")...)
	devs, err := parseNameList(data)
	if err != nil || len(devs) != 2 || devs[0].Name != "vg0-pool0-tpool" || devs[1].Dev != unix.Mkdev(253, 4) || devs[1].Name != "vg0-vol--a" {
		t.Errorf("devices %+v, %v", devs, err)
	}
	if devs, err := parseNameList(make([]byte, 16)); err != nil || devs != nil {
		t.Errorf("empty list %+v, %v", devs, err)
	}
	if _, err := parseNameList(data[:40]); err == nil {
		t.Error("truncated list: no error")
	}
}
