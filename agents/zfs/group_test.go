package zfs

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// A group snapshot is one `zfs snapshot` of every member (atomic in ZFS); a retry runs none, and
// a member left of an earlier take is destroyed before the group is taken again whole.
func TestGroupSnapshotOneCommand(t *testing.T) {
	ctx := context.Background()
	f := withSnapshots(newFake("tank/k8s/volumes", 10<<30))
	z := newTestZFS(t, f, Config{Sparse: true})
	var ms []backend.GroupMember
	for i, n := range []string{"data", "wal"} {
		id := backend.VolumeID(n)
		if _, err := z.Create(ctx, id, 1<<30); err != nil {
			t.Fatal(err)
		}
		ms = append(ms, backend.GroupMember{SnapID: snapID(string("ab"[i])), VolID: id})
	}
	if _, err := z.CreateSnapshot(ctx, ms[0].SnapID, ms[0].VolID); err != nil { // half a group
		t.Fatal(err)
	}
	f.calls = nil
	snaps, err := z.CreateGroupSnapshot(ctx, ms)
	if err != nil {
		t.Fatal(err)
	}
	want := "zfs snapshot -o " + PropManaged + "=" + ManagedValue + " tank/k8s/volumes/" + ms[0].VolID + "@" + ms[0].SnapID + " tank/k8s/volumes/" + ms[1].VolID + "@" + ms[1].SnapID
	var taken []string
	for _, c := range f.calls {
		if strings.HasPrefix(c, "zfs snapshot") || strings.HasPrefix(c, "zfs destroy") {
			taken = append(taken, c)
		}
	}
	if !slices.Equal(taken, []string{"zfs destroy -d tank/k8s/volumes/" + ms[0].VolID + "@" + ms[0].SnapID, want}) {
		t.Errorf("commands %q, want the half group destroyed, then %q", taken, want)
	}
	if len(snaps) != 2 || snaps[0].CreationTime != snaps[1].CreationTime || snaps[1].SourceVolume != ms[1].VolID {
		t.Errorf("snapshots %+v: want two of one instant", snaps)
	}
	f.calls = nil
	if again, err := z.CreateGroupSnapshot(ctx, ms); err != nil || !slices.Equal(again, snaps) {
		t.Errorf("retry: %+v, %v", again, err)
	}
	if slices.ContainsFunc(f.calls, func(c string) bool { return strings.HasPrefix(c, "zfs snapshot") }) {
		t.Errorf("a retry of a taken group ran %q", f.calls)
	}
	if _, err := z.CreateGroupSnapshot(ctx, []backend.GroupMember{ms[0], {SnapID: snapID("c"), VolID: backend.VolumeID("gone")}}); err == nil ||
		!strings.Contains(err.Error(), backend.VolumeID("gone")) {
		t.Errorf("group with a missing member: %v, want an error naming it", err)
	}
}
