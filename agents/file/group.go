package file

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Group snapshots of the file backend: a copy of every member under one freeze. Each
// filesystem mounted (in the agent's mount namespace) from a member's loop device is frozen
// with FIFREEZE (ioctl_fifreeze(2): dirty data written back, new writes held until FITHAW),
// then every member is flushed and copied, then every filesystem is thawed — always, on error
// too. A member with no mounted filesystem (unused, or a raw block consumer) is copied while
// nothing holds its writes: only its mounted members are captured at one instant.

// FIFREEZE and FITHAW are _IOWR('X', 119, int) and _IOWR('X', 120, int) of linux/fs.h.
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

var _ backend.GroupSnapshotter = (*File)(nil)

// CreateGroupSnapshot copies members under one freeze (see above); all or none.
func (f *File) CreateGroupSnapshot(ctx context.Context, members []backend.GroupMember) (out []backend.Snapshot, err error) {
	if len(members) == 0 {
		return nil, fmt.Errorf("group snapshot of no volume: %w", backend.ErrInvalidArgument)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var have []string
	for _, m := range members {
		src, err := f.path(m.VolID)
		if err != nil {
			return nil, err
		}
		if _, err := os.Stat(src); errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("group member %s: %w", m.VolID, backend.ErrNotFound)
		}
		p, source, ok, err := f.snapshotPath(m.SnapID)
		if err != nil {
			return nil, err
		}
		if ok {
			if source != m.VolID {
				return nil, fmt.Errorf("snapshot %s exists of volume %s, not %s: %w", m.SnapID, source, m.VolID, backend.ErrAlreadyExists)
			}
			have = append(have, p)
		}
	}
	if len(have) == len(members) {
		for _, m := range members {
			s, err := f.createSnapshot(m.SnapID, m.VolID) // exists: returned as it is
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	}
	for _, p := range have { // of a take cut short: another instant
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("group snapshot: remove %s of a take cut short: %w", p, err)
		}
	}
	defer func() { // all or none
		if err == nil {
			return
		}
		for _, m := range members {
			if p, _, ok, _ := f.snapshotPath(m.SnapID); ok {
				_ = os.Remove(p)
			}
		}
	}()
	mounts, err := f.memberMounts(members)
	if err != nil {
		return nil, err
	}
	var frozen []*os.File
	defer func() {
		for _, d := range frozen {
			if terr := unix.IoctlSetInt(int(d.Fd()), fiThaw, 0); terr != nil {
				err = errors.Join(err, fmt.Errorf("thaw %s: %w", d.Name(), terr))
			}
			d.Close()
		}
	}()
	for _, mp := range mounts {
		d, err := os.Open(mp)
		if err != nil {
			return nil, fmt.Errorf("group snapshot: freeze %s: %w", mp, err)
		}
		if err := unix.IoctlSetInt(int(d.Fd()), fiFreeze, 0); err != nil {
			d.Close()
			return nil, fmt.Errorf("group snapshot: freeze %s: %w", mp, err)
		}
		frozen = append(frozen, d)
	}
	for _, m := range members {
		s, err := f.createSnapshot(m.SnapID, m.VolID)
		if err != nil {
			return nil, fmt.Errorf("group member %s: %w", m.VolID, err)
		}
		out = append(out, s)
	}
	return out, nil
}

// memberMounts returns the mount points of the filesystems mounted from the members' loop
// devices, one per filesystem (a bind mount of a frozen filesystem is the same superblock).
func (f *File) memberMounts(members []backend.GroupMember) ([]string, error) {
	devs := map[uint64]bool{}
	for _, m := range members {
		src, err := f.path(m.VolID)
		if err != nil {
			return nil, err
		}
		loops, err := f.attached(src)
		if err != nil {
			return nil, err
		}
		for _, l := range loops {
			var st unix.Stat_t
			if err := unix.Stat(l, &st); err == nil {
				devs[st.Rdev] = true
			}
		}
	}
	if len(devs) == 0 {
		return nil, nil
	}
	infos, err := mountinfo.GetMounts(func(i *mountinfo.Info) (skip, stop bool) {
		return !devs[unix.Mkdev(uint32(i.Major), uint32(i.Minor))], false
	})
	if err != nil {
		return nil, fmt.Errorf("group snapshot: read mounts: %w", err)
	}
	seen := map[uint64]bool{}
	var out []string
	for _, i := range infos {
		d := unix.Mkdev(uint32(i.Major), uint32(i.Minor))
		if !seen[d] {
			seen[d] = true
			out = append(out, i.Mountpoint)
		}
	}
	return out, nil
}
