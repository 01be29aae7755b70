package lvm

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// fakeVGs stands in for lvm2, blkid, wipefs and make-bcache over several VGs, and fakeKernel
// for bcache's sysfs; the real commands and kernel run in TestGuestBcache.
type fakeVGs struct {
	vgs   map[string]*fakeVG
	sig   map[string]string // device path → blkid TYPE
	calls []string
	minor int
}

type fakeVG struct {
	size, extent int64
	lvs          []*fakeLV
}

type fakeLV struct {
	name, tag string
	size      int64
	active    bool
	minor     int
}

func newFakeVGs() *fakeVGs {
	return &fakeVGs{vgs: map[string]*fakeVG{
		"slow": {size: 100 * gib, extent: 4 * mib},
		"fast": {size: 10 * gib, extent: 4 * mib},
	}, sig: map[string]string{}}
}

func (f *fakeVGs) free(vg *fakeVG) int64 {
	free := vg.size
	for _, lv := range vg.lvs {
		free -= lv.size
	}
	return free
}

func (f *fakeVGs) lv(path string) (*fakeVG, *fakeLV) {
	vgName, name, _ := strings.Cut(strings.TrimPrefix(path, "/dev/"), "/")
	vg := f.vgs[vgName]
	if vg == nil {
		return nil, nil
	}
	for _, lv := range vg.lvs {
		if lv.name == name {
			return vg, lv
		}
	}
	return vg, nil
}

func (f *fakeVGs) run(_ context.Context, name string, args ...string) ([]byte, []byte, int, error) {
	f.calls = append(f.calls, name+" "+strings.Join(args, " "))
	last := args[len(args)-1]
	switch name {
	case "vgs":
		vg := f.vgs[last]
		if vg == nil {
			return nil, []byte(fmt.Sprintf("  Volume group %q not found", last)), 5, nil
		}
		return []byte(fmt.Sprintf(`{"report":[{"vg":[{"vg_name":%q,"vg_size":"%d","vg_free":"%d","vg_extent_size":"%d"}]}]}`, last, vg.size, f.free(vg), vg.extent)), nil, 0, nil
	case "lvs":
		vgName, only, _ := strings.Cut(last, "/")
		var rows []string
		for _, lv := range f.vgs[vgName].lvs {
			if only != "" && lv.name != only {
				continue
			}
			major, minor, act := -1, -1, ""
			if lv.active {
				major, minor, act = 253, lv.minor, "active"
			}
			rows = append(rows, fmt.Sprintf(`{"lv_name":%q,"vg_name":%q,"lv_size":"%d","lv_tags":%q,"lv_layout":"linear","lv_active":%q,"lv_kernel_major":"%d","lv_kernel_minor":"%d"}`,
				lv.name, vgName, lv.size, lv.tag, act, major, minor))
		}
		return []byte(`{"report":[{"lv":[` + strings.Join(rows, ",") + `]}]}`), nil, 0, nil
	case "lvcreate":
		lv := &fakeLV{active: true, minor: f.minor}
		f.minor++
		for i := 0; i < len(args)-1; i++ {
			switch args[i] {
			case "-n":
				lv.name = args[i+1]
			case "--addtag":
				lv.tag = args[i+1]
			case "-L":
				fmt.Sscanf(strings.TrimSuffix(args[i+1], "b"), "%d", &lv.size)
			}
		}
		vg := f.vgs[last]
		if f.free(vg) < lv.size {
			return nil, []byte("  Volume group has insufficient free space"), 5, nil
		}
		vg.lvs = append(vg.lvs, lv)
		delete(f.sig, "/dev/"+last+"/"+lv.name) // -Wy
	case "lvchange":
		_, lv := f.lv("/dev/" + last)
		lv.active = true
	case "lvremove":
		vg, lv := f.lv("/dev/" + last)
		for i := range vg.lvs {
			if vg.lvs[i] == lv {
				vg.lvs = append(vg.lvs[:i], vg.lvs[i+1:]...)
				break
			}
		}
	case "blkid":
		if s := f.sig[last]; s != "" {
			return []byte(s + "\n"), nil, 0, nil
		}
		return nil, nil, 2, nil
	case "make-bcache", "wipefs":
		if name == "wipefs" {
			delete(f.sig, last)
		} else {
			f.sig[last] = "bcache"
		}
	}
	return nil, nil, 0, nil
}

// fakeKernel is bcache's sysfs as the kernel shows it: registering a device makes its
// /sys/dev/block/<major>:<minor>/bcache entries, attach links the backing device to the set,
// stop removes them. Paths relative to /sys.
type fakeKernel struct {
	vgs    *fakeVGs
	module bool
	files  map[string]string // path → content (links: "-> target")
	held   map[string]bool
	writes []string
	next   int
}

func newFakeKernel(vgs *fakeVGs) *fakeKernel {
	return &fakeKernel{vgs: vgs, module: true, files: map[string]string{}, held: map[string]bool{}}
}

func (k *fakeKernel) ReadFile(p string) (string, error) {
	if v, ok := k.files[p]; ok && !strings.HasPrefix(v, "-> ") {
		return v, nil
	}
	return "", os.ErrNotExist
}

func (k *fakeKernel) Readlink(p string) (string, error) {
	if v, ok := k.files[p]; ok && strings.HasPrefix(v, "-> ") {
		return strings.TrimPrefix(v, "-> "), nil
	}
	return "", os.ErrNotExist
}

func (k *fakeKernel) Exists(p string) bool {
	if p == "fs/bcache" {
		return k.module
	}
	for f := range k.files {
		if f == p || strings.HasPrefix(f, p+"/") {
			return true
		}
	}
	return false
}

func (k *fakeKernel) Held(dev string) (bool, error) { return k.held[dev], nil }

func (k *fakeKernel) drop(prefix string) {
	for f := range k.files {
		if f == prefix || strings.HasPrefix(f, prefix+"/") {
			delete(k.files, f)
		}
	}
}

func (k *fakeKernel) WriteFile(p, v string) error {
	k.writes = append(k.writes, p+"="+v)
	switch {
	case p == "fs/bcache/register":
		_, lv := k.vgs.lv(v)
		if lv == nil || k.vgs.sig[v] != "bcache" {
			return fmt.Errorf("write %s: invalid argument", p)
		}
		base := fmt.Sprintf("dev/block/253:%d/bcache", lv.minor)
		if strings.HasPrefix(v, "/dev/fast/") {
			uuid := fmt.Sprintf("set-%d", lv.minor)
			k.files[base+"/set"] = "-> ../../../../fs/bcache/" + uuid
			k.files["fs/bcache/"+uuid+"/stop"] = ""
			return nil
		}
		n := fmt.Sprintf("bcache%d", k.next)
		k.next++
		k.files[base+"/dev"] = "-> ../../../../block/" + n
		k.files[base+"/state"] = "no cache"
		k.files[base+"/cache_mode"] = "[writethrough] writeback writearound none"
		k.files["block/"+n+"/bcache/cache_mode"] = "-> " + base
	case strings.HasSuffix(p, "/bcache/attach"):
		if !k.Exists("fs/bcache/" + v) {
			return fmt.Errorf("write %s: no such cache set", p)
		}
		k.files[strings.TrimSuffix(p, "attach")+"cache"] = "-> ../../../../fs/bcache/" + v
	case strings.HasSuffix(p, "/bcache/cache_mode"):
		modes := []string{"writethrough", "writeback", "writearound", "none"}
		for i, m := range modes {
			if m == v {
				modes[i] = "[" + m + "]"
			}
		}
		k.files[p] = strings.Join(modes, " ")
	case strings.HasSuffix(p, "/bcache/stop"):
		base := strings.TrimSuffix(p, "/stop")
		if dev, err := k.Readlink(base + "/dev"); err == nil {
			k.drop("block/" + dev[strings.LastIndex(dev, "/")+1:])
		}
		k.drop(base)
	case strings.HasPrefix(p, "fs/bcache/") && strings.HasSuffix(p, "/stop"):
		uuid := strings.TrimSuffix(strings.TrimPrefix(p, "fs/bcache/"), "/stop")
		for f, t := range k.files {
			if strings.HasSuffix(f, "/bcache/set") && strings.HasSuffix(t, "/"+uuid) {
				k.drop(strings.TrimSuffix(f, "/set"))
			}
		}
		k.drop("fs/bcache/" + uuid)
	default:
		return fmt.Errorf("write %s: unexpected", p)
	}
	return nil
}

func (k *fakeKernel) registered() []string {
	var out []string
	for f := range k.files {
		out = append(out, f)
	}
	sort.Strings(out)
	return out
}

func newCached(t *testing.T, vgs *fakeVGs, k *fakeKernel, mode string, ratio int) *LVM {
	t.Helper()
	l, err := New(Config{VolumeGroup: "slow", Run: vgs.run, Kernel: k, ResyncInterval: -1, // counts every call's commands
		Cache: &CacheConfig{VolumeGroup: "fast", Mode: mode, RatioPercent: ratio}})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func callsOf(calls []string, prefix string) []string {
	var out []string
	for _, c := range calls {
		if strings.HasPrefix(c, prefix) {
			out = append(out, c)
		}
	}
	return out
}

func TestCachedVolumeLifecycle(t *testing.T) {
	ctx := context.Background()
	vgs := newFakeVGs()
	k := newFakeKernel(vgs)
	l := newCached(t, vgs, k, CacheModeWriteback, 20)
	id := backend.VolumeID("cached")

	v, err := l.Create(ctx, id, 1*gib)
	if err != nil {
		t.Fatal(err)
	}
	// backing: 1 GiB + 8 KiB rounded to 4 MiB; cache: 20% of that, rounded to 4 MiB
	backingSize, cacheSize := int64(1028*mib), int64(208*mib)
	if v.DevicePath != "/dev/bcache0" || v.SizeBytes != backingSize-BackingOffsetBytes {
		t.Errorf("volume %+v", v)
	}
	want := []string{
		fmt.Sprintf("lvcreate -y -n %s --addtag %s -Wy -Zy -L %db slow", id, TagManaged, backingSize),
		fmt.Sprintf("lvcreate -y -n %s --addtag %s -Wy -Zy -L %db fast", id, TagCache, cacheSize),
	}
	if got := callsOf(vgs.calls, "lvcreate"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("lvcreate calls:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if got := callsOf(vgs.calls, "make-bcache"); len(got) != 2 || got[0] != "make-bcache -w 4k -b 128k -C /dev/fast/"+id || got[1] != "make-bcache -w 4k -B /dev/slow/"+id {
		t.Errorf("make-bcache calls %v", got)
	}
	wantWrites := []string{"fs/bcache/register=/dev/fast/" + id, "fs/bcache/register=/dev/slow/" + id,
		"dev/block/253:0/bcache/attach=set-1", "dev/block/253:0/bcache/cache_mode=writeback"}
	if strings.Join(k.writes, "\n") != strings.Join(wantWrites, "\n") {
		t.Errorf("sysfs writes:\n%s\nwant (cache registered first):\n%s", strings.Join(k.writes, "\n"), strings.Join(wantWrites, "\n"))
	}

	// repeat: adopted, nothing made or written
	n, w := len(vgs.calls), len(k.writes)
	if v2, err := l.Create(ctx, id, 1*gib); err != nil || v2 != v {
		t.Errorf("repeat create %+v %v", v2, err)
	}
	if c := callsOf(vgs.calls[n:], "lvcreate"); len(c) != 0 || len(callsOf(vgs.calls[n:], "make-bcache")) != 0 || len(k.writes) != w {
		t.Errorf("repeat create ran %v, wrote %v", vgs.calls[n:], k.writes[w:])
	}

	// a new instance (agent restart) finds the device in sysfs
	l2 := newCached(t, vgs, k, CacheModeWriteback, 20)
	if g, err := l2.Get(ctx, id); err != nil || g.DevicePath != "/dev/bcache0" {
		t.Errorf("get after restart %+v %v", g, err)
	}
	// another mode in the policy: not ready until DevicePath writes it
	l3 := newCached(t, vgs, k, CacheModeWritearound, 20)
	if g, _ := l3.Get(ctx, id); g.DevicePath != "" {
		t.Errorf("device in writeback reported for a writearound policy: %+v", g)
	}
	if d, err := l3.DevicePath(ctx, id); err != nil || d != "/dev/bcache0" || k.files["dev/block/253:0/bcache/cache_mode"] != "writethrough writeback [writearound] none" {
		t.Errorf("DevicePath %q %v, mode %q", d, err, k.files["dev/block/253:0/bcache/cache_mode"])
	}

	// capacity counts the fast VG
	c, err := l3.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if c.TotalBytes != 100*gib || c.CacheTotalBytes != 10*gib || c.CacheFreeBytes != 10*gib-cacheSize || c.CacheProvisionedBytes != cacheSize || c.ProvisionedBytes != backingSize {
		t.Errorf("capacity %+v", c)
	}

	// delete while held: refused, nothing stopped
	k.held["/dev/bcache0"] = true
	w = len(k.writes)
	if err := l3.Delete(ctx, id); !errors.Is(err, backend.ErrInUse) || len(k.writes) != w {
		t.Errorf("delete of held device: %v, writes %v", err, k.writes[w:])
	}
	k.held["/dev/bcache0"] = false
	if err := l3.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	if left := k.registered(); len(left) != 0 {
		t.Errorf("registered after delete: %v", left)
	}
	if len(vgs.vgs["slow"].lvs)+len(vgs.vgs["fast"].lvs) != 0 || len(vgs.sig) != 0 {
		t.Errorf("left after delete: slow %v fast %v signatures %v", vgs.vgs["slow"].lvs, vgs.vgs["fast"].lvs, vgs.sig)
	}
	if err := l3.Delete(ctx, id); err != nil {
		t.Errorf("delete absent: %v", err)
	}
}

// After a reboot the LVs are inactive and nothing is registered: DevicePath activates,
// registers (no make-bcache: the superblocks are there) and attaches.
func TestCachedVolumeAfterReboot(t *testing.T) {
	ctx := context.Background()
	vgs := newFakeVGs()
	k := newFakeKernel(vgs)
	id := backend.VolumeID("reboot")
	if _, err := newCached(t, vgs, k, "", 0).Create(ctx, id, 100*mib); err != nil {
		t.Fatal(err)
	}
	if got := vgs.vgs["fast"].lvs[0].size; got != MinCacheBytes {
		t.Errorf("cache of a 100 MiB volume at the default 10%%: %d bytes, want the %d minimum", got, MinCacheBytes)
	}
	k.files = map[string]string{}
	for _, vg := range vgs.vgs {
		for _, lv := range vg.lvs {
			lv.active = false
		}
	}
	l := newCached(t, vgs, k, "", 0)
	if g, err := l.Get(ctx, id); err != nil || g.DevicePath != "" {
		t.Errorf("unregistered volume %+v %v", g, err)
	}
	n := len(vgs.calls)
	d, err := l.DevicePath(ctx, id)
	if err != nil || d != "/dev/bcache1" {
		t.Fatalf("DevicePath %q %v", d, err)
	}
	if len(callsOf(vgs.calls[n:], "lvchange -ay")) != 2 || len(callsOf(vgs.calls[n:], "make-bcache")) != 0 {
		t.Errorf("after reboot ran %v", vgs.calls[n:])
	}
}

func TestCachedRefusals(t *testing.T) {
	ctx := context.Background()
	vgs := newFakeVGs()
	k := newFakeKernel(vgs)

	// no bcache in the kernel: Ensure fails before any command
	k.module = false
	if err := newCached(t, vgs, k, "", 0).Ensure(ctx); !errors.Is(err, backend.ErrMissingKernelModule) || len(vgs.calls) != 0 {
		t.Errorf("Ensure without bcache: %v after %v", err, vgs.calls)
	}
	k.module = true

	// the cache does not fit the fast VG: refused before lvcreate
	l := newCached(t, vgs, k, "", 100)
	if _, err := l.Create(ctx, backend.VolumeID("big"), 20*gib); !errors.Is(err, backend.ErrInsufficientCapacity) || len(callsOf(vgs.calls, "lvcreate")) != 0 {
		t.Errorf("cache larger than the fast VG: %v, calls %v", err, vgs.calls)
	}
	c, _ := l.Capacity(ctx)
	if got := c.Available(0, 0); got != 10*gib {
		t.Errorf("available %d, want the 10 GiB the cache space bounds at ratio 100%%", got)
	}

	// a plain LV of the same name (made before the pool had a cache) is never formatted
	id := backend.VolumeID("plain")
	vgs.vgs["slow"].lvs = append(vgs.vgs["slow"].lvs, &fakeLV{name: id, tag: TagManaged, size: 2 * gib, active: true, minor: 90})
	vgs.sig["/dev/slow/"+id] = "ext4"
	if _, err := l.Create(ctx, id, gib); !errors.Is(err, backend.ErrAlreadyExists) || !strings.Contains(err.Error(), "ext4") {
		t.Errorf("plain LV: %v", err)
	}
	if vgs.sig["/dev/slow/"+id] != "ext4" {
		t.Errorf("plain LV formatted")
	}
	// a volume whose cache LV is gone is not served uncached
	vgs.vgs["fast"].lvs = nil
	if _, err := l.DevicePath(ctx, id); err == nil || errors.Is(err, backend.ErrNotFound) || !strings.Contains(err.Error(), "not served without its cache") {
		t.Errorf("volume without its cache: %v", err)
	}
	if _, err := l.Expand(ctx, id, 3*gib); !errors.Is(err, backend.ErrOutOfRange) {
		t.Errorf("expand cached volume: %v", err)
	}

	for _, tt := range []struct {
		name string
		cfg  Config
	}{
		{"same VG", Config{VolumeGroup: "vg", Cache: &CacheConfig{VolumeGroup: "vg"}}},
		{"thin pool", Config{VolumeGroup: "vg", ThinPool: "tp", Cache: &CacheConfig{VolumeGroup: "fast"}}},
		{"mode", Config{VolumeGroup: "vg", Cache: &CacheConfig{VolumeGroup: "fast", Mode: "writeahead"}}},
		{"ratio", Config{VolumeGroup: "vg", Cache: &CacheConfig{VolumeGroup: "fast", RatioPercent: 101}}},
		{"fast VG name", Config{VolumeGroup: "vg", Cache: &CacheConfig{VolumeGroup: "-fast"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := New(tt.cfg); !errors.Is(err, backend.ErrInvalidArgument) {
				t.Errorf("New: %v, want ErrInvalidArgument", err)
			}
		})
	}
}
