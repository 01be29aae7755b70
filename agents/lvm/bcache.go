package lvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
)

// The bcache cache of an LVM backend (Carina's tiering): every volume is a backing LV in the
// backend's (slow) VG plus a cache LV of the same name in a second (fast) VG; make-bcache
// formats the pair, the kernel registers both (/sys/fs/bcache/register), the backing device
// is attached to the cache LV's cache set, its cache_mode is set, and the volume's block
// device is the /dev/bcacheN the kernel made for the backing device. The superblocks keep the
// pairing and the mode, so after a reboot registering both LVs again brings the same volume
// back; the backend finds its bcacheN through sysfs (/sys/dev/block/<major>:<minor>/bcache,
// Documentation/admin-guide/bcache.rst "SYSFS"), never from a remembered number.

// Cache modes a cache may be asked for: bcache's cache_mode values (bcache.rst).
const (
	// CacheModeWritethrough: writes go to the backing device and the cache before they
	// complete; reads are cached. bcache's default, and Plinth's.
	CacheModeWritethrough = "writethrough"
	// CacheModeWriteback: writes complete once in the cache and reach the backing device
	// later; losing the cache device loses those writes.
	CacheModeWriteback = "writeback"
	// CacheModeWritearound: writes bypass the cache; reads are cached.
	CacheModeWritearound = "writearound"
)

// TagCache marks the cache LVs Plinth creates in the fast VG. They never carry TagManaged, so
// no Store lists them as volumes.
const TagCache = "plinth.dev/bcache-cache"

// CacheBucketBytes is the bucket size of the caches Plinth formats (make-bcache -b): smaller
// than make-bcache's 512 KiB default so that small caches have enough buckets.
const CacheBucketBytes = 128 << 10

// MinCacheBytes is the smallest cache LV: the kernel refuses a cache device of 512 buckets or
// fewer (cache_alloc: "ca->sb.nbuckets is too small", EPERM from /sys/fs/bcache/register), so
// 1024 buckets of CacheBucketBytes.
const MinCacheBytes = 1024 * CacheBucketBytes

// BackingOffsetBytes is where make-bcache puts the data of a backing device by default (16
// sectors): the bcache device is this much smaller than its backing LV, so the backing LV is
// made this much larger than the volume.
const BackingOffsetBytes = 8 << 10

// DefaultCacheRatioPercent is the cache size, in percent of the volume size, when
// CacheConfig.RatioPercent is 0.
const DefaultCacheRatioPercent = 10

// CacheConfig puts a bcache cache on a second VG in front of every volume.
type CacheConfig struct {
	// VolumeGroup is the fast VG that holds the cache LVs; it must differ from the
	// backend's VG.
	VolumeGroup string
	// Devices are the block devices the fast VG is created on when it does not exist; each
	// must be empty.
	Devices []string
	// Mode is CacheModeWritethrough (the default when ""), CacheModeWriteback or
	// CacheModeWritearound.
	Mode string
	// RatioPercent is the cache LV's size in percent of the backing LV's, 1..100 (0 means
	// DefaultCacheRatioPercent); a cache is never smaller than MinCacheBytes.
	RatioPercent int
}

// Kernel is the part of the running kernel the cache drives: sysfs, with paths relative to
// its root (normally /sys), and whether a block device is held.
type Kernel interface {
	// ReadFile returns a sysfs attribute, trimmed.
	ReadFile(p string) (string, error)
	// WriteFile writes value to a sysfs attribute.
	WriteFile(p, value string) error
	// Readlink returns the target of a sysfs link.
	Readlink(p string) (string, error)
	// Exists reports whether the sysfs path exists.
	Exists(p string) bool
	// Held reports whether the device node is held: an exclusive open fails with EBUSY
	// (mounted, or claimed by another driver).
	Held(dev string) (bool, error)
}

// SysKernel is the Kernel of this machine, with sysfs at Root ("" means /sys).
type SysKernel struct{ Root string }

func (k SysKernel) path(p string) string {
	root := k.Root
	if root == "" {
		root = "/sys"
	}
	return filepath.Join(root, p)
}

// ReadFile implements Kernel.
func (k SysKernel) ReadFile(p string) (string, error) {
	b, err := os.ReadFile(k.path(p))
	return strings.TrimSpace(string(b)), err
}

// WriteFile implements Kernel; sysfs takes a value in one write.
func (k SysKernel) WriteFile(p, value string) error {
	return os.WriteFile(k.path(p), []byte(value), 0o200)
}

// Readlink implements Kernel.
func (k SysKernel) Readlink(p string) (string, error) { return os.Readlink(k.path(p)) }

// Exists implements Kernel.
func (k SysKernel) Exists(p string) bool {
	_, err := os.Stat(k.path(p))
	return err == nil
}

// Held implements Kernel with an O_EXCL open of the device node (open(2): EBUSY when the
// block device is in use by the system, e.g. mounted).
func (k SysKernel) Held(dev string) (bool, error) {
	fd, err := syscall.Open(dev, syscall.O_RDONLY|syscall.O_EXCL|syscall.O_CLOEXEC, 0)
	if errors.Is(err, syscall.EBUSY) {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("open %s: %w", dev, err)
	}
	syscall.Close(fd)
	return false, nil
}

// cacheWait bounds the waits for the kernel's asynchronous bcache work (registration,
// stopping a device or a cache set).
const cacheWait = 30 * time.Second

func validateCache(vg, thinPool string, c *CacheConfig) error {
	if err := ValidateNames(c.VolumeGroup, ""); err != nil {
		return fmt.Errorf("cache: %w", err)
	}
	if c.VolumeGroup == vg {
		return fmt.Errorf("cache volume group %s is the volume group of the volumes: the cache needs its own (fast) VG: %w", vg, backend.ErrInvalidArgument)
	}
	if thinPool != "" {
		return fmt.Errorf("cache with thin pool %s: a cached volume's backing device is a linear LV: %w", thinPool, backend.ErrInvalidArgument)
	}
	switch c.Mode {
	case "":
		c.Mode = CacheModeWritethrough
	case CacheModeWritethrough, CacheModeWriteback, CacheModeWritearound:
	default:
		return fmt.Errorf("cache mode %q: want writethrough, writeback or writearound: %w", c.Mode, backend.ErrInvalidArgument)
	}
	if c.RatioPercent == 0 {
		c.RatioPercent = DefaultCacheRatioPercent
	}
	if c.RatioPercent < 1 || c.RatioPercent > 100 {
		return fmt.Errorf("cache ratio %d%%: want 1..100: %w", c.RatioPercent, backend.ErrInvalidArgument)
	}
	return nil
}

// cacheAvailable fails with backend.ErrMissingKernelModule when the kernel has no bcache
// (no /sys/fs/bcache: the module is neither loaded nor built in).
func (l *LVM) cacheAvailable() error {
	if !l.cfg.Kernel.Exists("fs/bcache") {
		return fmt.Errorf("pool asks for a bcache cache but the kernel has no bcache (/sys/fs/bcache missing: load the bcache module, CONFIG_BCACHE): %w", backend.ErrMissingKernelModule)
	}
	return nil
}

// cacheLV looks the volume's cache LV up in a refresh of the fast VG.
func cacheLV(fast state, name string) (LV, bool) {
	lv, ok := fast.lv(name)
	if !ok || !lv.HasTag(TagCache) {
		return LV{}, false
	}
	return lv, true
}

// addCacheCapacity adds the fast VG to c.
func (l *LVM) addCacheCapacity(c *backend.Capacity, fast state) {
	c.CacheRatioPercent = int64(l.cfg.Cache.RatioPercent)
	c.CacheMinBytes = backend.RoundUp(MinCacheBytes, fast.vg.ExtentBytes)
	c.CacheTotalBytes, c.CacheFreeBytes = fast.vg.SizeBytes, fast.vg.FreeBytes
	for _, lv := range fast.lvs {
		if lv.HasTag(TagCache) {
			c.CacheProvisionedBytes += lv.SizeBytes
		}
	}
}

func sysDev(lv LV) string { return fmt.Sprintf("dev/block/%d:%d", lv.KernelMajor, lv.KernelMinor) }

// bcacheDevice is the /dev/bcacheN of an active backing LV when the kernel runs it attached to
// a cache set in the configured mode; ok is false otherwise (not registered, no cache, another
// mode): DevicePath then converges it.
func (l *LVM) bcacheDevice(lv LV) (string, bool) {
	if !lv.Active || lv.KernelMajor < 0 {
		return "", false
	}
	base := sysDev(lv) + "/bcache/"
	dev, err := l.cfg.Kernel.Readlink(base + "dev")
	if err != nil || !l.cfg.Kernel.Exists(base+"cache") {
		return "", false
	}
	mode, err := l.cfg.Kernel.ReadFile(base + "cache_mode")
	if err != nil || selected(mode) != l.cfg.Cache.Mode {
		return "", false
	}
	return "/dev/" + path.Base(dev), true
}

// selected returns the bracketed choice of a sysfs list attribute such as
// "writethrough [writeback] writearound none".
func selected(attr string) string {
	for _, f := range strings.Fields(attr) {
		if strings.HasPrefix(f, "[") && strings.HasSuffix(f, "]") {
			return strings.Trim(f, "[]")
		}
	}
	return ""
}

// waitKernel polls cond until it holds, ctx ends or cacheWait passes.
func waitKernel(ctx context.Context, what string, cond func() bool) error {
	ctx, cancel := context.WithTimeout(ctx, cacheWait)
	defer cancel()
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(20 * time.Millisecond):
		}
	}
	return nil
}

// lvOf reads one LV of vg (active state and device numbers after lvchange).
func (l *LVM) lvOf(ctx context.Context, vg, name string) (LV, error) {
	out, err := l.run(ctx, "lvs", append(append([]string{}, reportArgs...), "-o", lvFields, vg+"/"+name)...)
	if err != nil {
		return LV{}, fmt.Errorf("LV %s/%s: %w", vg, name, err)
	}
	lvs, err := ParseLVs(out)
	if err != nil {
		return LV{}, err
	}
	if len(lvs) != 1 {
		return LV{}, fmt.Errorf("LV %s/%s: lvs returned %d rows: %w", vg, name, len(lvs), backend.ErrNotFound)
	}
	return lvs[0], nil
}

// activate activates vg/lv when it is not and returns it as lvs now reports it.
func (l *LVM) activate(ctx context.Context, lv LV) (LV, error) {
	if lv.Active && lv.KernelMajor >= 0 {
		return lv, nil
	}
	if _, err := l.run(ctx, "lvchange", "-ay", lv.VG+"/"+lv.Name); err != nil {
		return LV{}, fmt.Errorf("activate %s/%s: %w", lv.VG, lv.Name, err)
	}
	return l.lvOf(ctx, lv.VG, lv.Name)
}

// signature returns the filesystem-level signature blkid finds on dev ("bcache", "ext4", ...),
// "" when there is none.
func (l *LVM) signature(ctx context.Context, dev string) (string, error) {
	out, err := l.run(ctx, "blkid", "-p", "-o", "value", "-s", "TYPE", dev)
	var ce *backend.CommandError
	if errors.As(err, &ce) && ce.ExitCode == 2 {
		return "", nil // nothing found
	}
	if err != nil {
		return "", fmt.Errorf("probe %s: %w", dev, err)
	}
	return strings.TrimSpace(string(out)), nil
}

// format makes dev a bcache backing device (-B) or cache device (-C) unless it is one
// already. A device with another signature is refused: it holds someone's data (a volume made
// before the pool had a cache is never converted).
func (l *LVM) format(ctx context.Context, flag, dev string) error {
	sig, err := l.signature(ctx, dev)
	switch {
	case err != nil:
		return err
	case sig == "bcache":
		return nil
	case sig != "":
		return fmt.Errorf("%s carries a %s signature, not bcache: not formatted (a volume made before its pool had a cache is not converted): %w", dev, sig, backend.ErrAlreadyExists)
	}
	// one block size for every backing and cache device: bcache attaches a backing device
	// only to a cache set whose block size is not larger than its own, and 4 KiB is at least
	// the logical block size of any disk (512 B or 4 KiB)
	args := []string{"-w", "4k"}
	if flag == "-C" {
		args = append(args, "-b", strconv.Itoa(CacheBucketBytes>>10)+"k")
	}
	if _, err := l.run(ctx, "make-bcache", append(args, flag, dev)...); err != nil {
		return fmt.Errorf("make-bcache %s %s: %w", flag, dev, err)
	}
	return nil
}

// register hands dev to the kernel's bcache unless sysfs shows it registered (base is its
// /sys/dev/block/<major>:<minor>); a concurrent registration (udev's bcache rule on a node)
// is no error.
func (l *LVM) register(ctx context.Context, dev, base, ready string) error {
	if l.cfg.Kernel.Exists(base + "/bcache") {
		return nil
	}
	if err := l.cfg.Kernel.WriteFile("fs/bcache/register", dev); err != nil && !l.cfg.Kernel.Exists(base+"/bcache") {
		return fmt.Errorf("register %s with bcache: %w", dev, err)
	}
	return waitKernel(ctx, "bcache registration of "+dev, func() bool { return l.cfg.Kernel.Exists(base + "/bcache/" + ready) })
}

// converge brings a volume's backing and cache LVs to a running, attached bcache device in the
// configured mode and returns its /dev/bcacheN: LVs activated, formatted when they carry no
// signature yet, registered (cache first, so a backing device with dirty data finds its cache),
// attached to the cache LV's cache set, cache_mode written (bcache keeps it in the backing
// superblock). Idempotent; what is in place is read from sysfs, so it also re-finds the
// device after an agent restart or a reboot.
func (l *LVM) converge(ctx context.Context, backing, cache LV) (string, error) {
	backing, err := l.activate(ctx, backing)
	if err != nil {
		return "", err
	}
	if cache, err = l.activate(ctx, cache); err != nil {
		return "", err
	}
	bdev, cdev := l.devPath(backing.Name), "/dev/"+cache.VG+"/"+cache.Name
	base, cbase := sysDev(backing), sysDev(cache)
	k := l.cfg.Kernel
	if !k.Exists(cbase + "/bcache") {
		if err := l.format(ctx, "-C", cdev); err != nil {
			return "", err
		}
		if err := l.register(ctx, cdev, cbase, "set"); err != nil {
			return "", err
		}
	}
	set, err := k.Readlink(cbase + "/bcache/set")
	if err != nil {
		return "", fmt.Errorf("cache set of %s: %w", cdev, err)
	}
	uuid := path.Base(set)
	if !k.Exists(base + "/bcache") {
		if err := l.format(ctx, "-B", bdev); err != nil {
			return "", err
		}
		if err := l.register(ctx, bdev, base, "dev"); err != nil {
			return "", err
		}
	}
	if cur, err := k.Readlink(base + "/bcache/cache"); err != nil {
		if err := k.WriteFile(base+"/bcache/attach", uuid); err != nil {
			return "", fmt.Errorf("attach %s to cache set %s: %w", bdev, uuid, err)
		}
		if !k.Exists(base + "/bcache/cache") {
			return "", fmt.Errorf("attach %s to cache set %s: not attached after the write", bdev, uuid)
		}
	} else if path.Base(cur) != uuid {
		return "", fmt.Errorf("%s is attached to cache set %s, not to its cache LV's %s: %w", bdev, path.Base(cur), uuid, backend.ErrAlreadyExists)
	}
	mode, err := k.ReadFile(base + "/bcache/cache_mode")
	if err != nil {
		return "", fmt.Errorf("cache mode of %s: %w", bdev, err)
	}
	if selected(mode) != l.cfg.Cache.Mode {
		if err := k.WriteFile(base+"/bcache/cache_mode", l.cfg.Cache.Mode); err != nil {
			return "", fmt.Errorf("set cache mode %s on %s: %w", l.cfg.Cache.Mode, bdev, err)
		}
	}
	dev, ok := l.bcacheDevice(backing)
	if !ok {
		return "", fmt.Errorf("%s: no running bcache device in mode %s after registration", bdev, l.cfg.Cache.Mode)
	}
	return dev, nil
}

// cachedVolume is a backing LV as a volume: the bcache device is BackingOffsetBytes smaller.
func (l *LVM) cachedVolume(lv LV) backend.Volume {
	v := backend.Volume{ID: lv.Name, Name: lv.Name, SizeBytes: lv.SizeBytes - BackingOffsetBytes}
	v.DevicePath, _ = l.bcacheDevice(lv)
	v.Stamp, v.StampErr = stampOf(lv)
	return v
}

// cachedFind refreshes both VGs and returns the volume's backing LV and cache LV (each may be
// absent: ok false).
func (l *LVM) cachedFind(ctx context.Context, id string) (st, fast state, backing LV, hasBacking bool, cache LV, hasCache bool, err error) {
	name, err := LVName(l.cfg.VolumeGroup, id)
	if err != nil {
		return
	}
	if st, err = l.refresh(ctx); err != nil {
		return
	}
	if fast, err = l.fast.refresh(ctx); err != nil {
		err = fmt.Errorf("cache: %w", err)
		return
	}
	backing, hasBacking = st.lv(name)
	hasBacking = hasBacking && l.managed(backing)
	cache, hasCache = cacheLV(fast, name)
	return
}

// createCached makes (or adopts) a cached volume: a backing LV of sizeBytes +
// BackingOffsetBytes in the VG and a cache LV of the ratio in the fast VG, both rounded up to
// their VG's extent, then converges them (see converge).
func (l *LVM) createCached(ctx context.Context, id string, sizeBytes int64) (backend.Volume, error) {
	st, fast, backing, hasBacking, cache, hasCache, err := l.cachedFind(ctx, id)
	if err != nil {
		return backend.Volume{}, err
	}
	name := id
	size := backend.RoundUp(sizeBytes+BackingOffsetBytes, st.vg.ExtentBytes)
	if lv, ok := st.lv(name); ok && !hasBacking {
		return backend.Volume{}, fmt.Errorf("LV %s/%s exists but is not a Plinth volume of this store: %w", l.cfg.VolumeGroup, name, backend.ErrAlreadyExists)
	} else if ok && lv.SizeBytes < size {
		return backend.Volume{}, fmt.Errorf("volume %s exists with %d bytes, %d requested: %w", id, lv.SizeBytes-BackingOffsetBytes, sizeBytes, backend.ErrAlreadyExists)
	}
	if _, ok := fast.lv(name); ok && !hasCache {
		return backend.Volume{}, fmt.Errorf("LV %s/%s exists but is not a Plinth cache: %w", l.cfg.Cache.VolumeGroup, name, backend.ErrAlreadyExists)
	}
	c, err := l.capacity(st)
	if err != nil {
		return backend.Volume{}, err
	}
	l.addCacheCapacity(&c, fast)
	cacheSize := backend.RoundUp(c.CacheBytes(size), fast.vg.ExtentBytes)
	if !hasBacking {
		if avail := c.FreeBytes - max(l.cfg.ReserveBytes, 0); size > avail {
			return backend.Volume{}, fmt.Errorf("volume %s: %d bytes requested, %d available: %w", id, size, avail, backend.ErrInsufficientCapacity)
		}
	}
	if !hasCache && cacheSize > c.CacheFreeBytes {
		return backend.Volume{}, fmt.Errorf("volume %s: cache of %d bytes, %d free in cache volume group %s: %w", id, cacheSize, c.CacheFreeBytes, l.cfg.Cache.VolumeGroup, backend.ErrInsufficientCapacity)
	}
	if !hasBacking {
		if _, err := l.run(ctx, "lvcreate", "-y", "-n", name, "--addtag", TagManaged, "-Wy", "-Zy", "-L", sizeArg(size), l.cfg.VolumeGroup); err != nil {
			return backend.Volume{}, fmt.Errorf("create volume %s: %w", id, err)
		}
		if backing, err = l.lvOf(ctx, l.cfg.VolumeGroup, name); err != nil {
			return backend.Volume{}, err
		}
	}
	if !hasCache {
		if _, err := l.run(ctx, "lvcreate", "-y", "-n", name, "--addtag", TagCache, "-Wy", "-Zy", "-L", sizeArg(cacheSize), l.cfg.Cache.VolumeGroup); err != nil {
			return backend.Volume{}, fmt.Errorf("create cache of volume %s: %w", id, err)
		}
		if cache, err = l.lvOf(ctx, l.cfg.Cache.VolumeGroup, name); err != nil {
			return backend.Volume{}, err
		}
	}
	dev, err := l.converge(ctx, backing, cache)
	if err != nil {
		return backend.Volume{}, fmt.Errorf("volume %s: %w", id, err)
	}
	if backing, err = l.lvOf(ctx, l.cfg.VolumeGroup, name); err != nil {
		return backend.Volume{}, err
	}
	v := l.cachedVolume(backing)
	v.DevicePath = dev
	return v, nil
}

// cachedDevicePath converges the volume (see converge) and returns its /dev/bcacheN. A backing
// LV without its cache LV is an error (never served uncached); backend.ErrNotFound only when
// the backing LV is absent.
func (l *LVM) cachedDevicePath(ctx context.Context, id string) (string, error) {
	_, _, backing, hasBacking, cache, hasCache, err := l.cachedFind(ctx, id)
	if err != nil {
		return "", err
	}
	if !hasBacking {
		return "", fmt.Errorf("volume %s in %s: %w", id, l.cfg.VolumeGroup, backend.ErrNotFound)
	}
	if dev, ok := l.bcacheDevice(backing); ok {
		return dev, nil
	}
	if !hasCache {
		// not ErrNotFound: the volume exists (a plain LV from before the pool had a cache, or its
		// cache LV was removed), it is only never served uncached
		return "", fmt.Errorf("volume %s: its cache LV %s/%s is missing; the volume is not served without its cache", id, l.cfg.Cache.VolumeGroup, id)
	}
	dev, err := l.converge(ctx, backing, cache)
	if err != nil {
		return "", fmt.Errorf("volume %s: %w", id, err)
	}
	return dev, nil
}

// deleteCached stops the volume's bcache device (refused with backend.ErrInUse while it is
// held, e.g. mounted), stops its cache set, wipes both LVs' signatures and removes them. It
// leaves no registered bcache device; an absent volume (or half of one) is success.
func (l *LVM) deleteCached(ctx context.Context, id string) error {
	name, err := LVName(l.cfg.VolumeGroup, id)
	if err != nil {
		return err
	}
	var backing, cache LV
	var hasBacking, hasCache bool
	// either VG may be gone (and the half of the volume in it): the other half is still removed
	if st, err := l.refresh(ctx); err == nil {
		backing, hasBacking = st.lv(name)
		hasBacking = hasBacking && l.managed(backing)
	} else if !errors.Is(err, backend.ErrNotFound) {
		return err
	}
	if fast, err := l.fast.refresh(ctx); err == nil {
		cache, hasCache = cacheLV(fast, name)
	} else if !errors.Is(err, backend.ErrNotFound) {
		return fmt.Errorf("cache: %w", err)
	}
	k := l.cfg.Kernel
	if hasBacking && backing.Active && backing.KernelMajor >= 0 {
		base := sysDev(backing) + "/bcache"
		if dev, err := k.Readlink(base + "/dev"); err == nil {
			node := "/dev/" + path.Base(dev)
			held, err := k.Held(node)
			if err != nil {
				return fmt.Errorf("delete volume %s: %w", id, err)
			}
			if held {
				return fmt.Errorf("delete volume %s: %s is held (mounted or claimed): %w", id, node, backend.ErrInUse)
			}
		}
		if k.Exists(base) {
			if err := k.WriteFile(base+"/stop", "1"); err != nil {
				return fmt.Errorf("delete volume %s: stop bcache device: %w", id, err)
			}
			if err := waitKernel(ctx, "bcache device of "+id+" to stop", func() bool { return !k.Exists(base) }); err != nil {
				return err
			}
		}
		if _, err := l.run(ctx, "wipefs", "-a", l.devPath(backing.Name)); err != nil {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	if hasCache && cache.Active && cache.KernelMajor >= 0 {
		base := sysDev(cache) + "/bcache"
		if set, err := k.Readlink(base + "/set"); err == nil {
			setDir := "fs/bcache/" + path.Base(set)
			if err := k.WriteFile(setDir+"/stop", "1"); err != nil {
				return fmt.Errorf("delete volume %s: stop cache set %s: %w", id, path.Base(set), err)
			}
		}
		if err := waitKernel(ctx, "cache set of "+id+" to stop", func() bool { return !k.Exists(base) }); err != nil {
			return err
		}
		if _, err := l.run(ctx, "wipefs", "-a", "/dev/"+cache.VG+"/"+cache.Name); err != nil {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	if hasBacking {
		if _, err := l.run(ctx, "lvremove", "-y", l.cfg.VolumeGroup+"/"+backing.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			return fmt.Errorf("delete volume %s: %w", id, err)
		}
	}
	if hasCache {
		if _, err := l.run(ctx, "lvremove", "-y", cache.VG+"/"+cache.Name); err != nil && !errors.Is(err, backend.ErrNotFound) {
			return fmt.Errorf("delete cache of volume %s: %w", id, err)
		}
	}
	return nil
}
