package zfs

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
)

// DefaultVolBlockSize is the volblocksize when Config.VolBlockSize is 0
// (StoragePool zfs.volBlockSize default "16K").
const DefaultVolBlockSize = 16 << 10

// DefaultDevDir is where udev's 60-zvol.rules links zvols by name.
const DefaultDevDir = "/dev/zvol"

// DefaultLinkTimeout bounds DevicePath's wait for udev to create the link.
const DefaultLinkTimeout = 10 * time.Second

// Config binds a ZFS backend to one Store: a StoragePool's zfs backend
// resolved for one node.
type Config struct {
	// Pool is the zpool name; it must exist (Plinth does not create pools).
	Pool string
	// ParentDataset is the dataset path below the pool that holds the zvols
	// ("k8s/volumes"); "" puts them in the pool's root dataset. Ensure
	// creates it (with parents) when missing.
	ParentDataset string
	// VolBlockSize is the zvols' volblocksize in bytes: a power of two from
	// 4 KiB to 128 KiB (0 means DefaultVolBlockSize). Sizes are rounded up to
	// a multiple of it (zfs refuses any other volsize). ParseVolBlockSize
	// reads the policy's "16K".
	VolBlockSize int64
	// Sparse makes zvols without a refreservation (zfs create -s): thin
	// volumes whose sizes may add up to more than the pool (overcommit).
	// False makes thick zvols that reserve their whole size at creation.
	Sparse bool
	// Properties are extra zfsprops(7) set on each zvol at creation
	// (compression=lz4, user properties ...); Plinth's own (volsize,
	// volblocksize, refreservation, reservation, PropManaged, PropIdentity)
	// are refused.
	Properties map[string]string
	// ReserveBytes is headroom never provisioned, also refused on create.
	ReserveBytes int64
	// OvercommitPercent is max provisioned ÷ physical × 100 for sparse zvols
	// (0 means 100).
	OvercommitPercent int64
	// DevDir is where zvols are linked by name (DefaultDevDir when "").
	DevDir string
	// LinkTimeout bounds DevicePath's wait for the link (DefaultLinkTimeout
	// when 0).
	LinkTimeout time.Duration
	// Run runs an external command; nil means os/exec. Tests substitute it.
	Run Runner
	// OnCommand, when set, is called after every command with its program
	// name, arguments, duration and error (metrics, per-command timings).
	OnCommand func(name string, args []string, d time.Duration, err error)
}

// Runner runs an external command (backend.Runner).
type Runner = backend.Runner

// ExecRunner runs commands with os/exec in the C locale, so messages are
// stable for classification.
func ExecRunner(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	return execRunner(ctx, name, args...)
}

var execRunner = backend.ExecRunner()

// ParseVolBlockSize reads a policy volBlockSize ("4K" … "128K", or a byte
// count) into bytes; "" is DefaultVolBlockSize. ErrInvalidArgument unless it
// is a power of two from 4 KiB to 128 KiB.
func ParseVolBlockSize(s string) (int64, error) {
	if s == "" {
		return DefaultVolBlockSize, nil
	}
	mult := int64(1)
	if t, ok := strings.CutSuffix(strings.ToUpper(s), "K"); ok {
		mult, s = 1024, t
	}
	n, err := strconv.ParseInt(s, 10, 64)
	// n beyond MaxInt64/1024 would wrap in n*mult: "18014398509481992K" is 2^64+8192 bytes,
	// which wrapped to a valid 8K.
	if err != nil || n > math.MaxInt64/mult || validVolBlockSize(n*mult) != nil {
		return 0, fmt.Errorf("volblocksize %q: want 4K, 8K, 16K, 32K, 64K or 128K: %w", s, backend.ErrInvalidArgument)
	}
	return n * mult, nil
}

func validVolBlockSize(n int64) error {
	if n < 4<<10 || n > 128<<10 || n&(n-1) != 0 {
		return fmt.Errorf("volblocksize %d: want a power of two from 4096 to 131072: %w", n, backend.ErrInvalidArgument)
	}
	return nil
}

// ZFS is the backend of one parent dataset of one zpool. Safe for concurrent
// use: mutations are serialised.
type ZFS struct {
	cfg    Config
	parent string // full parent dataset name
	props  []string
	mu     sync.Mutex
}

var _ backend.Backend = (*ZFS)(nil)

// New validates cfg (names against ZFS's limits, see MaxNameLen; volblocksize;
// properties) and returns the backend. It runs no command; call Ensure
// before use on a node. Errors wrap backend.ErrInvalidArgument.
func New(cfg Config) (*ZFS, error) {
	if err := ValidateParent(cfg.Pool, cfg.ParentDataset); err != nil {
		return nil, err
	}
	if cfg.VolBlockSize == 0 {
		cfg.VolBlockSize = DefaultVolBlockSize
	}
	if err := validVolBlockSize(cfg.VolBlockSize); err != nil {
		return nil, err
	}
	var props []string
	for k, v := range cfg.Properties {
		if err := validateProperty(k, v); err != nil {
			return nil, err
		}
		props = append(props, k+"="+v)
	}
	sort.Strings(props)
	if cfg.DevDir == "" {
		cfg.DevDir = DefaultDevDir
	}
	if cfg.LinkTimeout == 0 {
		cfg.LinkTimeout = DefaultLinkTimeout
	}
	if cfg.Run == nil {
		cfg.Run = ExecRunner
	}
	return &ZFS{cfg: cfg, parent: ParentName(cfg.Pool, cfg.ParentDataset), props: props}, nil
}

// run runs a zfs or zpool command; a non-zero exit becomes a
// *backend.CommandError classified by its stderr.
func (z *ZFS) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	return backend.Commands{Run: z.cfg.Run, Classify: classify, OnCommand: z.cfg.OnCommand, Label: "zfs"}.Exec(ctx, name, args...)
}

// classify maps zfs/zpool messages (LC_ALL=C; libzfs_error.c) to the typed
// errors.
func classify(stderr string) error {
	s := strings.ToLower(stderr)
	switch {
	case strings.Contains(s, "out of space"), strings.Contains(s, "size is greater than available space"),
		strings.Contains(s, "insufficient"):
		return backend.ErrInsufficientCapacity
	case strings.Contains(s, "dataset is busy"), strings.Contains(s, "pool or dataset is busy"), strings.Contains(s, "in use"):
		return backend.ErrInUse
	case strings.Contains(s, "dataset already exists"), strings.Contains(s, "already exists"):
		return backend.ErrAlreadyExists
	case strings.Contains(s, "dataset does not exist"), strings.Contains(s, "no such pool"), strings.Contains(s, "does not exist"):
		return backend.ErrNotFound
	case strings.Contains(s, "invalid"), strings.Contains(s, "bad property"), strings.Contains(s, "must be a multiple"),
		strings.Contains(s, "must be one of"):
		return backend.ErrInvalidArgument
	}
	return nil
}

// state is one refresh: the parent dataset and its direct children.
type state struct {
	parent   Dataset
	children []Dataset
}

func (s state) child(name string) (Dataset, bool) {
	for _, d := range s.children {
		if d.Name == name {
			return d, true
		}
	}
	return Dataset{}, false
}

func listArgs(extra ...string) []string {
	return append([]string{"list", "-Hp", "-o", strings.Join(datasetFields, ",")}, extra...)
}

// refresh is the one `zfs list` per observation: the parent and its direct
// children. backend.ErrNotFound when the parent (or the pool) does not exist.
func (z *ZFS) refresh(ctx context.Context) (state, error) {
	out, err := z.run(ctx, "zfs", listArgs("-t", "filesystem,volume", "-d", "1", z.parent)...)
	if err != nil {
		return state{}, fmt.Errorf("parent dataset %s: %w", z.parent, err)
	}
	ds, err := ParseDatasets(out)
	if err != nil {
		return state{}, err
	}
	st := state{}
	found := false
	for _, d := range ds {
		if d.Name == z.parent {
			st.parent, found = d, true
		} else {
			st.children = append(st.children, d)
		}
	}
	if !found {
		return state{}, fmt.Errorf("parent dataset %s: not listed: %w", z.parent, backend.ErrNotFound)
	}
	return st, nil
}

// Pool reports the zpool (one `zpool list`): raw size, allocation, health.
// backend.ErrNotFound when the pool is not imported.
func (z *ZFS) Pool(ctx context.Context) (Pool, error) {
	out, err := z.run(ctx, "zpool", "list", "-Hp", "-o", strings.Join(poolFields, ","), z.cfg.Pool)
	if err != nil {
		return Pool{}, fmt.Errorf("pool %s: %w", z.cfg.Pool, err)
	}
	ps, err := ParsePools(out)
	if err != nil {
		return Pool{}, err
	}
	if len(ps) != 1 || ps[0].Name != z.cfg.Pool {
		return Pool{}, fmt.Errorf("pool %s: zpool list returned %d rows: %w", z.cfg.Pool, len(ps), backend.ErrNotFound)
	}
	return ps[0], nil
}

// Ensure checks that the pool is imported and usable (health ONLINE or
// DEGRADED) and creates the parent dataset, with its parents, when missing
// (`zfs create -p`). Pools are the operator's: a missing pool is
// backend.ErrNotFound, never created. Idempotent.
func (z *ZFS) Ensure(ctx context.Context) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	p, err := z.Pool(ctx)
	if err != nil {
		return err
	}
	if p.Health != "ONLINE" && p.Health != "DEGRADED" {
		return fmt.Errorf("pool %s is %s", p.Name, p.Health)
	}
	if _, err := z.refresh(ctx); err == nil || !errors.Is(err, backend.ErrNotFound) {
		return err
	}
	if _, err := z.run(ctx, "zfs", "create", "-p", z.parent); err != nil {
		return fmt.Errorf("create parent dataset: %w", err)
	}
	return nil
}

// capacity derives the Store's capacity from one refresh, from ZFS's own
// accounting of the parent dataset (which honours redundancy, slop space,
// quotas and other datasets' reservations, unlike zpool's raw sizes):
// total = parent used + available; free = parent available (a thick zvol's
// refreservation is already subtracted); provisioned = Σ volsize of Plinth's
// zvols. Sparse: Thin, DataUsedRatio = used ÷ total.
func (z *ZFS) capacity(st state) backend.Capacity {
	c := backend.Capacity{
		TotalBytes:  st.parent.UsedBytes + st.parent.AvailableBytes,
		FreeBytes:   st.parent.AvailableBytes,
		Thin:        z.cfg.Sparse,
		ExtentBytes: z.cfg.VolBlockSize,
	}
	for _, d := range st.children {
		if z.managed(d) {
			c.ProvisionedBytes += d.VolSizeBytes
			c.SnapshotBytes += d.SnapshotBytes()
		}
	}
	if c.Thin && c.TotalBytes > 0 {
		c.DataUsedRatio = float64(st.parent.UsedBytes) / float64(c.TotalBytes)
	}
	return c
}

// managed: a Plinth zvol of this Store (a zvol carrying PropManaged, named by
// a volume id, directly under the parent).
func (z *ZFS) managed(d Dataset) bool {
	return d.IsVolume() && d.Managed == ManagedValue && strings.HasPrefix(d.Name, z.parent+"/") &&
		backend.ValidateVolumeID(strings.TrimPrefix(d.Name, z.parent+"/")) == nil
}

func (z *ZFS) devPath(dataset string) string { return filepath.Join(z.cfg.DevDir, dataset) }

func (z *ZFS) volume(d Dataset) backend.Volume {
	id := strings.TrimPrefix(d.Name, z.parent+"/")
	v := backend.Volume{ID: id, Name: d.Name, SizeBytes: d.VolSizeBytes, Thin: d.Sparse()}
	v.Stamp, v.StampErr = stampOf(d, id)
	if isBlockDevice(z.devPath(d.Name)) {
		v.DevicePath = z.devPath(d.Name)
	}
	return v
}

func isBlockDevice(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode()&os.ModeDevice != 0 && fi.Mode()&os.ModeCharDevice == 0
}

// Capacity reports the Store's capacity (one `zfs list`). Units bytes.
func (z *ZFS) Capacity(ctx context.Context) (backend.Capacity, error) {
	st, err := z.refresh(ctx)
	if err != nil {
		return backend.Capacity{}, err
	}
	return z.capacity(st), nil
}

// Observe returns the Store's capacity and Plinth's zvols (ordered by id) from ONE
// `zfs list`: the node agent's periodic refresh. backend.ErrNotFound when the parent
// dataset (or the pool) does not exist.
func (z *ZFS) Observe(ctx context.Context) (backend.Capacity, []backend.Volume, error) {
	st, err := z.refresh(ctx)
	if err != nil {
		return backend.Capacity{}, nil, err
	}
	return z.capacity(st), z.listed(st.children), nil
}

// List returns Plinth's zvols under the parent dataset, ordered by id (one
// `zfs list`).
func (z *ZFS) List(ctx context.Context) ([]backend.Volume, error) {
	st, err := z.refresh(ctx)
	if err != nil {
		return nil, err
	}
	return z.listed(st.children), nil
}

// listed: Plinth's zvols among ds, ordered by id.
func (z *ZFS) listed(ds []Dataset) []backend.Volume {
	var out []backend.Volume
	for _, d := range ds {
		if z.managed(d) {
			out = append(out, z.volume(d))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// find refreshes and looks the zvol up; backend.ErrNotFound when absent or
// not Plinth's.
func (z *ZFS) find(ctx context.Context, id string) (state, Dataset, error) {
	name, err := ZvolName(z.cfg.Pool, z.cfg.ParentDataset, id)
	if err != nil {
		return state{}, Dataset{}, err
	}
	st, err := z.refresh(ctx)
	if err != nil {
		return st, Dataset{}, err
	}
	d, ok := st.child(name)
	if !ok || !z.managed(d) {
		return st, Dataset{}, fmt.Errorf("volume %s in %s: %w", id, z.parent, backend.ErrNotFound)
	}
	return st, d, nil
}

// Get returns one volume (one `zfs list`).
func (z *ZFS) Get(ctx context.Context, id string) (backend.Volume, error) {
	_, d, err := z.find(ctx, id)
	if err != nil {
		return backend.Volume{}, err
	}
	return z.volume(d), nil
}

// DevicePath returns /dev/zvol/<dataset> once it is a block device. udev
// makes that link asynchronously after `zfs create` (60-zvol.rules runs
// zvol_id on /dev/zdN), so DevicePath waits up to Config.LinkTimeout, as
// zvol_wait does; a link still missing then is an error naming the path.
func (z *ZFS) DevicePath(ctx context.Context, id string) (string, error) {
	_, d, err := z.find(ctx, id)
	if err != nil {
		return "", err
	}
	p := z.devPath(d.Name)
	deadline := time.Now().Add(z.cfg.LinkTimeout)
	for !isBlockDevice(p) {
		if time.Now().After(deadline) {
			return "", fmt.Errorf("volume %s: %s did not appear within %s (udev and its 60-zvol.rules running?)", id, p, z.cfg.LinkTimeout)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
	return p, nil
}

// Create makes a zvol named ZvolName(id) of sizeBytes rounded UP to a
// multiple of the volblocksize (4000000000 B with 16K → 4000006144 B),
// with the volblocksize, PropManaged and the policy's properties, sparse
// (-s) when Config.Sparse, after checking Capacity.Available with the
// reserve. A zvol of that name carrying PropManaged is adopted (crash
// between create and status). See backend.Backend.Create for idempotency and
// errors. The caller honours a CSI limit_bytes by rounding with
// Capacity().ExtentBytes before calling.
func (z *ZFS) Create(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
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
			return backend.Volume{}, fmt.Errorf("dataset %s exists but is not a Plinth zvol (no %s=%s): %w", name, PropManaged, ManagedValue, backend.ErrAlreadyExists)
		}
		if d.VolSizeBytes < size {
			return backend.Volume{}, fmt.Errorf("volume %s exists with %d bytes, %d requested: %w", id, d.VolSizeBytes, size, backend.ErrAlreadyExists)
		}
		return z.volume(d), nil
	}
	if avail := z.capacity(st).Available(z.cfg.ReserveBytes, z.cfg.OvercommitPercent); size > avail {
		return backend.Volume{}, fmt.Errorf("volume %s: %d bytes requested, %d available: %w", id, size, avail, backend.ErrInsufficientCapacity)
	}
	args := []string{"create", "-V", strconv.FormatInt(size, 10), "-b", strconv.FormatInt(z.cfg.VolBlockSize, 10)}
	if z.cfg.Sparse {
		args = append(args, "-s")
	}
	args = append(args, "-o", PropManaged+"="+ManagedValue)
	for _, p := range z.props {
		args = append(args, "-o", p)
	}
	if _, err := z.run(ctx, "zfs", append(args, name)...); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return z.reread(ctx, id, name)
}

// reread reports the zvol as ZFS now sees it, with one `zfs list` of it.
func (z *ZFS) reread(ctx context.Context, id, name string) (backend.Volume, error) {
	out, err := z.run(ctx, "zfs", listArgs(name)...)
	if err != nil {
		return backend.Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	ds, err := ParseDatasets(out)
	if err != nil {
		return backend.Volume{}, err
	}
	if len(ds) != 1 || !z.managed(ds[0]) {
		return backend.Volume{}, fmt.Errorf("volume %s in %s: %w", id, z.parent, backend.ErrNotFound)
	}
	return z.volume(ds[0]), nil
}

// Expand sets volsize to sizeBytes rounded up to the volblocksize (the
// filesystem and an NVMe-oF namespace's revalidate_size are the callers'
// business). Never shrinks. ZFS applies volsize (and a thick zvol's
// refreservation with it) in one transaction: when it refuses (out of space),
// every property stays as it was and the error carries ZFS's message.
func (z *ZFS) Expand(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	st, d, err := z.find(ctx, id)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, z.cfg.VolBlockSize)
	if d.VolSizeBytes >= size {
		return z.volume(d), nil
	}
	if grow, avail := size-d.VolSizeBytes, z.capacity(st).Available(z.cfg.ReserveBytes, z.cfg.OvercommitPercent); grow > avail {
		return backend.Volume{}, fmt.Errorf("expand volume %s by %d bytes, %d available: %w", id, grow, avail, backend.ErrInsufficientCapacity)
	}
	if _, err := z.run(ctx, "zfs", "set", "volsize="+strconv.FormatInt(size, 10), d.Name); err != nil {
		return backend.Volume{}, fmt.Errorf("expand volume %s: %w", id, err)
	}
	return z.reread(ctx, id, d.Name)
}

// Delete destroys the zvol. An absent volume is success; a dataset of that
// name that is not Plinth's is left alone (also success: the volume is
// gone). ZFS refuses while the zvol is open — mounted, or exported through
// nvmet — and that is backend.ErrInUse with ZFS's message ("dataset is
// busy"); snapshots also block it (no -r: nothing is destroyed implicitly).
func (z *ZFS) Delete(ctx context.Context, id string) error {
	z.mu.Lock()
	defer z.mu.Unlock()
	_, d, err := z.find(ctx, id)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := z.releaseSnapshots(ctx, d.Name); err != nil { // snapshot.go
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	if _, err := z.run(ctx, "zfs", "destroy", d.Name); err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}
