package lvm

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/failpoint"
)

// Group snapshots of thin LVs. lvm2 snapshots one origin per lvcreate, so the instant is made
// with device-mapper: every active origin is suspended (`dmsetup suspend`, which flushes the
// I/O in flight and then holds new I/O in the kernel, neither failed nor reordered), then each
// snapshot is taken, then every origin is resumed. All origins are suspended before the first
// snapshot, so each snapshot holds its origin as it was at its suspend, and a write that
// reached one origin after its suspend had to wait there: no write can be in one member's
// snapshot while a write acknowledged before it is missing from another — the group is what a
// power loss at the last suspend would leave (crash-consistent). lvcreate finds the origin
// already suspended, skips its own suspend, and resumes the origin when its snapshot is made;
// the deferred resume covers the origins whose lvcreate never ran (an error). An agent killed
// between suspend and resume leaves the origins suspended (held I/O, hung writers): Ensure
// resumes every suspended thin LV of Plinth's at the next start (resumeSuspended).

var _ backend.GroupSnapshotter = (*LVM)(nil)

// suspended reports whether lvm2 shows the LV's device suspended (lv_attr's fifth character,
// lvs(8)).
func (lv LV) suspended() bool { return len(lv.Attr) > 4 && lv.Attr[4] == 's' }

// CreateGroupSnapshot takes the thin snapshots of members at one instant (see above).
func (l *LVM) CreateGroupSnapshot(ctx context.Context, members []backend.GroupMember) (out []backend.Snapshot, err error) {
	if err := l.thinOnly("group snapshot"); err != nil {
		return nil, err
	}
	if len(members) == 0 {
		return nil, fmt.Errorf("group snapshot of no volume: %w", backend.ErrInvalidArgument)
	}
	for _, m := range members {
		if err := backend.ValidateSnapshotID(m.SnapID); err != nil {
			return nil, err
		}
		if err := ValidateNames(l.cfg.VolumeGroup, m.SnapID); err != nil {
			return nil, err
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.refresh(ctx)
	if err != nil {
		return nil, err
	}
	srcs := make([]LV, len(members))
	var have []LV
	for i, m := range members {
		name, err := LVName(l.cfg.VolumeGroup, m.VolID)
		if err != nil {
			return nil, err
		}
		lv, ok := st.lv(name)
		if !ok || !l.managed(lv) {
			return nil, fmt.Errorf("group member %s in %s: %w", m.VolID, l.cfg.VolumeGroup, backend.ErrNotFound)
		}
		srcs[i] = lv
		if s, ok := st.lv(m.SnapID); ok {
			if !l.managedSnapshot(s) || l.snapshot(s).SourceVolume != m.VolID {
				return nil, fmt.Errorf("LV %s/%s exists but is not a Plinth snapshot of %s: %w", l.cfg.VolumeGroup, m.SnapID, m.VolID, backend.ErrAlreadyExists)
			}
			have = append(have, s)
		}
	}
	if len(have) == len(members) {
		for _, s := range have {
			out = append(out, l.snapshot(s))
		}
		return out, nil
	}
	for _, s := range have { // of a take cut short: another instant, no member of this group
		if _, err := l.run(ctx, "lvremove", "-y", l.cfg.VolumeGroup+"/"+s.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			return nil, fmt.Errorf("group snapshot: remove %s of a take cut short: %w", s.Name, err)
		}
	}
	taken := 0
	defer func() { // all or none: a group cut short leaves no member
		if err == nil {
			return
		}
		for _, m := range members[:taken] {
			if _, rerr := l.run(context.WithoutCancel(ctx), "lvremove", "-y", l.cfg.VolumeGroup+"/"+m.SnapID); rerr != nil && !errors.Is(rerr, backend.ErrNotFound) {
				err = fmt.Errorf("%w (and removing snapshot %s of the failed group: %v)", err, m.SnapID, rerr)
			}
		}
	}()
	var frozen []string
	defer func() { // always resumed, on error too; resuming a running device does nothing
		for _, dm := range frozen {
			if _, rerr := l.run(context.WithoutCancel(ctx), "dmsetup", "resume", dm); rerr != nil {
				err = errors.Join(err, fmt.Errorf("resume %s: %w", dm, rerr))
			}
		}
	}()
	for _, lv := range srcs {
		if !lv.Active {
			continue // no device, no writer
		}
		dm := DMName(l.cfg.VolumeGroup, lv.Name)
		frozen = append(frozen, dm)
		if _, err := l.run(ctx, "dmsetup", "suspend", dm); err != nil {
			return nil, fmt.Errorf("group snapshot: suspend %s: %w", dm, err)
		}
	}
	failpoint.Hit(failpoint.LVMGroupSuspended)
	for i, m := range members {
		args := []string{"-y", "-s", "--setactivationskip", "y", "-n", m.SnapID,
			"--addtag", TagManaged, "--addtag", TagSnapshot, "--addtag", TagSourcePrefix + m.VolID}
		if srcs[i].Active {
			args = append(args, "--addtag", TagMappedPrefix+strconv.FormatInt(mappedBytes(srcs[i]), 10))
		}
		if _, err := l.run(ctx, "lvcreate", append(args, l.cfg.VolumeGroup+"/"+srcs[i].Name)...); err != nil {
			return nil, fmt.Errorf("group snapshot %s of %s: %w", m.SnapID, m.VolID, err)
		}
		taken = i + 1
	}
	st, err = l.refresh(ctx)
	if err != nil {
		return nil, err
	}
	for _, m := range members {
		s, ok := st.lv(m.SnapID)
		if !ok || !l.managedSnapshot(s) {
			return nil, fmt.Errorf("snapshot %s: not listed after lvcreate: %w", m.SnapID, backend.ErrNotFound)
		}
		out = append(out, l.snapshot(s))
	}
	return out, nil
}

// resumeSuspended resumes every suspended thin LV of Plinth's in the report: a group snapshot
// cut short between suspend and resume (agent killed) holds their I/O until then. Called at
// Ensure, before the agent runs any other lvm2 command on the VG.
func (l *LVM) resumeSuspended(ctx context.Context, st state) error {
	var errs []error
	for _, lv := range st.lvs {
		if lv.suspended() && lv.IsThin() && l.managed(lv) {
			if _, err := l.run(ctx, "dmsetup", "resume", DMName(l.cfg.VolumeGroup, lv.Name)); err != nil {
				errs = append(errs, fmt.Errorf("resume %s/%s: %w", l.cfg.VolumeGroup, lv.Name, err))
			}
		}
	}
	return errors.Join(errs...)
}
