package lvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Snapshots of thin LVs (man lvmthin(7), "Thin snapshots"). A snapshot is a thin snapshot LV
// named by the snapshot id (snap-<40 hex>), tagged TagManaged, TagSnapshot and
// TagSourcePrefix+<source volume id>, created without a size (it shares the pool's blocks with
// its origin) and with the activation skip flag, so it is never active and has no device. A
// restore is a thin snapshot of the snapshot, a clone a thin snapshot of the volume; both are
// created with the activation skip flag off (-kn) and active, tagged like any volume, and
// extended with lvextend when asked larger than the source. Thin snapshots do not depend on
// their origin: the origin, the snapshot and each restore can be removed in any order, and the
// pool frees shared blocks when the last LV referring to them goes. Thin pool data use
// (Capacity.DataUsedRatio, FreeBytes) therefore includes snapshot space; provisioned bytes
// count volumes only (a snapshot's virtual size is not space it can grow into: it is read-only
// to Plinth). Thick (linear) LVs have no snapshots: ErrUnsupported.
//
// A snapshot's space (Capacity.SnapshotBytes) is the bytes of pool data it maps, shared with
// its origin or not. lvs reports data_percent only for an active thin LV, and a snapshot is
// never active; but a thin snapshot maps exactly what its origin mapped when it was taken and,
// read-only, never maps more. So CreateSnapshot records the origin's mapped bytes (its
// data_percent × size from the lvs read under the VG lock just before lvcreate: writes landing
// in those milliseconds are not counted) as the tag TagMappedPrefix+<bytes>, and Capacity sums
// the tags: no command per refresh, and the figure survives agent restarts.
const (
	// TagSnapshot marks a snapshot LV (not a volume).
	TagSnapshot = "plinth.dev/snapshot"
	// TagSourcePrefix + the source volume id names a snapshot's source.
	TagSourcePrefix = "plinth.dev/source."
	// TagMappedPrefix + a decimal byte count records the pool data a snapshot maps.
	TagMappedPrefix = "plinth.dev/mapped-bytes."
)

// mappedBytes returns the pool data a thin LV maps in bytes: the TagMappedPrefix tag of a
// snapshot when it has one, else data_percent × size (0 for an inactive LV, which lvs reports
// no data_percent for).
func mappedBytes(lv LV) int64 {
	for _, t := range lv.Tags {
		if v, ok := strings.CutPrefix(t, TagMappedPrefix); ok {
			if n, err := strconv.ParseInt(v, 10, 64); err == nil && n >= 0 {
				return n
			}
		}
	}
	return int64(float64(lv.SizeBytes) * lv.DataPercent / 100)
}

var _ backend.Snapshotter = (*LVM)(nil)

func (l *LVM) thinOnly(what string) error {
	if l.cfg.ThinPool == "" {
		return fmt.Errorf("%s in volume group %s: linear LVs have no thin snapshots (declare a thin pool): %w", what, l.cfg.VolumeGroup, backend.ErrUnsupported)
	}
	return nil
}

// managedSnapshot: Plinth's snapshot LV in this backend's thin pool.
func (l *LVM) managedSnapshot(lv LV) bool {
	return lv.HasTag(TagManaged) && lv.HasTag(TagSnapshot) && backend.ValidateSnapshotID(lv.Name) == nil &&
		lv.IsThin() && lv.Pool == l.cfg.ThinPool
}

func (l *LVM) snapshot(lv LV) backend.Snapshot {
	s := backend.Snapshot{ID: lv.Name, Name: lv.Name, SizeBytes: lv.SizeBytes}
	for _, t := range lv.Tags {
		if src, ok := strings.CutPrefix(t, TagSourcePrefix); ok {
			s.SourceVolume = src
		}
	}
	return s
}

// CreateSnapshot takes a thin snapshot of volume volID: `lvcreate -s -n <snap> --setactivationskip y`.
func (l *LVM) CreateSnapshot(ctx context.Context, snapID, volID string) (backend.Snapshot, error) {
	if err := l.thinOnly("snapshot " + snapID); err != nil {
		return backend.Snapshot{}, err
	}
	if err := backend.ValidateSnapshotID(snapID); err != nil {
		return backend.Snapshot{}, err
	}
	if err := ValidateNames(l.cfg.VolumeGroup, snapID); err != nil {
		return backend.Snapshot{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, src, err := l.find(ctx, volID)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if lv, ok := st.lv(snapID); ok {
		if !l.managedSnapshot(lv) {
			return backend.Snapshot{}, fmt.Errorf("LV %s/%s exists but is not a Plinth snapshot of this store: %w", l.cfg.VolumeGroup, snapID, backend.ErrAlreadyExists)
		}
		if s := l.snapshot(lv); s.SourceVolume != volID {
			return backend.Snapshot{}, fmt.Errorf("snapshot %s exists of volume %s, not %s: %w", snapID, s.SourceVolume, volID, backend.ErrAlreadyExists)
		}
		return l.snapshot(lv), nil
	}
	args := []string{"-y", "-s", "--setactivationskip", "y", "-n", snapID,
		"--addtag", TagManaged, "--addtag", TagSnapshot, "--addtag", TagSourcePrefix + volID}
	if src.Active {
		args = append(args, "--addtag", TagMappedPrefix+strconv.FormatInt(mappedBytes(src), 10))
	}
	if _, err := l.run(ctx, "lvcreate", append(args, l.cfg.VolumeGroup+"/"+src.Name)...); err != nil {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", snapID, volID, err)
	}
	return l.getSnapshot(ctx, snapID)
}

func (l *LVM) getSnapshot(ctx context.Context, snapID string) (backend.Snapshot, error) {
	out, err := l.run(ctx, "lvs", append(append([]string{}, reportArgs...), "-o", lvFields, l.cfg.VolumeGroup+"/"+snapID)...)
	if err != nil {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapID, err)
	}
	lvs, err := ParseLVs(out)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if len(lvs) != 1 || !l.managedSnapshot(lvs[0]) {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s in %s: %w", snapID, l.cfg.VolumeGroup, backend.ErrNotFound)
	}
	return l.snapshot(lvs[0]), nil
}

// GetSnapshot returns one snapshot (one lvs of that LV).
func (l *LVM) GetSnapshot(ctx context.Context, snapID string) (backend.Snapshot, error) {
	if err := backend.ValidateSnapshotID(snapID); err != nil {
		return backend.Snapshot{}, err
	}
	if err := l.thinOnly("snapshot " + snapID); err != nil {
		return backend.Snapshot{}, err
	}
	return l.getSnapshot(ctx, snapID)
}

// DeleteSnapshot removes the snapshot LV; restores and clones made from it are thin LVs of
// their own and keep their data.
func (l *LVM) DeleteSnapshot(ctx context.Context, snapID string) error {
	if err := backend.ValidateSnapshotID(snapID); err != nil {
		return err
	}
	if l.cfg.ThinPool == "" {
		return nil // never took one
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, err := l.getSnapshot(ctx, snapID); errors.Is(err, backend.ErrNotFound) {
		return nil
	} else if err != nil {
		return err
	}
	if _, err := l.run(ctx, "lvremove", "-y", l.cfg.VolumeGroup+"/"+snapID); err != nil && !errors.Is(err, backend.ErrNotFound) {
		return fmt.Errorf("delete snapshot %s: %w", snapID, err)
	}
	return nil
}

// CreateVolumeFrom makes volume id as a thin snapshot of source (a snapshot or a volume),
// active and without the activation skip flag, then grows it to sizeBytes (rounded up to the
// extent) when that is larger than the source.
func (l *LVM) CreateVolumeFrom(ctx context.Context, id, source string, sizeBytes int64) (backend.Volume, error) {
	if err := l.thinOnly("volume " + id + " from " + source); err != nil {
		return backend.Volume{}, err
	}
	name, err := LVName(l.cfg.VolumeGroup, id)
	if err != nil {
		return backend.Volume{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.refresh(ctx)
	if err != nil {
		return backend.Volume{}, err
	}
	src, ok := st.lv(source)
	if !ok || !(l.managed(src) || l.managedSnapshot(src)) {
		return backend.Volume{}, fmt.Errorf("source %s in %s: %w", source, l.cfg.VolumeGroup, backend.ErrNotFound)
	}
	size := max(backend.RoundUp(sizeBytes, st.vg.ExtentBytes), src.SizeBytes)
	if lv, ok := st.lv(name); ok {
		if !l.managed(lv) {
			return backend.Volume{}, fmt.Errorf("LV %s/%s exists but is not a Plinth volume of this store: %w", l.cfg.VolumeGroup, name, backend.ErrAlreadyExists)
		}
		if lv.SizeBytes < size {
			return l.expand(ctx, st, lv, id, size) // a restore cut short between lvcreate and lvextend
		}
		return l.volume(lv), nil
	}
	c, err := l.capacity(st)
	if err != nil {
		return backend.Volume{}, err
	}
	if avail := c.Available(l.cfg.ReserveBytes, l.cfg.OvercommitPercent); size > avail {
		return backend.Volume{}, fmt.Errorf("volume %s: %d bytes requested, %d available: %w", id, size, avail, backend.ErrInsufficientCapacity)
	}
	// -K: a snapshot LV carries the activation skip flag, and -kn alone does not activate the
	// new LV in every lvm2 version; -ay -K does.
	if _, err := l.run(ctx, "lvcreate", "-y", "-s", "-kn", "-ay", "-K", "-n", name, "--addtag", TagManaged,
		l.cfg.VolumeGroup+"/"+src.Name); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s from %s: %w", id, source, err)
	}
	vol, err := l.reread(ctx, id)
	if err != nil || vol.SizeBytes >= size {
		return vol, err
	}
	st, lv, err := l.find(ctx, id)
	if err != nil {
		return backend.Volume{}, err
	}
	return l.expand(ctx, st, lv, id, size)
}

func (l *LVM) expand(ctx context.Context, _ state, lv LV, id string, size int64) (backend.Volume, error) {
	if _, err := l.run(ctx, "lvextend", "-L", sizeArg(size), l.cfg.VolumeGroup+"/"+lv.Name); err != nil {
		return backend.Volume{}, fmt.Errorf("grow volume %s to %d bytes: %w", id, size, err)
	}
	return l.reread(ctx, id)
}
