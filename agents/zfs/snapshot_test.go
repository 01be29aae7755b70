package zfs

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// fakeSnapshots adds snapshots, clones, deferred destruction and promotion to fakeZFS, with
// the semantics of zfs-destroy(8) and zfs-promote(8): a snapshot with clones destroyed with -d
// is marked and goes when its last clone goes; a zvol with snapshots cannot be destroyed;
// promoting a clone moves its origin snapshot and the older snapshots of the origin's zvol to
// the clone, and the old zvol becomes a clone of the moved origin snapshot. It stands in for
// zfs in unit tests; the real commands run in the guest.
type fakeSnapshots struct {
	snaps  map[string]*fakeSnap // "<zvol>@<snap>"
	origin map[string]string    // clone zvol → its origin snapshot
	clock  int64
}

type fakeSnap struct {
	managed  bool
	deferred bool
	volsize  int64
	creation int64
	clones   []string
}

func withSnapshots(f *fakeZFS) *fakeZFS {
	f.snaps = &fakeSnapshots{snaps: map[string]*fakeSnap{}, origin: map[string]string{}}
	return f
}

// snapshotCommand answers the snapshot commands; ok false hands the command to fakeZFS.run.
func (f *fakeZFS) snapshotCommand(name string, args []string) (out, stderr []byte, code int, ok bool) {
	if name != "zfs" || len(args) == 0 {
		return nil, nil, 0, false
	}
	target := args[len(args)-1]
	if args[0] == "list" && slices.Contains(args, "snapshot") {
		if f.snaps == nil {
			return nil, nil, 0, true
		}
		depth := 1
		if i := slices.Index(args, "-d"); i >= 0 {
			depth, _ = strconv.Atoi(args[i+1])
		}
		var names []string
		for n := range f.snaps.snaps {
			z, _, _ := strings.Cut(n, "@")
			if z == target || (depth == 2 && strings.HasPrefix(z, target+"/")) {
				names = append(names, n)
			}
		}
		sort.Strings(names)
		var rows []string
		for _, n := range names {
			s := f.snaps.snaps[n]
			m, d, c := "-", "off", "-"
			if s.managed {
				m = ManagedValue
			}
			if s.deferred {
				d = "on"
			}
			if len(s.clones) > 0 {
				c = strings.Join(s.clones, ",")
			}
			rows = append(rows, strings.Join([]string{n, "4096", strconv.FormatInt(s.volsize, 10), strconv.FormatInt(s.creation, 10), d, c, m}, "\t"))
		}
		if len(rows) == 0 {
			return nil, nil, 0, true
		}
		return []byte(strings.Join(rows, "\n") + "\n"), nil, 0, true
	}
	if f.snaps == nil {
		return nil, nil, 0, false
	}
	fs := f.snaps
	switch args[0] {
	case "snapshot": // every <zvol>@<snap> argument, all or none, at one clock tick
		var names []string
		for _, a := range args {
			if strings.Contains(a, "@") {
				names = append(names, a)
			}
		}
		for _, n := range names {
			z, _, _ := strings.Cut(n, "@")
			if _, exists := f.vols[z]; !exists {
				return nil, []byte(fmt.Sprintf("cannot open '%s': dataset does not exist", z)), 1, true
			}
			if _, dup := fs.snaps[n]; dup {
				return nil, []byte(fmt.Sprintf("cannot create snapshot '%s': dataset already exists", n)), 1, true
			}
		}
		fs.clock++
		for _, n := range names {
			z, _, _ := strings.Cut(n, "@")
			fs.snaps[n] = &fakeSnap{managed: slices.Contains(args, PropManaged+"="+ManagedValue), volsize: f.vols[z].VolSizeBytes, creation: fs.clock}
		}
		return nil, nil, 0, true
	case "clone":
		origin := args[len(args)-2]
		s, exists := fs.snaps[origin]
		if !exists {
			return nil, []byte(fmt.Sprintf("cannot open '%s': dataset does not exist", origin)), 1, true
		}
		z, _, _ := strings.Cut(origin, "@")
		d := &Dataset{Name: target, Type: "volume", UsedBytes: 8192, ReferencedBytes: 8192, VolSizeBytes: s.volsize, VolBlockSizeBytes: f.vols[z].VolBlockSizeBytes}
		if slices.Contains(args, PropManaged+"="+ManagedValue) {
			d.Managed = ManagedValue
		}
		f.vols[target] = d
		s.clones = append(s.clones, target)
		fs.origin[target] = origin
		return nil, nil, 0, true
	case "destroy":
		if args[1] == "-d" {
			s, exists := fs.snaps[target]
			if !exists {
				return nil, []byte(fmt.Sprintf("could not find any snapshots to destroy; check snapshot names.")), 1, true
			}
			if len(s.clones) > 0 {
				s.deferred = true
			} else {
				delete(fs.snaps, target)
			}
			return nil, nil, 0, true
		}
		for n := range fs.snaps {
			if strings.HasPrefix(n, target+"@") {
				return nil, []byte(fmt.Sprintf("cannot destroy '%s': volume has children\nuse '-r' to destroy the following datasets:\n%s", target, n)), 1, true
			}
		}
		delete(f.vols, target)
		if o, isClone := fs.origin[target]; isClone {
			delete(fs.origin, target)
			s := fs.snaps[o]
			s.clones = slices.DeleteFunc(s.clones, func(c string) bool { return c == target })
			if s.deferred && len(s.clones) == 0 {
				delete(fs.snaps, o)
			}
		}
		return nil, nil, 0, true
	case "promote":
		o := fs.origin[target]
		z, _, _ := strings.Cut(o, "@")
		limit := fs.snaps[o].creation
		moved := map[string]string{}
		for n, s := range fs.snaps {
			if sz, sn, _ := strings.Cut(n, "@"); sz == z && s.creation <= limit {
				moved[n] = target + "@" + sn
			}
		}
		for from, to := range moved {
			fs.snaps[to] = fs.snaps[from]
			delete(fs.snaps, from)
			for c, co := range fs.origin {
				if co == from {
					fs.origin[c] = to
				}
			}
		}
		newOrigin := moved[o]
		s := fs.snaps[newOrigin]
		s.clones = append(slices.DeleteFunc(s.clones, func(c string) bool { return c == target }), z)
		delete(fs.origin, target)
		fs.origin[z] = newOrigin
		return nil, nil, 0, true
	}
	return nil, nil, 0, false
}

func snapID(s string) string { return "snap-" + strings.Repeat(s, 40) }

// TestSnapshotDeleteOrder is the delete order of snapshot.go: a snapshot with a restored clone
// is deleted for the CO at once and goes, with its space, when the clone goes; a zvol with a
// live snapshot is refused; a zvol whose deleted snapshots still have clones is destroyed
// after promoting the clone; nothing is left behind.
func TestSnapshotDeleteOrder(t *testing.T) {
	ctx := context.Background()
	f := withSnapshots(newFake("tank/k8s/volumes", 10<<30))
	z := newTestZFS(t, f, Config{Sparse: true})
	src, restored := backend.VolumeID("zfs source"), backend.VolumeID("zfs restored")
	if _, err := z.Create(ctx, src, 1<<30); err != nil {
		t.Fatal(err)
	}
	s, err := z.CreateSnapshot(ctx, snapID("a"), src)
	if err != nil {
		t.Fatal(err)
	}
	if s.SizeBytes != 1<<30 || s.SourceVolume != src || s.Name != "tank/k8s/volumes/"+src+"@"+snapID("a") {
		t.Errorf("snapshot = %+v", s)
	}
	if again, err := z.CreateSnapshot(ctx, snapID("a"), src); err != nil || again != s {
		t.Errorf("CreateSnapshot again = %+v, %v", again, err)
	}
	if err := z.Delete(ctx, src); !errors.Is(err, backend.ErrInUse) || !strings.Contains(err.Error(), snapID("a")) {
		t.Errorf("delete of a zvol with a live snapshot: %v, want ErrInUse naming it", err)
	}
	// a restore larger than the snapshot gets its volsize raised
	v, err := z.CreateVolumeFrom(ctx, restored, snapID("a"), 2<<30)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 2<<30 {
		t.Errorf("restore = %d bytes, want %d", v.SizeBytes, 2<<30)
	}
	// rule 1: deleted for the CO, kept (deferred) for the clone
	if err := z.DeleteSnapshot(ctx, snapID("a")); err != nil {
		t.Fatal(err)
	}
	if _, err := z.GetSnapshot(ctx, snapID("a")); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("GetSnapshot of a deferred snapshot: %v, want ErrNotFound", err)
	}
	if len(f.snaps.snaps) != 1 {
		t.Errorf("snapshots = %v, want the deferred one until its clone goes", f.snaps.snaps)
	}
	// rule 3: the source goes first, its clone is promoted
	if err := z.Delete(ctx, src); err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(f.calls, func(c string) bool { return c == "zfs promote tank/k8s/volumes/"+restored }) {
		t.Errorf("no promote of the restore in %v", f.calls)
	}
	if _, err := z.Get(ctx, restored); err != nil {
		t.Errorf("restore after its source was deleted: %v", err)
	}
	if err := z.Delete(ctx, restored); err != nil {
		t.Fatal(err)
	}
	if len(f.vols) != 0 || len(f.snaps.snaps) != 0 {
		t.Errorf("left behind: zvols %v, snapshots %v", f.vols, f.snaps.snaps)
	}
}

// TestCloneVolume: a clone of a volume is a clone of a snapshot taken for it and released at
// once (deferred); deleting the clone removes that snapshot too.
func TestCloneVolume(t *testing.T) {
	ctx := context.Background()
	f := withSnapshots(newFake("tank/k8s/volumes", 10<<30))
	z := newTestZFS(t, f, Config{Sparse: true})
	src, clone := backend.VolumeID("zfs clone source"), backend.VolumeID("zfs clone")
	if _, err := z.Create(ctx, src, 1<<30); err != nil {
		t.Fatal(err)
	}
	v, err := z.CreateVolumeFrom(ctx, clone, src, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v.SizeBytes != 1<<30 {
		t.Errorf("clone asked at 1 byte = %d bytes, want the source's %d", v.SizeBytes, 1<<30)
	}
	if again, err := z.CreateVolumeFrom(ctx, clone, src, 1); err != nil || again.SizeBytes != v.SizeBytes {
		t.Errorf("CreateVolumeFrom again = %+v, %v", again, err)
	}
	for n, s := range f.snaps.snaps {
		if !s.deferred {
			t.Errorf("clone's snapshot %s is not released", n)
		}
	}
	if err := z.Delete(ctx, clone); err != nil {
		t.Fatal(err)
	}
	if err := z.Delete(ctx, src); err != nil {
		t.Fatal(err)
	}
	if len(f.vols) != 0 || len(f.snaps.snaps) != 0 {
		t.Errorf("left behind: zvols %v, snapshots %v", f.vols, f.snaps.snaps)
	}
	if _, err := z.CreateVolumeFrom(ctx, clone, snapID("b"), 1); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("restore of a missing snapshot: %v, want ErrNotFound", err)
	}
}

func TestParseSnapshots(t *testing.T) {
	out := "tank/v/vol-1@snap-a\t4096\t1073741824\t1764590000\toff\t-\ttrue\n" +
		"tank/v/vol-1@clone-b\t0\t1073741824\t1764590001\ton\ttank/v/vol-2,tank/v/vol-3\ttrue\n"
	rs, err := parseSnapshots([]byte(out))
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 2 || rs[0].snap() != "snap-a" || rs[0].zvol() != "tank/v/vol-1" || rs[0].Deferred || rs[0].VolSizeBytes != 1<<30 ||
		!rs[1].Deferred || len(rs[1].Clones) != 2 || rs[1].Creation.Unix() != 1764590001 {
		t.Errorf("parseSnapshots = %+v", rs)
	}
	for _, bad := range []string{"tank/v/vol-1\t1\t2\t3\toff\t-\ttrue\n", "tank/v/vol-1@s\tx\t2\t3\toff\t-\ttrue\n", "tank/v/vol-1@s\t1\t2\n"} {
		if _, err := parseSnapshots([]byte(bad)); err == nil {
			t.Errorf("parseSnapshots(%q): no error", bad)
		}
	}
}
