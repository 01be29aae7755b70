package lvm

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/failpoint"
)

// groupFake extends snapFake with device-mapper suspend and resume (`dmsetup suspend|resume
// <vg>-<lv>`), shown as lvm2 shows them: lv_attr's fifth character 's'. Its lvcreate -s
// resumes the origin it snapshots, as lvm2 does, and records whether that origin was
// suspended. It stands in for lvm2 and dmsetup here; the real commands run in the guest.
type groupFake struct {
	snapFake
	failSnap         string          // lvcreate -s -n <failSnap> fails
	suspendedAtSnap  map[string]bool // origin → suspended when its snapshot was taken
	suspendedAtPoint []string        // suspended LVs when the failpoint was hit
}

func (f *groupFake) attr(lv string, state byte) {
	for _, l := range f.lvs {
		if DMName("vg0", l["lv_name"]) == lv || l["lv_name"] == lv {
			l["lv_attr"] = "Vwi-" + string(state) + "-tz--"
		}
	}
}

func (f *groupFake) suspended() []string {
	var out []string
	for _, l := range f.lvs {
		if a := l["lv_attr"]; len(a) > 4 && a[4] == 's' {
			out = append(out, l["lv_name"])
		}
	}
	slices.Sort(out)
	return out
}

func (f *groupFake) run(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	switch {
	case name == "dmsetup" && len(args) == 2 && args[0] == "suspend":
		f.calls = append(f.calls, name+" "+strings.Join(args, " "))
		f.attr(args[1], 's')
		return nil, nil, 0, nil
	case name == "dmsetup" && len(args) == 2 && args[0] == "resume":
		f.calls = append(f.calls, name+" "+strings.Join(args, " "))
		f.attr(args[1], 'a')
		return nil, nil, 0, nil
	case name == "lvcreate" && slices.Contains(args, "-s"):
		origin := strings.TrimPrefix(args[len(args)-1], "vg0/")
		if i := slices.Index(args, "-n"); i >= 0 && args[i+1] == f.failSnap {
			f.calls = append(f.calls, name+" "+strings.Join(args, " "))
			return nil, []byte("  Failed to suspend logical volume."), 5, nil
		}
		f.suspendedAtSnap[origin] = slices.Contains(f.suspended(), origin)
		defer f.attr(origin, 'a')
	}
	return f.snapFake.run(ctx, name, args...)
}

func newGroupFake(t *testing.T) (*groupFake, *LVM, []backend.GroupMember) {
	t.Helper()
	f := &groupFake{suspendedAtSnap: map[string]bool{}, snapFake: snapFake{fakeLVM{vgSize: 100 * gib, extent: 4 * mib, lvs: []map[string]string{
		{"lv_name": "pool0", "lv_layout": "thin,pool", "lv_size": fmt.Sprint(99 * gib), "data_percent": "10.00", "metadata_percent": "2.00"},
	}}}}
	l, err := New(Config{VolumeGroup: "vg0", ThinPool: "pool0", Run: f.run, ResyncInterval: -1, DeviceMapper: &f.fakeLVM})
	if err != nil {
		t.Fatal(err)
	}
	var ms []backend.GroupMember
	for i, n := range []string{"data", "wal"} {
		id := backend.VolumeID(n)
		if _, err := l.Create(context.Background(), id, gib); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, backend.GroupMember{SnapID: "snap-" + strings.Repeat(string("ab"[i]), 40), VolID: id})
	}
	for _, lv := range f.lvs {
		if lv["lv_name"] != "pool0" {
			lv["lv_attr"] = "Vwi-a-tz--"
		}
	}
	return f, l, ms
}

// Every origin is suspended before the first snapshot, each snapshot is taken of a suspended
// origin, and every origin is resumed at the end; a retry returns the same snapshots.
func TestGroupSnapshotSuspendsAllThenResumes(t *testing.T) {
	ctx := context.Background()
	f, l, ms := newGroupFake(t)
	f.calls = nil
	snaps, err := l.CreateGroupSnapshot(ctx, ms)
	if err != nil {
		t.Fatal(err)
	}
	if len(snaps) != 2 || snaps[0].ID != ms[0].SnapID || snaps[1].SourceVolume != ms[1].VolID {
		t.Fatalf("snapshots %+v", snaps)
	}
	var order []string
	for _, c := range f.calls {
		if w := strings.Fields(c); w[0] == "dmsetup" || (w[0] == "lvcreate" && slices.Contains(w, "-s")) {
			order = append(order, w[0]+" "+w[1])
		}
	}
	want := []string{"dmsetup suspend", "dmsetup suspend", "lvcreate -y", "lvcreate -y", "dmsetup resume", "dmsetup resume"}
	if !slices.Equal(order, want) {
		t.Errorf("commands %q, want %q", order, want)
	}
	for origin, susp := range f.suspendedAtSnap {
		if !susp {
			t.Errorf("snapshot of %s taken while it was not suspended", origin)
		}
	}
	if s := f.suspended(); len(s) != 0 {
		t.Errorf("suspended after the group snapshot: %v", s)
	}
	f.calls = nil
	again, err := l.CreateGroupSnapshot(ctx, ms)
	if err != nil || !slices.Equal(again, snaps) {
		t.Errorf("retry: %+v, %v; want %+v", again, err, snaps)
	}
	if slices.ContainsFunc(f.calls, func(c string) bool { return strings.HasPrefix(c, "dmsetup") || strings.HasPrefix(c, "lvcreate") }) {
		t.Errorf("a retry of a taken group ran %q", f.calls)
	}
}

// A snapshot that fails leaves no member (the one taken is removed) and every origin resumed;
// a group found half taken (a crash between two lvcreates) is removed and taken again whole.
func TestGroupSnapshotAllOrNone(t *testing.T) {
	ctx := context.Background()
	f, l, ms := newGroupFake(t)
	f.failSnap = ms[1].SnapID
	if _, err := l.CreateGroupSnapshot(ctx, ms); err == nil {
		t.Fatal("group snapshot with a failing member succeeded")
	}
	for _, m := range ms {
		if _, err := l.GetSnapshot(ctx, m.SnapID); err == nil {
			t.Errorf("member %s left after the group failed", m.SnapID)
		}
	}
	if s := f.suspended(); len(s) != 0 {
		t.Errorf("suspended after the failed group snapshot: %v", s)
	}
	f.failSnap = ""
	if _, err := l.CreateSnapshot(ctx, ms[0].SnapID, ms[0].VolID); err != nil { // half a group, of another instant
		t.Fatal(err)
	}
	f.calls = nil
	if _, err := l.CreateGroupSnapshot(ctx, ms); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(f.calls, func(c string) bool { return c == "lvremove -y vg0/"+ms[0].SnapID }) {
		t.Errorf("the member of another instant was not removed before the take: %q", f.calls)
	}
}

// An agent stopped between suspend and resume (failpoint lvm.group.suspended, hit with both
// origins suspended) leaves them suspended; Ensure, at the next start, resumes them.
func TestGroupSnapshotCrashResumedAtStart(t *testing.T) {
	ctx := context.Background()
	f, l, ms := newGroupFake(t)
	disable := failpoint.Enable(failpoint.LVMGroupSuspended, func() { f.suspendedAtPoint = f.suspended() })
	defer disable()
	if _, err := l.CreateGroupSnapshot(ctx, ms); err != nil {
		t.Fatal(err)
	}
	if len(f.suspendedAtPoint) != 2 {
		t.Fatalf("suspended at %s: %v, want both origins", failpoint.LVMGroupSuspended, f.suspendedAtPoint)
	}
	// what an exit at the point leaves: both origins suspended, no snapshot
	for _, m := range ms {
		if err := l.DeleteSnapshot(ctx, m.SnapID); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range f.suspendedAtPoint {
		f.attr(n, 's')
	}
	restarted, err := New(Config{VolumeGroup: "vg0", ThinPool: "pool0", Run: f.run, ResyncInterval: -1, DeviceMapper: &f.fakeLVM})
	if err != nil {
		t.Fatal(err)
	}
	if err := restarted.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	if s := f.suspended(); len(s) != 0 {
		t.Errorf("suspended after the restarted agent's Ensure: %v", s)
	}
}
