package lvm

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// DeviceMapper reads the kernel's device-mapper without lvm2: what an idle VG's kept report is
// checked against (see Config.ResyncInterval).
type DeviceMapper interface {
	// Devices lists every device-mapper device (DM_LIST_DEVICES).
	Devices() ([]DMDevice, error)
	// Status returns the target type and status line of the named device's first target,
	// without flushing (DM_TABLE_STATUS with DM_NOFLUSH_FLAG: a thin pool does not commit
	// its metadata for it). An error wrapping unix.ENXIO when there is no such device.
	Status(name string) (target, status string, err error)
}

// DMDevice is one device-mapper device: its name ("<vg>-<lv>" with hyphens doubled, plus
// "-<layer>" for hidden layers such as "-tpool") and its device number (unix.Mkdev).
type DMDevice struct {
	Name string
	Dev  uint64
}

// SysDeviceMapper is this machine's device-mapper: ioctls on /dev/mapper/control (root). One
// DM_LIST_DEVICES is one syscall whatever the number of devices; no process is started.
type SysDeviceMapper struct{}

const dmControl = "/dev/mapper/control"

// dmIoctl runs one device-mapper ioctl on the device name ("" for none) and returns its
// result area (the bytes after the header), growing the buffer while the kernel says it is full.
func dmIoctl(cmd uintptr, name string, flags uint32) ([]byte, error) {
	f, err := os.OpenFile(dmControl, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("device-mapper: %w", err)
	}
	defer f.Close()
	for size := 16 << 10; size <= 16<<20; size *= 4 {
		// uint64 words: the kernel's structures in the buffer are 8-byte aligned
		words := make([]uint64, size/8)
		h := (*unix.DmIoctl)(unsafe.Pointer(&words[0]))
		h.Version = [3]uint32{unix.DM_VERSION_MAJOR, 0, 0}
		h.Data_size = uint32(size)
		h.Data_start = unix.SizeofDmIoctl
		h.Flags = flags
		copy(h.Name[:len(h.Name)-1], name)
		if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), cmd, uintptr(unsafe.Pointer(h))); errno != 0 {
			return nil, fmt.Errorf("device-mapper ioctl %#x %q: %w", cmd, name, errno)
		}
		if h.Flags&unix.DM_BUFFER_FULL_FLAG != 0 {
			continue
		}
		buf := unsafe.Slice((*byte)(unsafe.Pointer(&words[0])), size)
		end := min(int(h.Data_size), size)
		if int(h.Data_start) > end {
			return nil, fmt.Errorf("device-mapper ioctl %#x %q: data at %d beyond %d", cmd, name, h.Data_start, end)
		}
		return bytes.Clone(buf[h.Data_start:end]), nil
	}
	return nil, fmt.Errorf("device-mapper ioctl %#x %q: result larger than 16 MiB", cmd, name)
}

// Devices lists every device-mapper device (one DM_LIST_DEVICES ioctl).
func (SysDeviceMapper) Devices() ([]DMDevice, error) {
	data, err := dmIoctl(unix.DM_LIST_DEVICES, "", 0)
	if err != nil {
		return nil, err
	}
	return parseNameList(data)
}

// parseNameList parses the kernel's struct dm_name_list records (include/uapi/linux/dm-ioctl.h):
// u64 dev, u32 next (offset of the next record from this one, 0 for the last), then the
// NUL-terminated name. A first record with dev 0 means no device.
func parseNameList(data []byte) ([]DMDevice, error) {
	var out []DMDevice
	for off := 0; ; {
		if off+12 > len(data) {
			return nil, fmt.Errorf("device-mapper device list: record at %d beyond %d bytes", off, len(data))
		}
		dev := binary.NativeEndian.Uint64(data[off:])
		next := int(binary.NativeEndian.Uint32(data[off+8:]))
		if dev == 0 && off == 0 {
			return nil, nil
		}
		name, _, ok := bytes.Cut(data[off+12:], []byte{0})
		if !ok {
			return nil, fmt.Errorf("device-mapper device list: unterminated name at %d", off)
		}
		out = append(out, DMDevice{Name: string(name), Dev: dev})
		if next == 0 {
			return out, nil
		}
		off += next
	}
}

// Status returns the first target's type and status line (one DM_TABLE_STATUS ioctl, no flush).
func (SysDeviceMapper) Status(name string) (string, string, error) {
	data, err := dmIoctl(unix.DM_TABLE_STATUS, name, unix.DM_NOFLUSH_FLAG)
	if err != nil {
		return "", "", err
	}
	if len(data) < unix.SizeofDmTargetSpec {
		return "", "", fmt.Errorf("device-mapper status of %s: no target", name)
	}
	spec := (*unix.DmTargetSpec)(unsafe.Pointer(&data[0]))
	typ, _, _ := bytes.Cut(spec.Target_type[:], []byte{0})
	status, _, _ := bytes.Cut(data[unix.SizeofDmTargetSpec:], []byte{0})
	return string(typ), string(status), nil
}

// dmEscape doubles the hyphens of a VG or LV name, as lvm2 does when it names dm devices.
func dmEscape(s string) string { return strings.ReplaceAll(s, "-", "--") }

// thinPoolStatus is the status line of a thin-pool target (kernel
// Documentation/admin-guide/device-mapper/thin-provisioning.rst, "Status"):
// "<transaction id> <used meta>/<total meta> <used data>/<total data> <held root> <mode> ...".
type thinPoolStatus struct {
	transaction              uint64
	usedMeta, totalMeta      uint64
	usedData, totalData      uint64
	mode                     string // rw, ro, out_of_data_space; "Fail" or "Error" alone
	dataPercent, metaPercent float64
}

func parseThinPoolStatus(s string) (thinPoolStatus, error) {
	f := strings.Fields(s)
	if len(f) == 1 {
		return thinPoolStatus{mode: f[0]}, nil // Fail, Error: nothing else is reported
	}
	if len(f) < 6 {
		return thinPoolStatus{}, fmt.Errorf("thin-pool status %q: want at least 6 fields", s)
	}
	var st thinPoolStatus
	var err error
	ratio := func(field string, used, total *uint64) {
		u, t, ok := strings.Cut(field, "/")
		if !ok && err == nil {
			err = fmt.Errorf("%q is not used/total", field)
			return
		}
		var e1, e2 error
		*used, e1 = strconv.ParseUint(u, 10, 64)
		*total, e2 = strconv.ParseUint(t, 10, 64)
		if (e1 != nil || e2 != nil || *total == 0 || *used > *total) && err == nil {
			err = fmt.Errorf("bad usage %q", field)
		}
	}
	st.transaction, err = strconv.ParseUint(f[0], 10, 64)
	ratio(f[1], &st.usedMeta, &st.totalMeta)
	ratio(f[2], &st.usedData, &st.totalData)
	if err != nil {
		return thinPoolStatus{}, fmt.Errorf("thin-pool status %q: %w", s, err)
	}
	st.mode = f[4]
	st.dataPercent = float64(st.usedData) / float64(st.totalData) * 100
	st.metaPercent = float64(st.usedMeta) / float64(st.totalMeta) * 100
	return st, nil
}

// dmView is what device-mapper shows of one VG: a signature that changes when one of its
// devices appears, goes, is renamed or gets another number, or its thin pool's transaction
// id or mode changes (a thin LV created or deleted, even an inactive one; a full pool); and
// the thin pool's usage when the pool is active.
type dmView struct {
	signature string
	pool      *thinPoolStatus
}

// dmView reads the VG's devices (one DM_LIST_DEVICES) and, for a thin pool, its status (one
// DM_TABLE_STATUS of "<vg>-<pool>-tpool", or of "<vg>-<pool>" when that is the thin-pool
// target itself).
func (l *LVM) dmView() (dmView, error) {
	devs, err := l.cfg.DeviceMapper.Devices()
	if err != nil {
		return dmView{}, err
	}
	prefix := dmEscape(l.cfg.VolumeGroup) + "-"
	var ours []string
	has := map[string]bool{}
	for _, d := range devs {
		// an LV name never starts with '-': "<vg>--x-..." is the VG "<vg>-x", not ours
		if rest, ok := strings.CutPrefix(d.Name, prefix); ok && !strings.HasPrefix(rest, "-") {
			ours = append(ours, fmt.Sprintf("%s=%d:%d", d.Name, unix.Major(d.Dev), unix.Minor(d.Dev)))
			has[d.Name] = true
		}
	}
	sort.Strings(ours)
	v := dmView{signature: strings.Join(ours, " ")}
	if l.cfg.ThinPool == "" {
		return v, nil
	}
	pool := prefix + dmEscape(l.cfg.ThinPool)
	for _, name := range []string{pool + "-tpool", pool} {
		if !has[name] {
			continue
		}
		typ, status, err := l.cfg.DeviceMapper.Status(name)
		if err != nil {
			return dmView{}, err
		}
		if typ != "thin-pool" {
			continue
		}
		st, err := parseThinPoolStatus(status)
		if err != nil {
			return dmView{}, err
		}
		v.pool = &st
		v.signature += fmt.Sprintf(" pool=%d:%s", st.transaction, st.mode)
		break
	}
	return v, nil
}
