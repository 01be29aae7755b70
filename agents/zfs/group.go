package zfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/plinth-storage/plinth/agents/backend"
)

var _ backend.GroupSnapshotter = (*ZFS)(nil)

// CreateGroupSnapshot takes every member's snapshot in one `zfs snapshot -o
// plinth.dev:managed=true <zvol1>@<snap1> <zvol2>@<snap2> ...`: ZFS takes the snapshots of one
// pool in one transaction group, atomically (zfs-snapshot(8): "all snapshots correspond to the
// same moment in time"), so the group is crash-consistent with no freeze. Members that exist
// of an earlier, cut-short take are destroyed first (zfs destroy -d).
func (z *ZFS) CreateGroupSnapshot(ctx context.Context, members []backend.GroupMember) ([]backend.Snapshot, error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("group snapshot of no volume: %w", backend.ErrInvalidArgument)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	names := make([]string, len(members))
	for i, m := range members {
		if err := backend.ValidateSnapshotID(m.SnapID); err != nil {
			return nil, err
		}
		_, d, err := z.find(ctx, m.VolID)
		if err != nil {
			return nil, fmt.Errorf("group member %s: %w", m.VolID, err)
		}
		names[i] = d.Name + "@" + m.SnapID
	}
	rs, err := z.snapshots(ctx, "")
	if err != nil {
		return nil, err
	}
	existing := map[string]snapshotRow{}
	for _, r := range rs {
		if r.Managed == ManagedValue && !r.Deferred {
			existing[r.snap()] = r
		}
	}
	var have []snapshotRow
	for i, m := range members {
		if r, ok := existing[m.SnapID]; ok {
			if r.Name != names[i] {
				return nil, fmt.Errorf("snapshot %s exists of %s, not %s: %w", m.SnapID, r.zvol(), names[i], backend.ErrAlreadyExists)
			}
			have = append(have, r)
		}
	}
	if len(have) == len(members) {
		out := make([]backend.Snapshot, len(have))
		for i, r := range have {
			out[i] = z.snapshot(r)
		}
		return out, nil
	}
	for _, r := range have { // of another instant: no member of this group
		if _, err := z.run(ctx, "zfs", "destroy", "-d", r.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			return nil, fmt.Errorf("group snapshot: remove %s of a take cut short: %w", r.Name, err)
		}
	}
	if _, err := z.run(ctx, "zfs", append([]string{"snapshot", "-o", PropManaged + "=" + ManagedValue}, names...)...); err != nil {
		return nil, fmt.Errorf("group snapshot of %d volumes: %w", len(members), err)
	}
	out := make([]backend.Snapshot, len(members))
	for i, m := range members {
		r, ok, err := z.findSnapshot(ctx, m.SnapID)
		if err != nil {
			return nil, err
		}
		if !ok {
			return nil, fmt.Errorf("snapshot %s: not listed after zfs snapshot: %w", m.SnapID, backend.ErrNotFound)
		}
		out[i] = z.snapshot(r)
	}
	return out, nil
}
