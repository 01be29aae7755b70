package raw

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
)

// Partitioning modes (policy's StoragePool.spec.backend.raw.partitioning).
const (
	// GPT: a GPT partition per volume.
	GPT = "GPT"
	// Whole: a whole disk per volume.
	Whole = "Whole"
)

// Runner runs name with args, writing stdin to its standard input (nil: none), and returns
// stdout, stderr and the exit code; err is non-nil only when the command could not run or did
// not exit. sfdisk reads its script from standard input.
type Runner func(ctx context.Context, stdin []byte, name string, args ...string) (stdout, stderr []byte, exitCode int, err error)

// ExecRunner runs commands with os/exec in the C locale (stable messages):
// backend.ExecRunnerStdin.
func ExecRunner(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, []byte, int, error) {
	return backend.ExecRunnerStdin(stdin)(ctx, name, args...)
}

// Config binds the raw backend to one Store: a StoragePool's raw backend on one node.
type Config struct {
	// Devices are the whole disks, as declared (symlinks such as /dev/disk/by-id/... are
	// resolved at every use, so a disk keeps its volumes when its kernel name changes).
	Devices []string
	// Partitioning is GPT (default) or Whole.
	Partitioning string
	// ReserveBytes is headroom never provisioned, also refused on create.
	ReserveBytes int64
	// SysDir is the sysfs root (default /sys); DevDir where partition nodes are (default
	// /dev, devtmpfs: the kernel makes the nodes, no udev needed).
	SysDir, DevDir string
	// Run runs an external command; nil means ExecRunner.
	Run Runner
	// OnCommand, when set, is called after every command (metrics).
	OnCommand func(name string, args []string, d time.Duration, err error)
	// OpenDevice opens a disk to read or write its identity stamp area (stamp.go); nil means
	// os.OpenFile. Tests substitute it.
	OpenDevice func(dev string, flag int) (*os.File, error)
}

// Raw is the backend of one Store's disks. Safe for concurrent use: every operation is
// serialised (a partition table write, and a capacity check with the creation it admits, are
// one step).
type Raw struct {
	cfg Config
	mu  sync.Mutex
}

var _ backend.Backend = (*Raw)(nil)

// New validates cfg and returns the backend; it runs no command (Ensure prepares the disks).
// ErrInvalidArgument for no devices, a relative path, a duplicate or an unknown mode.
func New(cfg Config) (*Raw, error) {
	if len(cfg.Devices) == 0 {
		return nil, fmt.Errorf("raw backend: no devices: %w", backend.ErrInvalidArgument)
	}
	seen := map[string]bool{}
	for _, d := range cfg.Devices {
		if !strings.HasPrefix(d, "/dev/") || seen[d] {
			return nil, fmt.Errorf("raw backend: device %q: want a unique absolute /dev path: %w", d, backend.ErrInvalidArgument)
		}
		seen[d] = true
	}
	switch cfg.Partitioning {
	case "":
		cfg.Partitioning = GPT
	case GPT, Whole:
	default:
		return nil, fmt.Errorf("raw backend: partitioning %q: want GPT or Whole: %w", cfg.Partitioning, backend.ErrInvalidArgument)
	}
	if cfg.SysDir == "" {
		cfg.SysDir = "/sys"
	}
	if cfg.DevDir == "" {
		cfg.DevDir = "/dev"
	}
	if cfg.Run == nil {
		cfg.Run = ExecRunner
	}
	return &Raw{cfg: cfg}, nil
}

// run runs a command, its failures classified by stderr (backend.Commands).
func (r *Raw) run(ctx context.Context, stdin []byte, name string, args ...string) ([]byte, error) {
	run := func(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
		return r.cfg.Run(ctx, stdin, name, args...)
	}
	return backend.Commands{Run: run, Classify: classify, OnCommand: r.cfg.OnCommand, Label: "raw"}.Exec(ctx, name, args...)
}

// errNoTable marks a disk without a partition table.
var errNoTable = errors.New("no partition table")

func classify(stderr string) error {
	s := strings.ToLower(stderr)
	switch {
	case strings.Contains(s, "does not contain a recognized partition table"):
		return errNoTable
	case strings.Contains(s, "busy"), strings.Contains(s, "in use"):
		return backend.ErrInUse
	case strings.Contains(s, "no such file or directory"), strings.Contains(s, "no such device"):
		return backend.ErrNotFound
	}
	return nil
}

// disk is one declared disk as one refresh saw it.
type disk struct {
	declared string // as in Config.Devices
	dev      string // resolved, e.g. /dev/vdb
	kname    string // kernel name, e.g. vdb
	t        table
	// kernel maps the partition numbers the kernel knows to their kernel names (vdb1).
	kernel map[int]string
}

// state is one refresh: every disk, in declared order.
type state struct{ disks []*disk }

// resolve returns the resolved device and kernel name of a declared disk, and refuses a
// partition (its sysfs directory has a "partition" file). ErrNotFound when absent.
func (r *Raw) resolve(declared string) (dev, kname string, err error) {
	dev, err = filepath.EvalSymlinks(declared)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return "", "", fmt.Errorf("device %s: %w", declared, backend.ErrNotFound)
		}
		return "", "", fmt.Errorf("device %s: %w", declared, err)
	}
	kname = filepath.Base(dev)
	if _, err := os.Stat(filepath.Join(r.cfg.SysDir, "class", "block", kname)); err != nil {
		return "", "", fmt.Errorf("device %s (%s) is not a block device the kernel lists: %w", declared, dev, backend.ErrNotFound)
	}
	if _, err := os.Stat(filepath.Join(r.cfg.SysDir, "class", "block", kname, "partition")); err == nil {
		return "", "", fmt.Errorf("device %s (%s) is a partition: the raw backend takes whole disks: %w", declared, dev, backend.ErrInvalidArgument)
	}
	return dev, kname, nil
}

// kernelParts lists the partitions the kernel knows of disk kname, by number.
func (r *Raw) kernelParts(kname string) (map[int]string, error) {
	m, err := filepath.Glob(filepath.Join(r.cfg.SysDir, "class", "block", kname, "*", "partition"))
	if err != nil {
		return nil, err
	}
	out := map[int]string{}
	for _, f := range m {
		b, err := os.ReadFile(f)
		if err != nil {
			continue // removed meanwhile
		}
		n, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil {
			return nil, fmt.Errorf("%s: %q: %w", f, b, err)
		}
		out[n] = filepath.Base(filepath.Dir(f))
	}
	return out, nil
}

// readDisk reads one disk: its table (errNoTable when it has none) and the kernel's view.
func (r *Raw) readDisk(ctx context.Context, declared string) (*disk, error) {
	dev, kname, err := r.resolve(declared)
	if err != nil {
		return nil, err
	}
	d := &disk{declared: declared, dev: dev, kname: kname}
	out, err := r.run(ctx, nil, "sfdisk", "--json", dev)
	if err != nil {
		return d, fmt.Errorf("device %s: %w", declared, err)
	}
	if d.t, err = parseTable(out); err != nil {
		return d, fmt.Errorf("device %s: %w", declared, err)
	}
	if d.t.Label != "gpt" {
		return d, fmt.Errorf("device %s carries a %s partition table, not GPT: %w", declared, d.t.Label, backend.ErrDeviceNotEmpty)
	}
	if d.kernel, err = r.kernelParts(kname); err != nil {
		return d, err
	}
	return d, nil
}

// refresh reads every disk: one `sfdisk --json` per disk and sysfs.
func (r *Raw) refresh(ctx context.Context) (state, error) {
	var st state
	for _, dev := range r.cfg.Devices {
		d, err := r.readDisk(ctx, dev)
		if err != nil {
			return st, err
		}
		st.disks = append(st.disks, d)
	}
	return st, nil
}

// find returns the disk and partition of volume id; ok is false when absent.
func (st state) find(id string) (*disk, partition, bool) {
	for _, d := range st.disks {
		for _, p := range d.t.Partitions {
			if pid, mine := p.mine(); mine && pid == id {
				return d, p, true
			}
		}
	}
	return nil, partition{}, false
}

func (r *Raw) volume(d *disk, p partition, id string) backend.Volume {
	v := backend.Volume{ID: id, Name: p.Name, SizeBytes: p.Size * d.t.SectorSize}
	if k, ok := d.kernel[p.Number]; ok {
		v.DevicePath = filepath.Join(r.cfg.DevDir, k)
	}
	return v
}

// CheckEmpty returns backend.ErrDeviceNotEmpty when device carries any signature `blkid -p`
// (low-level probe, no cache) or `wipefs -n` reports.
func (r *Raw) CheckEmpty(ctx context.Context, device string) error {
	out, err := r.run(ctx, nil, "blkid", "-p", device)
	var ce *backend.CommandError
	switch {
	case err == nil:
		return fmt.Errorf("device %s: %s: %w", device, strings.TrimSpace(string(out)), backend.ErrDeviceNotEmpty)
	case errors.As(err, &ce) && ce.ExitCode == 2:
		// blkid: exit 2 = nothing found
	default:
		return fmt.Errorf("device %s: %w", device, err)
	}
	out, err = r.run(ctx, nil, "wipefs", "-n", "--noheadings", device)
	if err != nil {
		return fmt.Errorf("device %s: %w", device, err)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return fmt.Errorf("device %s: wipefs: %s: %w", device, s, backend.ErrDeviceNotEmpty)
	}
	return nil
}

// Ensure prepares every declared disk: a disk without a partition table must carry no
// signature at all (CheckEmpty; else backend.ErrDeviceNotEmpty and nothing is written) and
// gets an empty GPT; a disk with a table must be GPT and hold only Plinth's partitions
// (else ErrDeviceNotEmpty naming the first other one). Partitions in the table that the
// kernel does not know (a crash between the table write and partx) are added (partx -a).
// A missing device is ErrNotFound, a partition given as a disk ErrInvalidArgument.
// Idempotent.
func (r *Raw) Ensure(ctx context.Context) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, dev := range r.cfg.Devices {
		d, err := r.readDisk(ctx, dev)
		if errors.Is(err, errNoTable) {
			if err := r.CheckEmpty(ctx, d.dev); err != nil {
				return err
			}
			if _, err := r.run(ctx, []byte("label: gpt\n"), "sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", "--wipe", "always", d.dev); err != nil {
				return fmt.Errorf("write GPT on %s: %w", dev, err)
			}
			d, err = r.readDisk(ctx, dev)
		}
		if err != nil {
			return err
		}
		for _, p := range d.t.Partitions {
			if _, mine := p.mine(); !mine {
				return fmt.Errorf("device %s: partition %d (%q, type %s) is not a Plinth volume: the raw backend takes disks whose every partition is Plinth's: %w",
					dev, p.Number, p.Name, p.Type, backend.ErrDeviceNotEmpty)
			}
			if _, ok := d.kernel[p.Number]; !ok {
				if err := r.partx(ctx, "-a", d, p.Number); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// partx tells the kernel about one partition of d (op -a add, -u update size, -d delete).
func (r *Raw) partx(ctx context.Context, op string, d *disk, n int) error {
	if _, err := r.run(ctx, nil, "partx", op, "--nr", strconv.Itoa(n), d.dev); err != nil {
		return fmt.Errorf("partx %s partition %d of %s: %w", op, n, d.declared, err)
	}
	return nil
}

// capacity derives the Store's capacity from one refresh. Total is every disk's aligned
// usable area; GPT: free is the sum of the aligned gaps and the largest of them bounds a
// new volume; Whole: free is the disks without a partition, and the largest of them.
func (r *Raw) capacity(st state) backend.Capacity {
	c := backend.Capacity{ExtentBytes: AlignBytes, Contiguous: true}
	for _, d := range st.disks {
		ss := d.t.SectorSize
		c.TotalBytes += d.t.usable() * ss
		for _, p := range d.t.Partitions {
			if _, mine := p.mine(); mine {
				c.ProvisionedBytes += p.Size * ss
			}
		}
		if r.cfg.Partitioning == Whole {
			if len(d.t.Partitions) == 0 {
				u := d.t.usable() * ss
				c.FreeBytes += u
				c.LargestFreeBytes = max(c.LargestFreeBytes, u)
			}
			continue
		}
		for _, g := range d.t.gaps() {
			c.FreeBytes += g.Size * ss
			c.LargestFreeBytes = max(c.LargestFreeBytes, g.Size*ss)
		}
	}
	return c
}

// Capacity reports the Store's capacity (one sfdisk --json per disk). Units bytes.
func (r *Raw) Capacity(ctx context.Context) (backend.Capacity, error) {
	c, _, err := r.Observe(ctx)
	return c, err
}

// List returns Plinth's volumes on the disks, ordered by id.
func (r *Raw) List(ctx context.Context) ([]backend.Volume, error) {
	_, vols, err := r.Observe(ctx)
	return vols, err
}

// Observe returns the Store's capacity and Plinth's volumes (ordered by id) with their
// identity stamps from one refresh: one `sfdisk --json` and one read of the stamp area per
// disk. A missing disk wraps backend.ErrNotFound.
func (r *Raw) Observe(ctx context.Context) (backend.Capacity, []backend.Volume, error) {
	st, err := r.refresh(ctx)
	if err != nil {
		return backend.Capacity{}, nil, err
	}
	var vols []backend.Volume
	for _, d := range st.disks {
		byNumber := map[int]*backend.Volume{}
		for _, p := range d.t.Partitions {
			if id, mine := p.mine(); mine {
				v := r.volume(d, p, id)
				byNumber[p.Number] = &v
			}
		}
		r.readStamps(d, byNumber) // one read of the disk's stamp area
		for _, v := range byNumber {
			vols = append(vols, *v)
		}
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i].ID < vols[j].ID })
	return r.capacity(st), vols, nil
}

// Get returns one volume; ErrNotFound when no partition carries its id.
func (r *Raw) Get(ctx context.Context, id string) (backend.Volume, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return backend.Volume{}, err
	}
	st, err := r.refresh(ctx)
	if err != nil {
		return backend.Volume{}, err
	}
	d, p, ok := st.find(id)
	if !ok {
		return backend.Volume{}, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	return r.volume(d, p, id), nil
}

// DevicePath returns the partition's device node (/dev/vdb3), adding the partition to the
// kernel first when the table has it and the kernel does not (partx -a).
func (r *Raw) DevicePath(ctx context.Context, id string) (string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.devicePath(ctx, id)
}

func (r *Raw) devicePath(ctx context.Context, id string) (string, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return "", err
	}
	st, err := r.refresh(ctx)
	if err != nil {
		return "", err
	}
	d, p, ok := st.find(id)
	if !ok {
		return "", fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	if k, ok := d.kernel[p.Number]; ok {
		return filepath.Join(r.cfg.DevDir, k), nil
	}
	if err := r.partx(ctx, "-a", d, p.Number); err != nil {
		return "", err
	}
	kp, err := r.kernelParts(d.kname)
	if err != nil {
		return "", err
	}
	k, ok := kp[p.Number]
	if !ok {
		return "", fmt.Errorf("volume %s: partition %d of %s: added with partx, not listed in sysfs", id, p.Number, d.declared)
	}
	return filepath.Join(r.cfg.DevDir, k), nil
}

// Create makes volume id: GPT — a partition of sizeBytes rounded up to AlignBytes, at the
// start of the largest free region of any disk (so that it has the most room to grow);
// Whole — the smallest free disk that holds sizeBytes, one partition spanning it (the
// volume's size is the disk's usable area). The partition carries TypeGUID, PartitionName
// and PartitionGUID, and sfdisk wipes any old signature in its area (--wipe-partitions
// always: a new volume never shows an earlier filesystem). A partition with this id is
// adopted (also one a crash left before the agent recorded it). Errors: see
// backend.Backend.Create.
func (r *Raw) Create(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	name, err := PartitionName(id)
	if err != nil {
		return backend.Volume{}, err
	}
	guid, _ := PartitionGUID(id)
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.refresh(ctx)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, AlignBytes)
	if d, p, ok := st.find(id); ok {
		v := r.volume(d, p, id)
		if v.SizeBytes < size {
			return backend.Volume{}, fmt.Errorf("volume %s exists with %d bytes, %d requested: %w", id, v.SizeBytes, size, backend.ErrAlreadyExists)
		}
		return r.adopt(ctx, d, p, id)
	}
	c := r.capacity(st)
	if avail := c.Available(r.cfg.ReserveBytes, 0); size > avail {
		return backend.Volume{}, fmt.Errorf("volume %s: %d bytes requested, %d available in one free region (%d free in all, reserve %d): %w",
			id, size, avail, c.FreeBytes, r.cfg.ReserveBytes, backend.ErrInsufficientCapacity)
	}
	var target *disk
	var at gap
	var best int64 // bytes of the region chosen
	for _, d := range st.disks {
		ss := d.t.SectorSize
		if r.cfg.Partitioning == Whole {
			// the smallest free disk that holds the volume: large disks stay for large volumes
			if u := d.t.usable() * ss; len(d.t.Partitions) == 0 && u >= size && (target == nil || u < best) {
				target, at, best = d, d.t.gaps()[0], u
			}
			continue
		}
		// the largest free region: the new partition gets the most room to grow into
		for _, g := range d.t.gaps() {
			if b := g.Size * ss; b >= size && b > best {
				target, at, best = d, g, b
			}
		}
	}
	if target == nil { // Available said yes: only a reserve-free race could get here
		return backend.Volume{}, fmt.Errorf("volume %s: no free region of %d bytes: %w", id, size, backend.ErrInsufficientCapacity)
	}
	sectors := at.Size
	if r.cfg.Partitioning == GPT {
		sectors = size / target.t.SectorSize
	}
	script := fmt.Sprintf("start=%d, size=%d, type=%s, uuid=%s, name=%q\n", at.Start, sectors, TypeGUID, guid, name)
	if _, err := r.run(ctx, []byte(script), "sfdisk", "--quiet", "--append", "--no-reread", "--no-tell-kernel", "--wipe-partitions", "always", target.dev); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s on %s: %w", id, target.declared, err)
	}
	d, err := r.readDisk(ctx, target.declared)
	if err != nil {
		return backend.Volume{}, err
	}
	for _, p := range d.t.Partitions {
		if pid, mine := p.mine(); mine && pid == id {
			return r.adopt(ctx, d, p, id)
		}
	}
	return backend.Volume{}, fmt.Errorf("volume %s: sfdisk wrote no partition named %s on %s", id, name, target.declared)
}

// adopt makes sure the kernel knows partition p (partx -a) and returns its volume.
func (r *Raw) adopt(ctx context.Context, d *disk, p partition, id string) (backend.Volume, error) {
	if _, ok := d.kernel[p.Number]; !ok {
		if err := r.partx(ctx, "-a", d, p.Number); err != nil {
			return backend.Volume{}, err
		}
		kp, err := r.kernelParts(d.kname)
		if err != nil {
			return backend.Volume{}, err
		}
		d.kernel = kp
	}
	return r.volume(d, p, id), nil
}

// Expand grows the partition to sizeBytes rounded up to AlignBytes, into the free space
// right after it only (partitions never move: their data would have to). Never shrinks.
// Errors: ErrNotFound; ErrOutOfRange when the space after the partition is too small (the
// message says how much there is) or the volume is a whole disk; ErrInsufficientCapacity
// when the growth would eat into the reserve.
func (r *Raw) Expand(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	if err := backend.ValidateVolumeID(id); err != nil {
		return backend.Volume{}, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.refresh(ctx)
	if err != nil {
		return backend.Volume{}, err
	}
	d, p, ok := st.find(id)
	if !ok {
		return backend.Volume{}, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	ss := d.t.SectorSize
	size := backend.RoundUp(sizeBytes, AlignBytes)
	cur := p.Size * ss
	if cur >= size {
		return r.volume(d, p, id), nil
	}
	if r.cfg.Partitioning == Whole {
		return backend.Volume{}, fmt.Errorf("volume %s is the whole disk %s (%d bytes): it cannot grow to %d bytes: %w", id, d.declared, cur, size, backend.ErrOutOfRange)
	}
	grow := size - cur
	if room := d.t.after(p) * ss; grow > room {
		return backend.Volume{}, fmt.Errorf("volume %s (partition %d of %s, %d bytes) can grow only into the free space right after it: %d bytes there, %d more needed: %w",
			id, p.Number, d.declared, cur, room, grow, backend.ErrOutOfRange)
	}
	if free := r.capacity(st).FreeBytes - r.cfg.ReserveBytes; grow > free {
		return backend.Volume{}, fmt.Errorf("expand volume %s by %d bytes, %d available above the reserve: %w", id, grow, max(free, 0), backend.ErrInsufficientCapacity)
	}
	script := fmt.Sprintf("size=%d\n", size/ss)
	if _, err := r.run(ctx, []byte(script), "sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", "-N", strconv.Itoa(p.Number), d.dev); err != nil {
		return backend.Volume{}, fmt.Errorf("expand volume %s: %w", id, err)
	}
	if _, ok := d.kernel[p.Number]; ok {
		// BLKPG resize: allowed while the partition is open (growing a mounted filesystem)
		if err := r.partx(ctx, "-u", d, p.Number); err != nil {
			return backend.Volume{}, err
		}
	}
	nd, err := r.readDisk(ctx, d.declared)
	if err != nil {
		return backend.Volume{}, err
	}
	for _, q := range nd.t.Partitions {
		if qid, mine := q.mine(); mine && qid == id {
			if _, ok := nd.kernel[q.Number]; !ok {
				return r.adopt(ctx, nd, q, id)
			}
			return r.volume(nd, q, id), nil
		}
	}
	return backend.Volume{}, fmt.Errorf("volume %s: gone after resize: %w", id, backend.ErrNotFound)
}

// Delete removes volume id: the kernel must first let the partition go (partx -d: BLKPG
// delete fails with EBUSY while anything holds it open — a mount, an nvmet export, a
// process — and then nothing is changed and ErrInUse names the holders it finds); the
// partition is added back for the wipe only, its signatures are erased (wipefs -a), it is
// removed from the kernel and then from the table (sfdisk --delete). An absent volume is
// success.
func (r *Raw) Delete(ctx context.Context, id string) error {
	if err := backend.ValidateVolumeID(id); err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.refresh(ctx)
	if err != nil {
		return err
	}
	d, p, ok := st.find(id)
	if !ok {
		return nil
	}
	if _, known := d.kernel[p.Number]; known {
		if err := r.partx(ctx, "-d", d, p.Number); err != nil {
			return fmt.Errorf("delete volume %s: partition %d of %s is open (%s); nothing was changed: %w",
				id, p.Number, d.declared, r.holders(d.kernel[p.Number]), errors.Join(backend.ErrInUse, err))
		}
	}
	// closed: add it back for wipefs, which works on the partition's own device
	if err := r.partx(ctx, "-a", d, p.Number); err != nil {
		return err
	}
	kp, err := r.kernelParts(d.kname)
	if err != nil {
		return err
	}
	k, ok := kp[p.Number]
	if !ok {
		return fmt.Errorf("delete volume %s: partition %d of %s: added with partx, not listed in sysfs", id, p.Number, d.declared)
	}
	if _, err := r.run(ctx, nil, "wipefs", "--all", filepath.Join(r.cfg.DevDir, k)); err != nil {
		return fmt.Errorf("delete volume %s: wipe signatures: %w", id, err)
	}
	if err := r.partx(ctx, "-d", d, p.Number); err != nil {
		return fmt.Errorf("delete volume %s: partition %d of %s was opened during its deletion (%s): %w",
			id, p.Number, d.declared, r.holders(k), errors.Join(backend.ErrInUse, err))
	}
	if _, err := r.run(ctx, nil, "sfdisk", "--quiet", "--no-reread", "--no-tell-kernel", "--delete", d.dev, strconv.Itoa(p.Number)); err != nil {
		return fmt.Errorf("delete volume %s: remove partition %d of %s: %w", id, p.Number, d.declared, err)
	}
	// the stamp goes after the partition (a crash between leaves a slot naming a volume no
	// partition carries: torn for the next volume of that number until it is stamped)
	if _, err := d.slotOffset(p.Number); err == nil {
		if err := r.writeSlot(d, p.Number, nil); err != nil {
			return fmt.Errorf("delete volume %s: clear its identity stamp: %w", id, err)
		}
	}
	return nil
}

// holders says who holds partition kname open, as far as the kernel tells: the mount points
// of /proc/self/mountinfo and the devices of its sysfs holders directory (device-mapper, md).
// Openers without a mount or holder (an nvmet namespace, a process) are not listed by the
// kernel; then it says so.
func (r *Raw) holders(kname string) string {
	var out []string
	if dev, err := os.ReadFile(filepath.Join(r.cfg.SysDir, "class", "block", kname, "dev")); err == nil {
		majmin := strings.TrimSpace(string(dev))
		if mi, err := os.ReadFile("/proc/self/mountinfo"); err == nil {
			for _, l := range strings.Split(string(mi), "\n") {
				f := strings.Fields(l)
				if len(f) > 4 && f[2] == majmin {
					out = append(out, "mounted at "+f[4])
				}
			}
		}
	}
	if hs, err := os.ReadDir(filepath.Join(r.cfg.SysDir, "class", "block", kname, "holders")); err == nil {
		for _, h := range hs {
			out = append(out, "held by "+h.Name())
		}
	}
	if len(out) == 0 {
		return "open by a process or an export; no mount or holder device listed"
	}
	return strings.Join(out, ", ")
}
