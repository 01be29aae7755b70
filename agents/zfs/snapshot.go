package zfs

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Snapshots, restores and clones of zvols (zfs-snapshot(8), zfs-clone(8), zfs-promote(8),
// zfs-destroy(8)).
//
//   - A snapshot is `<zvol>@<snapshot id>`, taken with PropManaged set.
//   - A restore is `zfs clone <zvol>@<snapshot id> <parent>/<new volume id>`, its volsize then
//     raised when asked larger than the snapshot. A clone of a volume is a clone of a snapshot
//     `<zvol>@clone-<40 hex of the new volume id>` taken for it and at once destroyed with -d.
//   - The delete order (a ZFS clone depends on its origin snapshot, and a snapshot on its
//     zvol):
//     1. DeleteSnapshot runs `zfs destroy -d`: a snapshot without clones goes at once; one with
//     clones is marked defer_destroy and ZFS destroys it, reclaiming its space, when the last
//     clone is destroyed. From the moment it is marked, the snapshot is gone for Plinth
//     (GetSnapshot: not found), so DeleteSnapshot succeeds for the CO.
//     2. Deleting a zvol that still has snapshots not marked for deletion is refused
//     (backend.ErrInUse, naming them): their VolumeSnapshots must be deleted first.
//     3. Deleting a zvol whose remaining snapshots are all marked but still have clones
//     promotes the clone of the newest of them (`zfs promote`), which moves those snapshots
//     to the clone and makes the zvol a clone itself; then the zvol is destroyed, and the
//     moved snapshots go when their last clone goes (rule 1).
const clonePrefix = "clone-"

// snapshotFields are the columns of `zfs list -t snapshot` (parseSnapshots); the user
// property is last, like datasetFields.
var snapshotFields = []string{"name", "used", "volsize", "creation", "defer_destroy", "clones", PropManaged}

// snapshotRow is one row of `zfs list -Hp -t snapshot -o <snapshotFields>`.
type snapshotRow struct {
	Name         string // <zvol>@<snap>
	UsedBytes    int64
	VolSizeBytes int64
	Creation     time.Time
	Deferred     bool
	Clones       []string
	Managed      string
}

func (r snapshotRow) zvol() string { z, _, _ := strings.Cut(r.Name, "@"); return z }
func (r snapshotRow) snap() string { _, s, _ := strings.Cut(r.Name, "@"); return s }

// parseSnapshots parses `zfs list -Hp -t snapshot -o name,used,volsize,creation,defer_destroy,clones,plinth.dev:managed`.
func parseSnapshots(out []byte) ([]snapshotRow, error) {
	var rs []snapshotRow
	for i, line := range lines(out) {
		f := strings.SplitN(line, "\t", len(snapshotFields))
		if len(f) != len(snapshotFields) || !strings.Contains(f[0], "@") {
			return nil, fmt.Errorf("zfs list -t snapshot line %d: want %d fields and a snapshot name: %q", i+1, len(snapshotFields), line)
		}
		r := snapshotRow{Name: f[0], Deferred: f[4] == "on"}
		var err error
		if r.UsedBytes, err = parseBytes(f[1]); err != nil {
			return nil, fmt.Errorf("zfs list -t snapshot line %d (%s): used: %w", i+1, r.Name, err)
		}
		if r.VolSizeBytes, err = parseBytes(f[2]); err != nil {
			return nil, fmt.Errorf("zfs list -t snapshot line %d (%s): volsize: %w", i+1, r.Name, err)
		}
		secs, err := parseBytes(f[3])
		if err != nil {
			return nil, fmt.Errorf("zfs list -t snapshot line %d (%s): creation: %w", i+1, r.Name, err)
		}
		r.Creation = time.Unix(secs, 0)
		if f[5] != "-" && f[5] != "" {
			r.Clones = strings.Split(f[5], ",")
		}
		if f[6] != "-" {
			r.Managed = f[6]
		}
		rs = append(rs, r)
	}
	return rs, nil
}

// snapshots lists the snapshots of the zvols under the parent (depth 2: parent → zvol →
// snapshot), or of one zvol when zvol is set.
func (z *ZFS) snapshots(ctx context.Context, zvol string) ([]snapshotRow, error) {
	target, depth := z.parent, "2"
	if zvol != "" {
		target, depth = zvol, "1"
	}
	out, err := z.run(ctx, "zfs", "list", "-Hp", "-t", "snapshot", "-d", depth, "-o", strings.Join(snapshotFields, ","), target)
	if err != nil {
		return nil, fmt.Errorf("snapshots of %s: %w", target, err)
	}
	return parseSnapshots(out)
}

// findSnapshot returns the live (not deferred) Plinth snapshot snapID; ok false when absent.
func (z *ZFS) findSnapshot(ctx context.Context, snapID string) (snapshotRow, bool, error) {
	if err := backend.ValidateSnapshotID(snapID); err != nil {
		return snapshotRow{}, false, err
	}
	rs, err := z.snapshots(ctx, "")
	if err != nil {
		return snapshotRow{}, false, err
	}
	for _, r := range rs {
		if r.snap() == snapID && r.Managed == ManagedValue && !r.Deferred {
			return r, true, nil
		}
	}
	return snapshotRow{}, false, nil
}

func (z *ZFS) snapshot(r snapshotRow) backend.Snapshot {
	return backend.Snapshot{ID: r.snap(), Name: r.Name, SourceVolume: strings.TrimPrefix(r.zvol(), z.parent+"/"),
		SizeBytes: r.VolSizeBytes, CreationTime: r.Creation}
}

var _ backend.Snapshotter = (*ZFS)(nil)

// CreateSnapshot runs `zfs snapshot -o plinth.dev:managed=true <zvol>@<snapID>`.
func (z *ZFS) CreateSnapshot(ctx context.Context, snapID, volID string) (backend.Snapshot, error) {
	if err := backend.ValidateSnapshotID(snapID); err != nil {
		return backend.Snapshot{}, err
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	_, d, err := z.find(ctx, volID)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if r, ok, err := z.findSnapshot(ctx, snapID); err != nil {
		return backend.Snapshot{}, err
	} else if ok {
		if r.zvol() != d.Name {
			return backend.Snapshot{}, fmt.Errorf("snapshot %s exists of %s, not %s: %w", snapID, r.zvol(), d.Name, backend.ErrAlreadyExists)
		}
		return z.snapshot(r), nil
	}
	if _, err := z.run(ctx, "zfs", "snapshot", "-o", PropManaged+"="+ManagedValue, d.Name+"@"+snapID); err != nil {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", snapID, volID, err)
	}
	r, ok, err := z.findSnapshot(ctx, snapID)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if !ok {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s: not listed after zfs snapshot: %w", snapID, backend.ErrNotFound)
	}
	return z.snapshot(r), nil
}

// GetSnapshot returns one snapshot; one marked for deferred destruction is not found.
func (z *ZFS) GetSnapshot(ctx context.Context, snapID string) (backend.Snapshot, error) {
	r, ok, err := z.findSnapshot(ctx, snapID)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if !ok {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapID, backend.ErrNotFound)
	}
	return z.snapshot(r), nil
}

// DeleteSnapshot runs `zfs destroy -d`: at once without clones, deferred until the last clone
// is destroyed otherwise (rule 1 above).
func (z *ZFS) DeleteSnapshot(ctx context.Context, snapID string) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	r, ok, err := z.findSnapshot(ctx, snapID)
	if err != nil || !ok {
		return err
	}
	if _, err := z.run(ctx, "zfs", "destroy", "-d", r.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
		return fmt.Errorf("delete snapshot %s: %w", snapID, err)
	}
	return nil
}

// CreateVolumeFrom clones a snapshot (restore) or a snapshot taken of a volume for the purpose
// (clone) into zvol id, raising volsize to sizeBytes (rounded up to the volblocksize) when
// that is larger than the source.
func (z *ZFS) CreateVolumeFrom(ctx context.Context, id, source string, sizeBytes int64) (backend.Volume, error) {
	name, err := ZvolName(z.cfg.Pool, z.cfg.ParentDataset, id)
	if err != nil {
		return backend.Volume{}, err
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	st, err := z.refresh(ctx)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, z.cfg.VolBlockSize)
	if d, ok := st.child(name); ok {
		if !z.managed(d) {
			return backend.Volume{}, fmt.Errorf("dataset %s exists but is not a Plinth zvol: %w", name, backend.ErrAlreadyExists)
		}
		if d.VolSizeBytes < size {
			return z.setVolSize(ctx, id, name, size) // a restore cut short before its volsize was set
		}
		return z.volume(d), nil
	}
	var origin string
	var srcBytes int64
	if strings.HasPrefix(source, backend.SnapshotIDPrefix) {
		r, ok, err := z.findSnapshot(ctx, source)
		if err != nil {
			return backend.Volume{}, err
		}
		if !ok {
			return backend.Volume{}, fmt.Errorf("snapshot %s: %w", source, backend.ErrNotFound)
		}
		origin, srcBytes = r.Name, r.VolSizeBytes
	} else {
		srcName, err := ZvolName(z.cfg.Pool, z.cfg.ParentDataset, source)
		if err != nil {
			return backend.Volume{}, err
		}
		d, ok := st.child(srcName)
		if !ok || !z.managed(d) {
			return backend.Volume{}, fmt.Errorf("volume %s: %w", source, backend.ErrNotFound)
		}
		origin, srcBytes = srcName+"@"+clonePrefix+strings.TrimPrefix(id, backend.VolumeIDPrefix), d.VolSizeBytes
	}
	size = max(size, srcBytes)
	if avail := z.capacity(st).Available(z.cfg.ReserveBytes, z.cfg.OvercommitPercent); size > avail {
		return backend.Volume{}, fmt.Errorf("volume %s: %d bytes requested, %d available: %w", id, size, avail, backend.ErrInsufficientCapacity)
	}
	temporary := !strings.HasPrefix(source, backend.SnapshotIDPrefix)
	if temporary {
		if _, err := z.run(ctx, "zfs", "snapshot", "-o", PropManaged+"="+ManagedValue, origin); err != nil && !errors.Is(err, backend.ErrAlreadyExists) {
			return backend.Volume{}, fmt.Errorf("clone %s: %w", source, err)
		}
	}
	args := []string{"clone", "-o", PropManaged + "=" + ManagedValue}
	if !z.cfg.Sparse {
		args = append(args, "-o", "refreservation=auto")
	}
	for _, p := range z.props {
		args = append(args, "-o", p)
	}
	if _, err := z.run(ctx, "zfs", append(args, origin, name)...); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s from %s: %w", id, source, err)
	}
	if temporary {
		// deferred: it goes with the clone (rule 1)
		if _, err := z.run(ctx, "zfs", "destroy", "-d", origin); err != nil {
			return backend.Volume{}, fmt.Errorf("release snapshot %s of clone %s: %w", origin, id, err)
		}
	}
	if size > srcBytes {
		return z.setVolSize(ctx, id, name, size)
	}
	return z.reread(ctx, id, name)
}

func (z *ZFS) setVolSize(ctx context.Context, id, name string, size int64) (backend.Volume, error) {
	if _, err := z.run(ctx, "zfs", "set", "volsize="+strconv.FormatInt(size, 10), name); err != nil {
		return backend.Volume{}, fmt.Errorf("grow volume %s to %d bytes: %w", id, size, err)
	}
	return z.reread(ctx, id, name)
}

// releaseSnapshots prepares zvol for destruction (rules 2 and 3 above): live snapshots refuse
// it; snapshots marked for deferred destruction that still have clones are handed to the
// newest such clone by `zfs promote`. Called with z.mu held.
func (z *ZFS) releaseSnapshots(ctx context.Context, zvol string) error {
	for range 8 { // each promote moves at least one snapshot away; a few suffice
		rs, err := z.snapshots(ctx, zvol)
		if err != nil {
			if errors.Is(err, backend.ErrNotFound) {
				return nil
			}
			return err
		}
		var live []string
		var held []snapshotRow
		for _, r := range rs {
			switch {
			case !r.Deferred:
				live = append(live, r.snap())
			case len(r.Clones) > 0:
				held = append(held, r)
			}
		}
		if len(live) > 0 {
			return fmt.Errorf("zvol %s has snapshots %s: delete them first: %w", zvol, strings.Join(live, ", "), backend.ErrInUse)
		}
		if len(held) == 0 {
			return nil
		}
		sort.Slice(held, func(i, j int) bool { return held[i].Creation.Before(held[j].Creation) })
		newest := held[len(held)-1]
		if _, err := z.run(ctx, "zfs", "promote", newest.Clones[0]); err != nil {
			return fmt.Errorf("promote %s before destroying %s: %w", newest.Clones[0], zvol, err)
		}
	}
	return fmt.Errorf("zvol %s: clones still depend on it after promoting: %w", zvol, backend.ErrInUse)
}
