package lvm

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// countingLVM is a thin-pool backend on the guest's VG that counts its vgs and lvs commands and
// ages its kept report on a fake clock.
func countingLVM(t testing.TB, resync time.Duration, clk *clocktesting.FakePassiveClock, reports *atomic.Int64) *LVM {
	t.Helper()
	l, err := New(Config{VolumeGroup: guestVG, Devices: []string{guestDisk()}, ThinPool: "pool0", OvercommitPercent: 1000,
		ResyncInterval: resync, Clock: clk,
		OnCommand: func(name string, _ []string, _ time.Duration, _ error) {
			if name == "vgs" || name == "lvs" {
				reports.Add(1)
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Behind the agent's back on the real kernel and lvm2: what device-mapper shows is seen at the
// next refresh, the rest at the resync; the agent's own writes are seen at once; between
// reports the thin pool's usage is the kernel's; a restarted backend's Gets share one report.
func TestGuestObserveKeepsReport(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	disk := guestDisk()
	cleanupVG(t, disk)
	t.Cleanup(func() { cleanupVG(t, disk) })
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	var reports atomic.Int64
	l := countingLVM(t, DefaultResyncInterval, clk, &reports)
	if err := l.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	a, b, c, d := backend.VolumeID("a"), backend.VolumeID("b"), backend.VolumeID("c"), backend.VolumeID("d")
	for _, id := range []string{a, b, c, d} {
		if _, err := l.Create(ctx, id, 64<<20); err != nil {
			t.Fatal(err)
		}
	}
	// observe checks the volumes (id → active) and the capacity against lvs, and the number of
	// vgs and lvs run
	observe := func(step string, wantReports int64, want map[string]bool) backend.Capacity {
		t.Helper()
		reports.Store(0)
		cp, vols, err := l.Observe(ctx)
		if err != nil {
			t.Fatalf("%s: %v", step, err)
		}
		got := map[string]bool{}
		var provisioned int64
		for _, v := range vols {
			got[v.ID] = v.DevicePath != ""
			provisioned += v.SizeBytes
		}
		if n := reports.Load(); n != wantReports || fmt.Sprint(got) != fmt.Sprint(want) || cp.ProvisionedBytes != provisioned {
			t.Errorf("%s: %d vgs/lvs, volumes %v (provisioned %d, volumes sum %d); want %d, %v",
				step, n, got, cp.ProvisionedBytes, provisioned, wantReports, want)
		}
		return cp
	}
	all := map[string]bool{a: true, b: true, c: true, d: true}
	observe("first", 2, all)
	observe("idle", 0, all)
	for _, id := range []string{a, b, c, d} {
		if _, err := l.Get(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if n := reports.Load(); n != 0 {
		t.Errorf("gets ran %d vgs/lvs, want 0", n)
	}

	// data written behind the back: the pool's usage from DM_TABLE_STATUS (no flush), as lvs
	// reports it once the pool's transaction is committed (lvs commits it first; the kernel
	// does within a second)
	before := observe("before write", 0, all)
	sh(t, "dd", "if=/dev/urandom", "of=/dev/"+guestVG+"/"+a, "bs=1M", "count=32", "oflag=direct", "status=none")
	pool := rawLV(t, "pool0")
	after := observe("after write", 0, all)
	if after.DataUsedRatio <= before.DataUsedRatio || math.Abs(after.DataUsedRatio*100-pool.DataPercent) > 0.01 ||
		math.Abs(after.MetadataUsedRatio*100-pool.MetadataPercent) > 0.01 {
		t.Errorf("pool use %.4f%% data, %.4f%% metadata (%.4f%% before); lvs says %.2f%%, %.2f%%",
			after.DataUsedRatio*100, after.MetadataUsedRatio*100, before.DataUsedRatio*100, pool.DataPercent, pool.MetadataPercent)
	}

	// the agent's own write
	if _, err := l.Expand(ctx, a, 128<<20); err != nil {
		t.Fatal(err)
	}
	if got := observe("after expand", 2, all); got.ProvisionedBytes != (128+3*64)<<20 {
		t.Errorf("after expand: provisioned %d", got.ProvisionedBytes)
	}
	observe("idle after expand", 0, all)

	// behind the back, shown by device-mapper: an active LV removed, an LV deactivated, an
	// inactive thin LV removed (the pool's transaction id)
	sh(t, "lvremove", "-y", guestVG+"/"+b)
	delete(all, b)
	observe("active LV removed", 2, all)
	sh(t, "lvchange", "-an", guestVG+"/"+c)
	sh(t, "lvchange", "-an", guestVG+"/"+d)
	all[c], all[d] = false, false
	observe("deactivated", 2, all)
	sh(t, "lvremove", "-y", guestVG+"/"+d)
	delete(all, d)
	observe("inactive thin LV removed", 2, all)

	// behind the back, not shown by device-mapper: the inactive c's tag; seen at the resync
	sh(t, "lvchange", "--deltag", TagManaged, guestVG+"/"+c)
	clk.SetTime(clk.Now().Add(DefaultResyncInterval - time.Second))
	observe("tag removed, before the resync", 0, all)
	clk.SetTime(clk.Now().Add(time.Second))
	delete(all, c)
	observe("resync", 2, all)
	observe("idle after resync", 0, all)

	// a restarted agent: one pair for the Store's refresh and every VolumeState's Get
	l = countingLVM(t, DefaultResyncInterval, clk, &reports)
	observe("restart", 2, all)
	if _, err := l.Get(ctx, a); err != nil {
		t.Fatal(err)
	}
	if n := reports.Load(); n != 2 {
		t.Errorf("restart: %d vgs/lvs for Observe and Get, want 2", n)
	}
}

// BenchmarkGuestIdleLVM measures an idle Store of 100 thin volumes on the real kernel: vgs/lvs
// per minute per VG at the agent's refresh of 30 s (a fake clock steps 30 s per op; the
// commands, ioctls and reports are real), with the kept report (resync 5 min) and beside it
// the poll peer (ResyncInterval < 0: vgs + lvs at every refresh, the behaviour before), in
// the same run; and the process's RSS. Run it with -test.benchtime=20x (ten idle minutes).
func BenchmarkGuestIdleLVM(b *testing.B) {
	requireGuest(b)
	ctx := context.Background()
	disk := guestDisk()
	cleanupVG(b, disk)
	b.Cleanup(func() { cleanupVG(b, disk) })
	var reports atomic.Int64
	clk := clocktesting.NewFakePassiveClock(time.Unix(1e9, 0))
	if err := countingLVM(b, -1, clk, &reports).Ensure(ctx); err != nil {
		b.Fatal(err)
	}
	const volumes = 100
	var script strings.Builder // one lvm shell for the setup
	for i := range volumes {
		fmt.Fprintf(&script, "lvcreate -y -n %s --addtag %s -V 4m --thinpool pool0 %s\n", backend.VolumeID(strconv.Itoa(i)), TagManaged, guestVG)
	}
	cmd := exec.Command("lvm")
	cmd.Stdin = strings.NewReader(script.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		b.Fatalf("lvm shell: %v\n%s", err, out)
	}
	for _, peer := range []struct {
		name   string
		resync time.Duration
	}{{"kept", DefaultResyncInterval}, {"poll", -1}} {
		b.Run(peer.name, func(b *testing.B) {
			l := countingLVM(b, peer.resync, clk, &reports)
			if _, _, err := l.Observe(ctx); err != nil {
				b.Fatal(err)
			}
			reports.Store(0)
			b.ReportAllocs()
			refreshes := 0
			for b.Loop() {
				refreshes++
				clk.SetTime(clk.Now().Add(30 * time.Second))
				if _, vols, err := l.Observe(ctx); err != nil || len(vols) != volumes {
					b.Fatalf("observe: %d volumes, %v", len(vols), err)
				}
			}
			minutes := float64(refreshes) * 0.5
			b.ReportMetric(float64(reports.Load())/minutes, "lvm-cmds/min/VG")
			b.ReportMetric(float64(rssBytes(b))/(1<<20), "rss-MiB")
		})
	}
}

// rssBytes is this process's resident set (VmRSS of /proc/self/status).
func rssBytes(t testing.TB) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "VmRSS:" {
			kb, err := strconv.ParseInt(f[1], 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatal("no VmRSS in /proc/self/status")
	return 0
}
