package lvm

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/utils/clock"

	"github.com/plinth-storage/plinth/agents/backend"
)

// TagManaged marks every LV Plinth creates (lvm tags allow '/' and '.').
const TagManaged = "plinth.dev/managed"

// DefaultResyncInterval is the longest an idle VG's kept report is served (Config.ResyncInterval).
const DefaultResyncInterval = 5 * time.Minute

// DefaultThinPoolSizePercent is the share of the VG a new thin pool takes
// when Config.ThinPoolSizePercent is 0.
const DefaultThinPoolSizePercent = 90

// Config binds an LVM backend to one Store: a StoragePool's lvm backend
// resolved for one node.
type Config struct {
	// VolumeGroup is the VG name.
	VolumeGroup string
	// Devices are the block devices the VG is created on when it does not
	// exist; each must be empty (no signature of any kind).
	Devices []string
	// ThinPool, when set, makes volumes thin LVs in this pool (created with
	// ThinPoolSizePercent of the VG); when empty volumes are linear LVs.
	ThinPool string
	// ThinPoolSizePercent is the pool's share of the VG at creation, 1..100
	// (0 means DefaultThinPoolSizePercent).
	ThinPoolSizePercent int
	// ReserveBytes is headroom never provisioned, also refused on create.
	ReserveBytes int64
	// OvercommitPercent is max provisioned ÷ physical × 100 for thin pools
	// (0 means 100).
	OvercommitPercent int64
	// Cache, when set, puts a bcache cache LV in a second (fast) VG in front of every
	// volume (see CacheConfig); volumes are then linear (no ThinPool).
	Cache *CacheConfig
	// Kernel is the sysfs the cache drives; nil means SysKernel{} (/sys). Tests substitute it.
	Kernel Kernel
	// Run runs an external command; nil means os/exec. Tests substitute it.
	Run Runner
	// ResyncInterval bounds how long Observe, Capacity, List, Get and DevicePath serve the
	// kept vgs + lvs report of an idle VG (0 means DefaultResyncInterval; < 0 keeps nothing:
	// every call runs vgs + lvs). The report is read again after any command of this backend
	// other than a report (its own writes), when device-mapper shows a change in the VG (an
	// active LV created, removed, activated, deactivated or renamed; a thin LV created or
	// deleted, active or not; the thin pool's mode), and once it is ResyncInterval old: a
	// change device-mapper does not show (tags, an inactive linear LV, a resize) made by
	// someone else shows up within ResyncInterval. Between reports the thin pool's usage comes
	// from device-mapper without a flush: metadata use may then include the blocks of a
	// transaction the kernel has not committed yet (it does within a second; lvs commits first).
	// Without a readable device-mapper every call runs vgs + lvs.
	ResyncInterval time.Duration
	// DeviceMapper is read to tell whether the kept report still holds; nil means
	// SysDeviceMapper{}. Tests substitute it.
	DeviceMapper DeviceMapper
	// Clock ages the kept report; nil means the real clock. Tests substitute it.
	Clock clock.PassiveClock
	// OnCommand, when set, is called after every command with its program
	// name, arguments, duration and error (for metrics such as
	// plinth_agent_backend_commands_total, and per-command timings in tests).
	OnCommand func(name string, args []string, d time.Duration, err error)
}

// Runner runs an external command (backend.Runner).
type Runner = backend.Runner

// ExecRunner runs commands with os/exec, in the C locale so messages are
// stable.
func ExecRunner(ctx context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	return execRunner(ctx, name, args...)
}

var execRunner = backend.ExecRunner("LVM_SUPPRESS_FD_WARNINGS=1")

// LVM is the backend of one VG (and optional thin pool). Safe for concurrent
// use: mutations are serialised.
type LVM struct {
	cfg Config
	mu  sync.Mutex
	// fast is the backend of the cache's VG when Config.Cache is set (its LVs are caches,
	// never volumes).
	fast *LVM
	// writes counts the commands this backend ran other than reports: a report kept from
	// before the last of them is never served.
	writes atomic.Uint64
	kept   keptReport
}

// keptReport is the last vgs + lvs pair and what device-mapper and the write count were just
// before it ran.
type keptReport struct {
	mu     sync.Mutex // held across a re-read: concurrent callers share one
	ok     bool
	st     state
	writes uint64
	dm     string
	at     time.Time
}

var _ backend.Backend = (*LVM)(nil)

// New validates cfg and returns the backend. It runs no command; call Ensure
// before use on a node.
func New(cfg Config) (*LVM, error) {
	if err := ValidateNames(cfg.VolumeGroup, ""); err != nil {
		return nil, err
	}
	if cfg.ThinPool != "" {
		if err := ValidateNames(cfg.VolumeGroup, cfg.ThinPool); err != nil {
			return nil, fmt.Errorf("thin pool: %w", err)
		}
	}
	if cfg.ThinPoolSizePercent == 0 {
		cfg.ThinPoolSizePercent = DefaultThinPoolSizePercent
	}
	if cfg.ThinPoolSizePercent < 1 || cfg.ThinPoolSizePercent > 100 {
		return nil, fmt.Errorf("thin pool size %d%%: want 1..100: %w", cfg.ThinPoolSizePercent, backend.ErrInvalidArgument)
	}
	if cfg.Run == nil {
		cfg.Run = ExecRunner
	}
	if cfg.Kernel == nil {
		cfg.Kernel = SysKernel{}
	}
	if cfg.ResyncInterval == 0 {
		cfg.ResyncInterval = DefaultResyncInterval
	}
	if cfg.DeviceMapper == nil {
		cfg.DeviceMapper = SysDeviceMapper{}
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.RealClock{}
	}
	l := &LVM{cfg: cfg}
	if cfg.Cache != nil {
		c := *cfg.Cache
		if err := validateCache(cfg.VolumeGroup, cfg.ThinPool, &c); err != nil {
			return nil, err
		}
		l.cfg.Cache = &c
		l.fast = &LVM{cfg: Config{VolumeGroup: c.VolumeGroup, Devices: c.Devices, Run: cfg.Run, OnCommand: cfg.OnCommand, Kernel: cfg.Kernel, ThinPoolSizePercent: DefaultThinPoolSizePercent,
			ResyncInterval: cfg.ResyncInterval, DeviceMapper: cfg.DeviceMapper, Clock: cfg.Clock}}
	}
	return l, nil
}

// run runs an lvm2 (or blkid/wipefs) command. Non-zero exit → CommandError
// classified by its stderr; stderr of a successful command (warnings such as
// thin over-provisioning) is logged at V(1). Any command but vgs and lvs counts as a write
// (failed or not): the kept report is read again.
func (l *LVM) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	out, err := backend.Commands{Run: l.cfg.Run, Classify: classify, OnCommand: l.cfg.OnCommand, Label: "lvm"}.Exec(ctx, name, args...)
	if name != "vgs" && name != "lvs" {
		l.writes.Add(1)
	}
	return out, err
}

// quoted matches the names lvm2 quotes in its messages (Volume group "vg-busy" not found), so
// that words inside a VG or LV name never decide the error's kind.
var quoted = regexp.MustCompile(`"[^"]*"`)

// classify maps lvm2 messages (LC_ALL=C) to the typed errors.
func classify(stderr string) error {
	s := strings.ToLower(quoted.ReplaceAllString(stderr, `""`))
	switch {
	case strings.Contains(s, "insufficient free space"), strings.Contains(s, "insufficient suitable"),
		strings.Contains(s, "not enough free space"), strings.Contains(s, "has insufficient"):
		return backend.ErrInsufficientCapacity
	case strings.Contains(s, "in use"), strings.Contains(s, "is open"), strings.Contains(s, "busy"):
		return backend.ErrInUse
	case strings.Contains(s, "already exists"):
		return backend.ErrAlreadyExists
	case strings.Contains(s, "not found"), strings.Contains(s, "failed to find"):
		return backend.ErrNotFound
	}
	return nil
}

var reportArgs = []string{"--reportformat", "json", "--units", "b", "--nosuffix"}

// state is one refresh: the VG row and the LVs of the VG.
type state struct {
	vg  VG
	lvs []LV
}

func (s state) lv(name string) (LV, bool) {
	for _, lv := range s.lvs {
		if lv.Name == name {
			return lv, true
		}
	}
	return LV{}, false
}

// refresh is the one vgs + lvs pair per observation. backend.ErrNotFound
// when the VG does not exist.
func (l *LVM) refresh(ctx context.Context) (state, error) {
	out, err := l.run(ctx, "vgs", append(append([]string{}, reportArgs...), "-o", vgFields, l.cfg.VolumeGroup)...)
	if err != nil {
		return state{}, fmt.Errorf("volume group %s: %w", l.cfg.VolumeGroup, err)
	}
	vgs, err := ParseVGs(out)
	if err != nil {
		return state{}, err
	}
	if len(vgs) != 1 {
		return state{}, fmt.Errorf("volume group %s: vgs returned %d rows: %w", l.cfg.VolumeGroup, len(vgs), backend.ErrNotFound)
	}
	out, err = l.run(ctx, "lvs", append(append([]string{}, reportArgs...), "-o", lvFields, l.cfg.VolumeGroup)...)
	if err != nil {
		return state{}, fmt.Errorf("volume group %s: %w", l.cfg.VolumeGroup, err)
	}
	lvs, err := ParseLVs(out)
	if err != nil {
		return state{}, err
	}
	return state{vg: vgs[0], lvs: lvs}, nil
}

// observed is the kept report while it holds (see Config.ResyncInterval), with the thin
// pool's usage as device-mapper shows it now; else a new vgs + lvs pair, kept.
func (l *LVM) observed(ctx context.Context) (state, error) {
	if l.cfg.ResyncInterval < 0 {
		return l.refresh(ctx)
	}
	k := &l.kept
	k.mu.Lock()
	defer k.mu.Unlock()
	// read before the report: a change after this is seen at the next call
	writes := l.writes.Load()
	dm, dmErr := l.dmView()
	now := l.cfg.Clock.Now()
	if k.ok && dmErr == nil && k.writes == writes && k.dm == dm.signature && now.Sub(k.at) < l.cfg.ResyncInterval {
		return k.st.withPool(l.cfg.ThinPool, dm.pool), nil
	}
	st, err := l.refresh(ctx)
	k.ok = err == nil && dmErr == nil
	k.st, k.writes, k.dm, k.at = st, writes, dm.signature, now
	return st, err
}

// withPool returns s with the thin pool's data and metadata use taken from its device-mapper
// status (the same ratios lvs reports); s itself is not changed.
func (s state) withPool(pool string, dm *thinPoolStatus) state {
	if pool == "" || dm == nil || dm.totalData == 0 {
		return s
	}
	lvs := append([]LV(nil), s.lvs...)
	for i := range lvs {
		if lvs[i].Name == pool && lvs[i].IsThinPool() {
			lvs[i].DataPercent, lvs[i].MetadataPercent = dm.dataPercent, dm.metaPercent
		}
	}
	return state{vg: s.vg, lvs: lvs}
}

// CheckEmpty returns backend.ErrDeviceNotEmpty when device carries any
// signature (filesystem, partition table, LVM or RAID label, ...) that
// `blkid -p` (low-level probe, no cache) or `wipefs -n` reports.
func (l *LVM) CheckEmpty(ctx context.Context, device string) error {
	out, err := l.run(ctx, "blkid", "-p", device)
	var ce *backend.CommandError
	switch {
	case err == nil:
		return fmt.Errorf("device %s: %s: %w", device, strings.TrimSpace(string(out)), backend.ErrDeviceNotEmpty)
	case errors.As(err, &ce) && ce.ExitCode == 2:
		// blkid: exit 2 = nothing found
	default:
		return fmt.Errorf("device %s: %w", device, err)
	}
	out, err = l.run(ctx, "wipefs", "-n", "--noheadings", device)
	if err != nil {
		return fmt.Errorf("device %s: %w", device, err)
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		return fmt.Errorf("device %s: wipefs: %s: %w", device, s, backend.ErrDeviceNotEmpty)
	}
	return nil
}

// Ensure brings the node to the configured state: when the VG exists it is
// activated (`vgchange -ay`: after a reboot without udev/lvm autoactivation
// LVs are inactive); when it does not, it is created on Config.Devices,
// each of which must be empty (CheckEmpty) — a device with any signature is
// refused with backend.ErrDeviceNotEmpty and nothing is written. Then the
// thin pool is created when configured and missing. With a cache, the kernel must have
// bcache (else backend.ErrMissingKernelModule, before any command) and the fast VG is ensured
// the same way on its own devices. Idempotent.
func (l *LVM) Ensure(ctx context.Context) error {
	if l.fast != nil {
		if err := l.cacheAvailable(); err != nil {
			return err
		}
		if err := l.fast.Ensure(ctx); err != nil {
			return fmt.Errorf("cache volume group: %w", err)
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, err := l.refresh(ctx)
	switch {
	case err == nil:
		if _, err := l.run(ctx, "vgchange", "-ay", l.cfg.VolumeGroup); err != nil {
			return fmt.Errorf("activate volume group: %w", err)
		}
	case errors.Is(err, backend.ErrNotFound):
		if len(l.cfg.Devices) == 0 {
			return fmt.Errorf("volume group %s does not exist and no devices are declared: %w", l.cfg.VolumeGroup, backend.ErrNotFound)
		}
		for _, d := range l.cfg.Devices {
			if err := l.CheckEmpty(ctx, d); err != nil {
				return err
			}
		}
		args := append([]string{"-y", l.cfg.VolumeGroup}, l.cfg.Devices...)
		if _, err := l.run(ctx, "vgcreate", args...); err != nil {
			return fmt.Errorf("create volume group: %w", err)
		}
		if st, err = l.refresh(ctx); err != nil {
			return err
		}
	default:
		return err
	}
	if l.cfg.ThinPool == "" {
		return nil
	}
	if pool, ok := st.lv(l.cfg.ThinPool); ok {
		if !pool.IsThinPool() {
			return fmt.Errorf("%s/%s is a %s LV, not a thin pool: %w", l.cfg.VolumeGroup, l.cfg.ThinPool, pool.Layout, backend.ErrAlreadyExists)
		}
		return nil
	}
	if _, err := l.run(ctx, "lvcreate", "-y", "-Zy", "--type", "thin-pool",
		"-l", strconv.Itoa(l.cfg.ThinPoolSizePercent)+"%VG", "-n", l.cfg.ThinPool, l.cfg.VolumeGroup); err != nil {
		return fmt.Errorf("create thin pool: %w", err)
	}
	return nil
}

// capacity derives the Store's capacity from one refresh. Linear: the VG.
// Thin: the pool — total = pool data size, free = data size × (1 − data%),
// never VG free (a pool filling the VG leaves VG free at 0).
func (l *LVM) capacity(st state) (backend.Capacity, error) {
	c := backend.Capacity{ExtentBytes: st.vg.ExtentBytes}
	for _, lv := range st.lvs {
		if l.managed(lv) {
			c.ProvisionedBytes += lv.SizeBytes
		}
		if l.cfg.ThinPool != "" && l.managedSnapshot(lv) {
			c.SnapshotBytes += mappedBytes(lv)
		}
	}
	if l.cfg.ThinPool == "" {
		c.TotalBytes, c.FreeBytes = st.vg.SizeBytes, st.vg.FreeBytes
		return c, nil
	}
	pool, ok := st.lv(l.cfg.ThinPool)
	if !ok || !pool.IsThinPool() {
		return c, fmt.Errorf("thin pool %s/%s: %w", l.cfg.VolumeGroup, l.cfg.ThinPool, backend.ErrNotFound)
	}
	c.Thin = true
	c.TotalBytes = pool.SizeBytes
	used := int64(float64(pool.SizeBytes) * pool.DataPercent / 100)
	c.FreeBytes = pool.SizeBytes - used
	c.DataUsedRatio = pool.DataPercent / 100
	c.MetadataUsedRatio = pool.MetadataPercent / 100
	return c, nil
}

// managed: Plinth's volume LV of this backend (tagged, named like a volume id,
// and of this backend's kind: thin in our pool, or not thin).
func (l *LVM) managed(lv LV) bool {
	if !lv.HasTag(TagManaged) || backend.ValidateVolumeID(lv.Name) != nil {
		return false
	}
	if l.cfg.ThinPool != "" {
		return lv.IsThin() && lv.Pool == l.cfg.ThinPool
	}
	return !lv.IsThin() && !lv.IsThinPool()
}

func (l *LVM) volume(lv LV) backend.Volume {
	if l.fast != nil {
		return l.cachedVolume(lv)
	}
	v := backend.Volume{ID: lv.Name, Name: lv.Name, SizeBytes: lv.SizeBytes, Thin: lv.IsThin()}
	if lv.Active {
		v.DevicePath = l.devPath(lv.Name)
	}
	v.Stamp, v.StampErr = stampOf(lv)
	return v
}

func (l *LVM) devPath(lv string) string { return "/dev/" + l.cfg.VolumeGroup + "/" + lv }

// Capacity reports the Store's capacity (one vgs + lvs pair, or the kept one: see
// Config.ResyncInterval; with a cache, a second pair for the fast VG, whose size and free
// bytes are the Cache* fields). Units bytes.
func (l *LVM) Capacity(ctx context.Context) (backend.Capacity, error) {
	st, err := l.observed(ctx)
	if err != nil {
		return backend.Capacity{}, err
	}
	c, err := l.capacity(st)
	if err != nil || l.fast == nil {
		return c, err
	}
	fast, err := l.fast.observed(ctx)
	if err != nil {
		return c, fmt.Errorf("cache: %w", err)
	}
	l.addCacheCapacity(&c, fast)
	return c, nil
}

// List returns Plinth's volumes of this VG (and pool), ordered by id.
func (l *LVM) List(ctx context.Context) ([]backend.Volume, error) {
	st, err := l.observed(ctx)
	if err != nil {
		return nil, err
	}
	var out []backend.Volume
	for _, lv := range st.lvs {
		if l.managed(lv) {
			out = append(out, l.volume(lv))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// Observe returns the Store's capacity and Plinth's volumes (ordered by id)
// from ONE vgs + lvs pair, or from the kept one while it holds (Config.ResyncInterval:
// then no command at all, one DM_LIST_DEVICES and, for a thin pool, one DM_TABLE_STATUS):
// the node agent's periodic refresh. A missing VG
// wraps backend.ErrNotFound; a missing thin pool returns the volumes with
// an error wrapping backend.ErrNotFound that names the thin pool.
func (l *LVM) Observe(ctx context.Context) (backend.Capacity, []backend.Volume, error) {
	st, err := l.observed(ctx)
	if err != nil {
		return backend.Capacity{}, nil, err
	}
	var vols []backend.Volume
	for _, lv := range st.lvs {
		if l.managed(lv) {
			vols = append(vols, l.volume(lv))
		}
	}
	sort.Slice(vols, func(i, j int) bool { return vols[i].ID < vols[j].ID })
	c, err := l.capacity(st)
	if err == nil && l.fast != nil {
		var fast state
		if fast, err = l.fast.observed(ctx); err != nil {
			return c, vols, fmt.Errorf("cache: %w", err)
		}
		l.addCacheCapacity(&c, fast)
	}
	return c, vols, err
}

// find refreshes and looks the volume up; backend.ErrNotFound when absent
// or not Plinth's. Writes use it: they decide on a new report.
func (l *LVM) find(ctx context.Context, id string) (state, LV, error) {
	return l.findIn(ctx, id, l.refresh)
}

// findIn looks the volume up in the report read returns (refresh, or observed for reads).
func (l *LVM) findIn(ctx context.Context, id string, read func(context.Context) (state, error)) (state, LV, error) {
	name, err := LVName(l.cfg.VolumeGroup, id)
	if err != nil {
		return state{}, LV{}, err
	}
	st, err := read(ctx)
	if err != nil {
		return st, LV{}, err
	}
	lv, ok := st.lv(name)
	if !ok || !l.managed(lv) {
		return st, LV{}, fmt.Errorf("volume %s in %s: %w", id, l.cfg.VolumeGroup, backend.ErrNotFound)
	}
	return st, lv, nil
}

// Get returns one volume (from the kept report while it holds: the VolumeStates of an agent
// that starts share one vgs + lvs pair).
func (l *LVM) Get(ctx context.Context, id string) (backend.Volume, error) {
	_, lv, err := l.findIn(ctx, id, l.observed)
	if err != nil {
		return backend.Volume{}, err
	}
	return l.volume(lv), nil
}

// DevicePath returns /dev/<vg>/<lv>, activating the LV first when inactive. With a cache it
// returns the volume's /dev/bcacheN, bringing the bcache device up when it is not running,
// attached and in the configured mode (after a reboot or an agent restart).
func (l *LVM) DevicePath(ctx context.Context, id string) (string, error) {
	if l.fast != nil {
		return l.cachedDevicePath(ctx, id)
	}
	_, lv, err := l.findIn(ctx, id, l.observed)
	if err != nil {
		return "", err
	}
	if !lv.Active {
		if _, err := l.run(ctx, "lvchange", "-ay", l.cfg.VolumeGroup+"/"+lv.Name); err != nil {
			return "", fmt.Errorf("activate %s: %w", id, err)
		}
	}
	return l.devPath(lv.Name), nil
}

func sizeArg(b int64) string { return strconv.FormatInt(b, 10) + "b" }

// Create makes a linear LV (or a thin LV when Config.ThinPool is set) named
// LVName(id), tagged TagManaged, of sizeBytes rounded up to the VG extent
// (never down), after checking Capacity.Available with the reserve.
// See backend.Backend.Create for idempotency and errors.
func (l *LVM) Create(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	name, err := LVName(l.cfg.VolumeGroup, id)
	if err != nil {
		return backend.Volume{}, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fast != nil {
		return l.createCached(ctx, name, sizeBytes)
	}
	st, err := l.refresh(ctx)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, st.vg.ExtentBytes)
	if lv, ok := st.lv(name); ok {
		if !l.managed(lv) {
			return backend.Volume{}, fmt.Errorf("LV %s/%s exists but is not a Plinth volume of this store: %w", l.cfg.VolumeGroup, name, backend.ErrAlreadyExists)
		}
		if lv.SizeBytes < size {
			return backend.Volume{}, fmt.Errorf("volume %s exists with %d bytes, %d requested: %w", id, lv.SizeBytes, size, backend.ErrAlreadyExists)
		}
		return l.volume(lv), nil // adopt (also after a crash between lvcreate and status)
	}
	c, err := l.capacity(st)
	if err != nil {
		return backend.Volume{}, err
	}
	if avail := c.Available(l.cfg.ReserveBytes, l.cfg.OvercommitPercent); size > avail {
		return backend.Volume{}, fmt.Errorf("volume %s: %d bytes requested, %d available: %w", id, size, avail, backend.ErrInsufficientCapacity)
	}
	args := []string{"-y", "-n", name, "--addtag", TagManaged}
	if l.cfg.ThinPool != "" {
		args = append(args, "-V", sizeArg(size), "--thinpool", l.cfg.ThinPool, l.cfg.VolumeGroup)
	} else {
		// -Wy -Zy: wipe signatures left by an earlier LV on the same extents.
		args = append(args, "-Wy", "-Zy", "-L", sizeArg(size), l.cfg.VolumeGroup)
	}
	if _, err := l.run(ctx, "lvcreate", args...); err != nil {
		return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
	}
	return l.reread(ctx, id)
}

// reread reports the volume as lvm now sees it (its real size), with one
// lvs of that LV only.
func (l *LVM) reread(ctx context.Context, id string) (backend.Volume, error) {
	out, err := l.run(ctx, "lvs", append(append([]string{}, reportArgs...), "-o", lvFields, l.cfg.VolumeGroup+"/"+id)...)
	if err != nil {
		return backend.Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	lvs, err := ParseLVs(out)
	if err != nil {
		return backend.Volume{}, err
	}
	if len(lvs) != 1 || !l.managed(lvs[0]) {
		return backend.Volume{}, fmt.Errorf("volume %s in %s: %w", id, l.cfg.VolumeGroup, backend.ErrNotFound)
	}
	return l.volume(lvs[0]), nil
}

// Expand grows the LV to sizeBytes rounded up to the extent (lvextend; the
// filesystem is the node plugin's business). Never shrinks.
func (l *LVM) Expand(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	if sizeBytes <= 0 {
		return backend.Volume{}, fmt.Errorf("size %d: %w", sizeBytes, backend.ErrInvalidArgument)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	st, lv, err := l.find(ctx, id)
	if err != nil {
		return backend.Volume{}, err
	}
	size := backend.RoundUp(sizeBytes, st.vg.ExtentBytes)
	if l.fast != nil {
		if lv.SizeBytes-BackingOffsetBytes >= sizeBytes {
			return l.volume(lv), nil
		}
		// bcache sizes its device from the backing device at registration only
		return backend.Volume{}, fmt.Errorf("volume %s has a bcache cache: a cached volume does not grow (%d bytes, %d requested): %w", id, lv.SizeBytes-BackingOffsetBytes, sizeBytes, backend.ErrOutOfRange)
	}
	if lv.SizeBytes >= size {
		return l.volume(lv), nil
	}
	c, err := l.capacity(st)
	if err != nil {
		return backend.Volume{}, err
	}
	if grow, avail := size-lv.SizeBytes, c.Available(l.cfg.ReserveBytes, l.cfg.OvercommitPercent); grow > avail {
		return backend.Volume{}, fmt.Errorf("expand volume %s by %d bytes, %d available: %w", id, grow, avail, backend.ErrInsufficientCapacity)
	}
	if _, err := l.run(ctx, "lvextend", "-L", sizeArg(size), l.cfg.VolumeGroup+"/"+lv.Name); err != nil {
		return backend.Volume{}, fmt.Errorf("expand volume %s: %w", id, err)
	}
	return l.reread(ctx, id)
}

// Delete removes the LV. An absent volume is success; an LV of the same name
// that is not Plinth's is left alone (also success: the volume is gone).
func (l *LVM) Delete(ctx context.Context, id string) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fast != nil {
		return l.deleteCached(ctx, id)
	}
	_, lv, err := l.find(ctx, id)
	if errors.Is(err, backend.ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if _, err := l.run(ctx, "lvremove", "-y", l.cfg.VolumeGroup+"/"+lv.Name); err != nil {
		if errors.Is(err, backend.ErrNotFound) {
			return nil
		}
		return fmt.Errorf("delete volume %s: %w", id, err)
	}
	return nil
}
