package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Snapshots of the file backend are files in the subfolder snapshotDir of the Store's
// directory, named <snapshot id>@<source volume id>.img so that the source is known without a
// second file. A snapshot, a restore and a clone are copies of a file: a reflink (FICLONE) where
// the filesystem shares blocks (xfs with reflink, btrfs, bcachefs), else a sparse copy that
// copies only the source's data extents (SEEK_DATA/SEEK_HOLE) with copy_file_range. Either way
// the copy is independent of its source: deleting one never touches the other.
const snapshotDir = "snapshots"

var _ backend.Snapshotter = (*File)(nil)

// snapshotPath finds snapID's file: its path, source volume id, and false when absent.
func (f *File) snapshotPath(snapID string) (string, string, bool, error) {
	if err := backend.ValidateSnapshotID(snapID); err != nil {
		return "", "", false, err
	}
	m, err := filepath.Glob(filepath.Join(f.cfg.Directory, snapshotDir, snapID+"@vol-*"+suffix))
	if err != nil || len(m) == 0 {
		return "", "", false, err
	}
	src := strings.TrimSuffix(strings.TrimPrefix(filepath.Base(m[0]), snapID+"@"), suffix)
	return m[0], src, true, nil
}

// CreateSnapshot copies volume volID into the snapshot folder. The loop device is flushed
// first so that writes it buffered are in the copy (crash-consistent, like an LVM or ZFS
// snapshot of a mounted volume).
func (f *File) CreateSnapshot(ctx context.Context, snapID, volID string) (backend.Snapshot, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.createSnapshot(snapID, volID)
}

// createSnapshot is CreateSnapshot under f.mu.
func (f *File) createSnapshot(snapID, volID string) (backend.Snapshot, error) {
	src, err := f.path(volID)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if p, source, ok, err := f.snapshotPath(snapID); err != nil {
		return backend.Snapshot{}, err
	} else if ok {
		if source != volID {
			return backend.Snapshot{}, fmt.Errorf("snapshot %s exists of volume %s, not %s: %w", snapID, source, volID, backend.ErrAlreadyExists)
		}
		return f.snapshot(snapID, p, source)
	}
	st, err := os.Stat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return backend.Snapshot{}, fmt.Errorf("volume %s: %w", volID, backend.ErrNotFound)
	}
	if err != nil {
		return backend.Snapshot{}, err
	}
	if devs, err := f.attached(src); err == nil {
		for _, d := range devs {
			if err := flushDevice(d); err != nil {
				return backend.Snapshot{}, fmt.Errorf("snapshot %s: flush %s: %w", snapID, d, err)
			}
		}
	}
	if err := os.MkdirAll(filepath.Join(f.cfg.Directory, snapshotDir), 0o700); err != nil {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapID, err)
	}
	dst := filepath.Join(f.cfg.Directory, snapshotDir, snapID+"@"+volID+suffix)
	if err := f.copyFile(src, dst, st.Size()); err != nil {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s of %s: %w", snapID, volID, err)
	}
	return f.snapshot(snapID, dst, volID)
}

func (f *File) snapshot(id, path, source string) (backend.Snapshot, error) {
	st, err := os.Stat(path)
	if err != nil {
		return backend.Snapshot{}, err
	}
	return backend.Snapshot{ID: id, Name: filepath.Base(path), SourceVolume: source, SizeBytes: st.Size(), CreationTime: st.ModTime()}, nil
}

// DeleteSnapshot removes the snapshot file; copies made from it are independent.
func (f *File) DeleteSnapshot(ctx context.Context, snapID string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, _, ok, err := f.snapshotPath(snapID)
	if err != nil || !ok {
		return err
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete snapshot %s: %w", snapID, err)
	}
	return nil
}

// GetSnapshot returns one snapshot.
func (f *File) GetSnapshot(ctx context.Context, snapID string) (backend.Snapshot, error) {
	p, source, ok, err := f.snapshotPath(snapID)
	if err != nil {
		return backend.Snapshot{}, err
	}
	if !ok {
		return backend.Snapshot{}, fmt.Errorf("snapshot %s: %w", snapID, backend.ErrNotFound)
	}
	return f.snapshot(snapID, p, source)
}

// CreateVolumeFrom copies a snapshot or a volume into the new volume id, grown to sizeBytes
// (rounded up to UnitBytes) when that is larger than the source, and attaches it.
func (f *File) CreateVolumeFrom(ctx context.Context, id, source string, sizeBytes int64) (backend.Volume, error) {
	path, err := f.path(id)
	if err != nil {
		return backend.Volume{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	var src string
	if strings.HasPrefix(source, backend.SnapshotIDPrefix) {
		p, _, ok, err := f.snapshotPath(source)
		if err != nil {
			return backend.Volume{}, err
		}
		if !ok {
			return backend.Volume{}, fmt.Errorf("snapshot %s: %w", source, backend.ErrNotFound)
		}
		src = p
	} else if src, err = f.path(source); err != nil {
		return backend.Volume{}, err
	}
	sst, err := os.Stat(src)
	if errors.Is(err, fs.ErrNotExist) {
		return backend.Volume{}, fmt.Errorf("source %s: %w", source, backend.ErrNotFound)
	}
	if err != nil {
		return backend.Volume{}, err
	}
	size := max(backend.RoundUp(sizeBytes, UnitBytes), sst.Size())
	f.capMu.Lock()
	v, exists, err := f.adoptOrCheckRoom(id, path, size)
	f.capMu.Unlock()
	if exists || err != nil {
		return v, err
	}
	if strings.HasPrefix(source, backend.VolumeIDPrefix) {
		if devs, err := f.attached(src); err == nil {
			for _, d := range devs {
				if err := flushDevice(d); err != nil {
					return backend.Volume{}, fmt.Errorf("clone %s: flush %s: %w", source, d, err)
				}
			}
		}
	}
	if err := f.copyFile(src, path, size); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s from %s: %w", id, source, err)
	}
	if _, err := f.attach(path); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return f.volume(id, path, size)
}

// copyFile writes a copy of src of size bytes (≥ src's size; the tail stays a hole) to dst
// through a temporary file and a rename, so that dst never exists half-written. The copy takes
// no space beyond what the filesystem already free: a reflink shares blocks; a sparse copy
// takes what the source's data extents take, which the caller's capacity check bounds.
func (f *File) copyFile(src, dst string, size int64) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	tmp := dst + ".tmp"
	os.Remove(tmp) // left by a crash: never a live file (renamed only when complete)
	out, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err != nil {
		err = sparseCopy(out, in)
	}
	if err == nil {
		err = out.Truncate(size)
	}
	if err == nil {
		err = out.Sync()
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, dst)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(dst))
}

// sparseCopy copies the data extents of in to the same offsets of out, leaving holes as holes.
func sparseCopy(out, in *os.File) error {
	st, err := in.Stat()
	if err != nil {
		return err
	}
	end := st.Size()
	for off := int64(0); off < end; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			break // only a hole remains
		}
		if err != nil {
			return fmt.Errorf("seek data: %w", err)
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return fmt.Errorf("seek hole: %w", err)
		}
		if err := copyRange(out, in, data, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// copyRange copies n bytes at off with copy_file_range (in-kernel, no round trip through user
// space), or read/write where the kernel refuses it (EXDEV, ENOSYS, EINVAL on some filesystems).
func copyRange(out, in *os.File, off, n int64) error {
	for n > 0 {
		roff, woff := off, off
		c, err := unix.CopyFileRange(int(in.Fd()), &roff, int(out.Fd()), &woff, int(min(n, 1<<30)), 0)
		if err != nil {
			if _, err := out.Seek(off, io.SeekStart); err != nil {
				return err
			}
			if _, err := io.Copy(out, io.NewSectionReader(in, off, n)); err != nil {
				return fmt.Errorf("copy: %w", err)
			}
			return nil
		}
		if c == 0 {
			return fmt.Errorf("copy_file_range: no progress at offset %d", off)
		}
		off += int64(c)
		n -= int64(c)
	}
	return nil
}

// flushDevice writes a block device's buffered writes to its backing file (fsync of the device).
func flushDevice(dev string) error {
	fh, err := os.Open(dev)
	if err != nil {
		return err
	}
	defer fh.Close()
	return fh.Sync()
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// snapshotBytes is the space the snapshot files take (allocated blocks, not their apparent
// size: a snapshot is read-only and never grows): Capacity.SnapshotBytes, which Available
// subtracts so that snapshots reduce what new volumes may take.
func (f *File) snapshotBytes() int64 {
	ents, err := os.ReadDir(filepath.Join(f.cfg.Directory, snapshotDir))
	if err != nil {
		return 0
	}
	var n int64
	for _, e := range ents {
		if !strings.HasSuffix(e.Name(), suffix) {
			continue
		}
		if info, err := e.Info(); err == nil {
			if st, ok := info.Sys().(*syscall.Stat_t); ok {
				n += st.Blocks * 512
			}
		}
	}
	return n
}
