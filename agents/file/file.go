package file

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/failpoint"
)

// UnitBytes is the allocation unit sizes are rounded up to (never down): loop
// devices work in 512-byte sectors; 4 KiB keeps every filesystem block size
// whole.
const UnitBytes = 4096

const suffix = ".img"

// Config binds the file backend to one Store.
type Config struct {
	// Directory holds the volume files; created when missing.
	Directory string
	// ReserveBytes is headroom never provisioned, also refused on create.
	ReserveBytes int64
	// OvercommitPercent is max provisioned ÷ filesystem size × 100 (files are
	// sparse, so this backend is thin); 0 means 100.
	OvercommitPercent int64
	// DevDir is where loop device nodes live (default /dev).
	DevDir string
	// SysDir is the sysfs root used to find attached loop devices
	// (default /sys).
	SysDir string
}

// File is the file backend. Safe for concurrent use: operations on different volumes run
// at once (a burst of new volumes is not queued behind each other's fsync and loop
// attach), operations on one volume are serialised, and capacity checks are atomic with the
// creation they admit. Snapshot operations exclude every other operation.
type File struct {
	cfg Config
	// mu is held shared by volume operations and exclusively by snapshot operations.
	mu sync.RWMutex
	// capMu makes a capacity check and the reservation it admits one step; pending holds
	// the bytes of creations admitted whose file is not in the directory yet. Guarded by capMu.
	capMu   sync.Mutex
	pending map[string]int64
	ids     keyedLock
	idx     *loopIndex
}

// keyedLock serialises the operations on one volume id.
type keyedLock struct {
	mu    sync.Mutex
	held  map[string]chan struct{}
	inits sync.Once
}

// lock takes id's lock and returns its release.
func (k *keyedLock) lock(id string) func() {
	k.inits.Do(func() { k.held = map[string]chan struct{}{} })
	for {
		k.mu.Lock()
		ch, busy := k.held[id]
		if !busy {
			ch = make(chan struct{})
			k.held[id] = ch
			k.mu.Unlock()
			return func() {
				k.mu.Lock()
				delete(k.held, id)
				close(ch)
				k.mu.Unlock()
			}
		}
		k.mu.Unlock()
		<-ch
	}
}

// volumeOp begins an operation on volume id: mu shared, id's lock; call the result to end it.
func (f *File) volumeOp(id string) func() {
	f.mu.RLock()
	unlock := f.ids.lock(id)
	return func() {
		unlock()
		f.mu.RUnlock()
	}
}

var _ backend.Backend = (*File)(nil)

// New returns the backend, creating Config.Directory when missing.
func New(cfg Config) (*File, error) {
	if cfg.Directory == "" {
		return nil, fmt.Errorf("file backend: empty directory: %w", backend.ErrInvalidArgument)
	}
	abs, err := filepath.Abs(cfg.Directory)
	if err != nil {
		return nil, err
	}
	cfg.Directory = abs
	if cfg.DevDir == "" {
		cfg.DevDir = "/dev"
	}
	if cfg.SysDir == "" {
		cfg.SysDir = "/sys"
	}
	if err := os.MkdirAll(cfg.Directory, 0o700); err != nil {
		return nil, fmt.Errorf("file backend: %w", err)
	}
	// the kernel reports backing files by their resolved path
	if cfg.Directory, err = filepath.EvalSymlinks(cfg.Directory); err != nil {
		return nil, fmt.Errorf("file backend: %w", err)
	}
	return &File{cfg: cfg, idx: indexOf(cfg.Directory), pending: map[string]int64{}}, nil
}

func (f *File) path(id string) (string, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return "", err
	}
	return filepath.Join(f.cfg.Directory, id+suffix), nil
}

// fileKey identifies a file by its device and inode numbers.
type fileKey struct{ dev, ino uint64 }

// loops maps each bound loop device's backing file to its devices (e.g.
// /dev/loop3), in one pass over /sys/block/loop*. Devices match files by the
// backing file's device and inode numbers (LOOP_GET_STATUS64), not by the path
// in /sys/block/loop*/loop/backing_file: the kernel renders that path against
// the mount namespace of whoever attached the file, so after the agent
// restarts in a new container (new mounts) it no longer reads as the path
// this agent uses, and a path match would attach the file a second time. A
// device whose node cannot be opened is listed under byPath by that path, the
// only thing left to go on.
func (f *File) loops() (byFile map[fileKey][]string, byPath map[string][]string, err error) {
	m, err := f.bound()
	if err != nil {
		return nil, nil, err
	}
	byFile, byPath = f.loopsOf(m)
	return byFile, byPath, nil
}

// bound lists the backing_file entries of the bound loop devices in sysfs, sorted: which
// devices are bound, without opening any.
func (f *File) bound() ([]string, error) {
	m, err := filepath.Glob(filepath.Join(f.cfg.SysDir, "block", "loop*", "loop", "backing_file"))
	if err != nil {
		return nil, err
	}
	sort.Strings(m)
	return m, nil
}

// loopsOf is loops for the bound devices m.
func (f *File) loopsOf(m []string) (byFile map[fileKey][]string, byPath map[string][]string) {
	byFile, byPath = map[fileKey][]string{}, map[string][]string{}
	for _, bf := range m {
		dev := filepath.Join(f.cfg.DevDir, filepath.Base(filepath.Dir(filepath.Dir(bf))))
		info, err := loopStatus(dev)
		switch {
		case err == nil:
			k := fileKey{info.Device, info.Inode}
			byFile[k] = append(byFile[k], dev)
		case errors.Is(err, unix.ENXIO):
			// detached meanwhile
		default:
			if b, err := os.ReadFile(bf); err == nil {
				p := strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)")
				byPath[p] = append(byPath[p], dev)
			}
		}
	}
	return byFile, byPath
}

// devicesOf returns the loop devices bound to the file at path, given the
// index of loops.
func devicesOf(path string, byFile map[fileKey][]string, byPath map[string][]string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	out := append(append([]string(nil), byFile[fileKey{uint64(st.Dev), st.Ino}]...), byPath[path]...)
	sort.Strings(out)
	return out, nil
}

// attached returns the loop devices bound to the file at path, from the
// directory's index (loopIndex): one stat and one LOOP_GET_STATUS64 per device
// found, not a scan of every bound loop device.
func (f *File) attached(path string) ([]string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil, nil
		}
		return nil, fmt.Errorf("stat %s: %w", path, err)
	}
	return f.idx.lookup(f, path, fileKey{uint64(st.Dev), st.Ino})
}

// rescan replaces the directory's index with a fresh scan of the loop devices.
func (f *File) rescan() error {
	f.idx.mu.Lock()
	defer f.idx.mu.Unlock()
	return f.idx.scanLocked(f)
}

// loopIndex is which loop devices are bound to which files, built by one scan
// (File.loops) at the first lookup and again at a List — a Store refresh — that
// finds another set of bound devices in sysfs, and kept up to date in between by
// the backend's own attaches and detaches. (A device detached and bound to another
// file by someone else between two refreshes keeps the set: the check below finds it
// when its old file is looked up.) A
// device found in it is checked against the kernel (LOOP_GET_STATUS64 must
// still name the file) and a stale entry causes a fresh scan; a file absent from
// it is taken as unattached: only this backend attaches the files of its
// directory, so a device bound by anyone else (an agent of an earlier container)
// predates the process and is in the first scan. One index per directory, shared
// by the File instances the agent rebuilds for a Store.
type loopIndex struct {
	mu      sync.Mutex
	scanned bool
	byFile  map[fileKey][]string
	byPath  map[string][]string
	// bound is what File.bound listed at the last scan.
	bound []string
}

var (
	indexesMu sync.Mutex
	indexes   = map[string]*loopIndex{}
)

// indexOf returns the shared index of directory dir.
func indexOf(dir string) *loopIndex {
	indexesMu.Lock()
	defer indexesMu.Unlock()
	ix, ok := indexes[dir]
	if !ok {
		ix = &loopIndex{}
		indexes[dir] = ix
	}
	return ix
}

func (ix *loopIndex) scanLocked(f *File) error {
	m, err := f.bound()
	if err != nil {
		return err
	}
	ix.byFile, ix.byPath = f.loopsOf(m)
	ix.bound, ix.scanned = m, true
	return nil
}

// refreshLocked scans again only when the set of bound devices changed since the last scan
// (a directory listing of sysfs, no device opened): an idle agent's refresh costs no
// LOOP_GET_STATUS64 per device.
func (ix *loopIndex) refreshLocked(f *File) error {
	m, err := f.bound()
	if err != nil {
		return err
	}
	if ix.scanned && slices.Equal(m, ix.bound) {
		return nil
	}
	ix.byFile, ix.byPath = f.loopsOf(m)
	ix.bound, ix.scanned = m, true
	return nil
}

// lookup returns the devices bound to the file at path whose numbers are k.
func (ix *loopIndex) lookup(f *File, path string, k fileKey) ([]string, error) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if !ix.scanned {
		if err := ix.scanLocked(f); err != nil {
			return nil, err
		}
	}
	for _, dev := range ix.byFile[k] {
		info, err := loopStatus(dev)
		if err != nil || info.Device != k.dev || info.Inode != k.ino {
			// detached or rebound behind our back: read the kernel again
			if err := ix.scanLocked(f); err != nil {
				return nil, err
			}
			break
		}
	}
	out := append(append([]string(nil), ix.byFile[k]...), ix.byPath[path]...)
	sort.Strings(out)
	return out, nil
}

// added records that this backend bound dev to the file whose numbers are k.
func (ix *loopIndex) added(k fileKey, dev string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	if ix.scanned && !slices.Contains(ix.byFile[k], dev) {
		ix.byFile[k] = append(ix.byFile[k], dev)
	}
}

// removed records that this backend unbound dev.
func (ix *loopIndex) removed(dev string) {
	ix.mu.Lock()
	defer ix.mu.Unlock()
	for k, devs := range ix.byFile {
		if i := slices.Index(devs, dev); i >= 0 {
			if devs = slices.Delete(devs, i, i+1); len(devs) == 0 {
				delete(ix.byFile, k)
			} else {
				ix.byFile[k] = devs
			}
		}
	}
	for p, devs := range ix.byPath {
		if i := slices.Index(devs, dev); i >= 0 {
			if devs = slices.Delete(devs, i, i+1); len(devs) == 0 {
				delete(ix.byPath, p)
			} else {
				ix.byPath[p] = devs
			}
		}
	}
}

// volume describes the volume file at path of size bytes. Its SizeBytes is
// what a consumer sees: the loop device's size when that is smaller than the
// file (a crash between the file's truncate and LOOP_SET_CAPACITY leaves
// that), so that the agent expands again instead of reporting a size the
// device does not have.
func (f *File) volume(id, path string, size int64) (backend.Volume, error) {
	devs, err := f.attached(path)
	if err != nil {
		return backend.Volume{ID: id, Name: filepath.Base(path), SizeBytes: size, Thin: true}, err
	}
	return f.volumeOn(id, path, size, devs), nil
}

// volumeOn is the volume of the file at path given its loop devices: its
// size is the smaller of the file's and the device's.
func (f *File) volumeOn(id, path string, size int64, devs []string) backend.Volume {
	v := backend.Volume{ID: id, Name: filepath.Base(path), SizeBytes: size, Thin: true}
	if len(devs) > 0 {
		v.DevicePath = devs[0]
		if n, err := f.deviceBytes(devs[0]); err == nil && n < size {
			v.SizeBytes = n
		}
	}
	return v
}

// deviceBytes is the size of a loop device from /sys/block/<dev>/size
// (512-byte sectors whatever the logical block size, per the block layer's
// sysfs ABI).
func (f *File) deviceBytes(dev string) (int64, error) {
	b, err := os.ReadFile(filepath.Join(f.cfg.SysDir, "block", filepath.Base(dev), "size"))
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s size %q: %w", dev, b, err)
	}
	return n * 512, nil
}

// Create makes a sparse file of sizeBytes rounded up to UnitBytes and
// attaches it to a free loop device. See backend.Backend.Create.
func (f *File) Create(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	path, err := f.path(id)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, UnitBytes)
	defer f.volumeOp(id)()
	f.capMu.Lock()
	v, exists, err := f.adoptOrCheckRoom(id, path, size)
	if exists || err != nil {
		f.capMu.Unlock()
		return v, err
	}
	// admitted: the bytes count as provisioned until the file is in the directory
	f.pending[id] = size
	f.capMu.Unlock()
	defer func() {
		f.capMu.Lock()
		delete(f.pending, id)
		f.capMu.Unlock()
	}()
	// temp file + rename: a crash never leaves a short file under the final name.
	tmp := path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if errors.Is(err, fs.ErrExist) {
		os.Remove(tmp)
		fh, err = os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	}
	if err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	err = fh.Truncate(size)
	if err == nil {
		err = fh.Sync()
	}
	if err == nil {
		failpoint.Hit(failpoint.FileCreateSized)
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// the file enters the directory and leaves pending in one step: counted once
		f.capMu.Lock()
		if err = os.Rename(tmp, path); err == nil {
			delete(f.pending, id)
		}
		f.capMu.Unlock()
	}
	if err != nil {
		os.Remove(tmp)
		return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	failpoint.Hit(failpoint.FileCreateRenamed)
	if _, err := f.attach(path); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return f.volume(id, path, size)
}

// adoptOrCheckRoom begins every creation (new, restored, cloned): an
// existing file of the volume at least size bytes is adopted (attached and
// returned with exists true; a smaller one is ErrAlreadyExists), else the
// directory must have room for size bytes (ErrInsufficientCapacity). The
// caller holds f.capMu (and mu exclusively or id's lock).
func (f *File) adoptOrCheckRoom(id, path string, size int64) (v backend.Volume, exists bool, err error) {
	if st, err := os.Stat(path); err == nil {
		if st.Size() < size {
			return backend.Volume{}, false, fmt.Errorf("volume %s exists with %d bytes, %d requested: %w", id, st.Size(), size, backend.ErrAlreadyExists)
		}
		if _, err := f.attach(path); err != nil {
			return backend.Volume{}, false, err
		}
		v, err := f.volume(id, path, st.Size())
		return v, true, err
	}
	c, err := f.capacity()
	if err != nil {
		return backend.Volume{}, false, err
	}
	if avail := c.Available(f.cfg.ReserveBytes, f.cfg.OvercommitPercent); size > avail {
		return backend.Volume{}, false, fmt.Errorf("volume %s: %d bytes requested, %d available: %w", id, size, avail, backend.ErrInsufficientCapacity)
	}
	return backend.Volume{}, false, nil
}

// Expand grows the file and tells the loop device (LOOP_SET_CAPACITY).
func (f *File) Expand(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	path, err := f.path(id)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, UnitBytes)
	defer f.volumeOp(id)()
	if size, err = f.grow(id, path, size); err != nil {
		return backend.Volume{}, err
	}
	devs, err := f.attached(path)
	if err != nil {
		return backend.Volume{}, err
	}
	for _, d := range devs {
		if n, err := f.deviceBytes(d); err == nil && n >= size {
			continue
		}
		if err := setCapacity(d); err != nil {
			return backend.Volume{}, fmt.Errorf("expand volume %s: %s: %w", id, d, err)
		}
	}
	return f.volume(id, path, size)
}

// grow makes the file at path at least size bytes when the directory has room (the check
// and the truncate one step under capMu) and returns its size.
func (f *File) grow(id, path string, size int64) (int64, error) {
	f.capMu.Lock()
	defer f.capMu.Unlock()
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return 0, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	if err != nil {
		return 0, err
	}
	if st.Size() >= size {
		// the file is big enough; a loop device may still show less (a crash
		// after the truncate below): the caller tells it
		return st.Size(), nil
	}
	c, err := f.capacity()
	if err != nil {
		return 0, err
	}
	if grow, avail := size-st.Size(), c.Available(f.cfg.ReserveBytes, f.cfg.OvercommitPercent); grow > avail {
		return 0, fmt.Errorf("expand volume %s by %d bytes, %d available: %w", id, grow, avail, backend.ErrInsufficientCapacity)
	}
	if err := os.Truncate(path, size); err != nil {
		return 0, fmt.Errorf("expand volume %s: %w", id, err)
	}
	failpoint.Hit(failpoint.FileExpandTruncated)
	return size, nil
}

// Delete detaches the loop device(s) and removes the file. A device still
// open exclusively (mounted, held by a filesystem) → backend.ErrInUse.
func (f *File) Delete(ctx context.Context, id string) error {
	path, err := f.path(id)
	if err != nil {
		return err
	}
	defer f.volumeOp(id)()
	devs, err := f.attached(path)
	if err != nil {
		return err
	}
	for _, d := range devs {
		if err := detach(d); err != nil {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
		f.idx.removed(d)
	}
	failpoint.Hit(failpoint.FileDeleteDetached)
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	// the record goes after the image: a crash between leaves no stamp without a volume
	// that a List would show
	if err := f.removeStamp(id); err != nil {
		return fmt.Errorf("delete volume %s: identity record: %w", id, err)
	}
	return nil
}

// Get returns one volume.
func (f *File) Get(ctx context.Context, id string) (backend.Volume, error) {
	path, err := f.path(id)
	if err != nil {
		return backend.Volume{}, err
	}
	st, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return backend.Volume{}, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	if err != nil {
		return backend.Volume{}, err
	}
	return f.volume(id, path, st.Size())
}

// List returns the volumes in the directory (files named <volume id>.img). It
// renews the directory's index (a Store refresh): a scan of the loop devices when
// the set of bound devices changed since the last one.
func (f *File) List(ctx context.Context) ([]backend.Volume, error) {
	ents, err := os.ReadDir(f.cfg.Directory)
	if err != nil {
		return nil, err
	}
	f.idx.mu.Lock()
	err = f.idx.refreshLocked(f)
	byFile, byPath := f.idx.byFile, f.idx.byPath
	var out []backend.Volume
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || !e.Type().IsRegular() || backend.ValidateVolumeID(id) != nil || err != nil {
			continue
		}
		info, ierr := e.Info()
		if ierr != nil {
			continue
		}
		path := filepath.Join(f.cfg.Directory, e.Name())
		var devs []string
		if devs, err = devicesOf(path, byFile, byPath); err != nil {
			break
		}
		v := f.volumeOn(id, path, info.Size(), devs)
		v.Stamp, v.StampErr = f.readStamp(id)
		out = append(out, v)
	}
	f.idx.mu.Unlock()
	if err != nil {
		return nil, err
	}
	return out, nil // ReadDir is sorted by name = id
}

// Capacity is the filesystem of the directory (statfs): total size, space
// free for unprivileged use, and the sum of the volume files' sizes.
func (f *File) Capacity(ctx context.Context) (backend.Capacity, error) {
	f.capMu.Lock()
	defer f.capMu.Unlock()
	return f.capacity()
}

// capacity is Capacity, the creations admitted but not yet in the directory counted as
// provisioned; the caller holds capMu.
func (f *File) capacity() (backend.Capacity, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(f.cfg.Directory, &st); err != nil {
		return backend.Capacity{}, fmt.Errorf("statfs %s: %w", f.cfg.Directory, err)
	}
	c := backend.Capacity{
		Thin:        true,
		TotalBytes:  int64(st.Blocks) * int64(st.Bsize),
		FreeBytes:   int64(st.Bavail) * int64(st.Bsize),
		ExtentBytes: UnitBytes,
	}
	ents, err := os.ReadDir(f.cfg.Directory)
	if err != nil {
		return c, err
	}
	for _, e := range ents {
		id, ok := strings.CutSuffix(e.Name(), suffix)
		if !ok || backend.ValidateVolumeID(id) != nil {
			continue
		}
		if info, err := e.Info(); err == nil {
			c.ProvisionedBytes += info.Size()
		}
	}
	c.SnapshotBytes = f.snapshotBytes()
	// Creations admitted but not renamed yet hold their room (Create puts them in pending).
	for _, n := range f.pending {
		c.ProvisionedBytes += n
	}
	if c.TotalBytes > 0 {
		c.DataUsedRatio = float64(c.TotalBytes-c.FreeBytes) / float64(c.TotalBytes)
	}
	return c, nil
}

// DevicePath returns the loop device of the volume, attaching the file when
// it is not attached (e.g. after a reboot).
func (f *File) DevicePath(ctx context.Context, id string) (string, error) {
	path, err := f.path(id)
	if err != nil {
		return "", err
	}
	defer f.volumeOp(id)()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return "", fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	return f.attach(path)
}

// attach returns the loop device of path, attaching it when needed.
func (f *File) attach(path string) (string, error) {
	devs, err := f.attached(path)
	if err != nil {
		return "", err
	}
	if len(devs) > 0 {
		return devs[0], nil
	}
	dev, err := attachLoop(f.cfg.DevDir, path)
	if err != nil {
		return "", err
	}
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err == nil {
		f.idx.added(fileKey{uint64(st.Dev), st.Ino}, dev)
	} else if err := f.rescan(); err != nil {
		return "", err
	}
	return dev, nil
}
