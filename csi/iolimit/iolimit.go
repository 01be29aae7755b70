// Package iolimit writes a volume's I/O limits into the cgroups of the pods that consume it:
// blkio.throttle.{read,write}_{bps,iops}_device on cgroup v1 and io.max on cgroup v2 (Linux
// Documentation/admin-guide/cgroup-v1/blkio-controller.rst, cgroup-v2.rst "IO Interface
// Files"). Files are written through github.com/opencontainers/cgroups (runc's), which opens
// them inside cgroupfs only.
//
// cgroup v1's throttling is not hierarchical (a limit on a pod's cgroup does not bind the
// containers' cgroups under it), so on v1 the limits are written into the pod's cgroup and
// every cgroup below it; a container started later gets them at the next Apply. On v2, io.max
// of the pod's cgroup binds everything below it.
package iolimit

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/opencontainers/cgroups"
	"golang.org/x/sys/unix"
)

// Limits are the rates to enforce; 0 is no limit. Bytes per second and operations per second.
type Limits struct {
	ReadBPS, WriteBPS, ReadIOPS, WriteIOPS uint64
}

// Device is a block device's major:minor.
type Device struct{ Major, Minor uint32 }

func (d Device) String() string { return fmt.Sprintf("%d:%d", d.Major, d.Minor) }

// ErrNoDevice and ErrNoCgroup say what is missing when limits cannot be applied.
var (
	ErrNoDevice = errors.New("block device not found")
	ErrNoCgroup = errors.New("pod cgroup not found")
)

// DeviceOf returns the major:minor of block device path (symlinks followed); ErrNoDevice
// (wrapped) when it is absent or not a block device.
func DeviceOf(path string) (Device, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return Device{}, fmt.Errorf("%w: %s: %v", ErrNoDevice, path, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFBLK {
		return Device{}, fmt.Errorf("%w: %s is not a block device", ErrNoDevice, path)
	}
	return Device{unix.Major(uint64(st.Rdev)), unix.Minor(uint64(st.Rdev))}, nil
}

// Writer applies limits under a cgroup mount point.
type Writer struct {
	// Root is the cgroup mount point, /sys/fs/cgroup.
	Root string
	// V2 selects io.max in the unified hierarchy at Root; otherwise the v1 blkio hierarchy
	// at Root/blkio is used. Detect sets it from the mount.
	V2 bool
	// MaxDepth bounds the search for a pod's cgroup below the hierarchy's root (default 6:
	// <kubelet cgroup root>/kubepods/<QoS class>/pod<uid> with room for nested roots).
	MaxDepth int
}

// Detect returns the Writer of the host's cgroup mount at root (/sys/fs/cgroup): v2 when
// root is the unified hierarchy, v1 (blkio) otherwise, including hybrid mounts, where
// kubelet runs its pods under v1.
func Detect(root string) Writer {
	var st unix.Statfs_t
	v2 := unix.Statfs(root, &st) == nil && st.Type == unix.CGROUP2_SUPER_MAGIC
	return Writer{Root: root, V2: v2}
}

// hierarchy is the directory below which pod cgroups are searched.
func (w Writer) hierarchy() string {
	if w.V2 {
		return w.Root
	}
	return filepath.Join(w.Root, "blkio")
}

// PodCgroup finds the cgroup directory of the pod with UID uid, as kubelet names it with the
// cgroupfs driver ("pod<uid>") or the systemd driver ("kubepods-<qos>-pod<uid with _>.slice");
// ErrNoCgroup (wrapped) when there is none.
func (w Writer) PodCgroup(uid string) (string, error) {
	if uid == "" {
		return "", fmt.Errorf("%w: no pod UID", ErrNoCgroup)
	}
	plain, slice := "pod"+uid, "pod"+strings.ReplaceAll(uid, "-", "_")+".slice"
	root := w.hierarchy()
	maxDepth := w.MaxDepth
	if maxDepth == 0 {
		maxDepth = 6
	}
	var found string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == root {
				return err
			}
			return nil // a cgroup removed during the walk
		}
		if !d.IsDir() {
			return nil
		}
		name := d.Name()
		if name == plain || strings.HasSuffix(name, slice) && (name == slice || strings.HasSuffix(name, "-"+slice)) {
			found = p
			return filepath.SkipAll
		}
		if p != root && strings.Count(strings.TrimPrefix(p, root), string(filepath.Separator)) >= maxDepth {
			return filepath.SkipDir
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("%w: search %s: %v", ErrNoCgroup, root, err)
	}
	if found == "" {
		return "", fmt.Errorf("%w: no cgroup of pod %s under %s", ErrNoCgroup, uid, root)
	}
	return found, nil
}

// Apply writes l for dev into the cgroup of pod uid (and, on v1, every cgroup below it). A
// rate of 0 removes that limit. A file that already holds the value is not written: every
// write restarts the kernel's throttling slice (blk-throttle tg_conf_updated), so rewriting an
// unchanged limit each round would hold back an I/O that needs longer than a round. It
// returns the number of files written (0 when every cgroup already held l). Errors wrap
// ErrNoCgroup or name the file that failed.
func (w Writer) Apply(uid string, dev Device, l Limits) (int, error) {
	dir, err := w.PodCgroup(uid)
	if err != nil {
		return 0, err
	}
	if w.V2 {
		line := fmt.Sprintf("%s rbps=%s wbps=%s riops=%s wiops=%s", dev, v2Rate(l.ReadBPS), v2Rate(l.WriteBPS), v2Rate(l.ReadIOPS), v2Rate(l.WriteIOPS))
		want := line
		if l == (Limits{}) {
			want = "" // the kernel lists no line for a device without limits
		}
		if cur, err := cgroups.ReadFile(dir, "io.max"); err == nil && deviceLine(cur, dev) == want {
			return 0, nil
		}
		if err := cgroups.WriteFile(dir, "io.max", line); err != nil {
			return 0, fmt.Errorf("write io.max of %s: %w", dir, err)
		}
		return 1, nil
	}
	written := 0
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == dir {
				return fmt.Errorf("%w: %v", ErrNoCgroup, err)
			}
			return nil // a container's cgroup removed during the walk
		}
		if !d.IsDir() {
			return nil
		}
		for _, f := range []struct {
			file string
			rate uint64
		}{
			{"blkio.throttle.read_bps_device", l.ReadBPS}, {"blkio.throttle.write_bps_device", l.WriteBPS},
			{"blkio.throttle.read_iops_device", l.ReadIOPS}, {"blkio.throttle.write_iops_device", l.WriteIOPS},
		} {
			want := ""
			if f.rate != 0 {
				want = dev.String() + " " + strconv.FormatUint(f.rate, 10)
			}
			if cur, err := cgroups.ReadFile(p, f.file); err == nil && deviceLine(cur, dev) == want {
				continue
			}
			if err := cgroups.WriteFile(p, f.file, dev.String()+" "+strconv.FormatUint(f.rate, 10)); err != nil {
				if p != dir && errors.Is(err, os.ErrNotExist) {
					return nil // removed meanwhile
				}
				return fmt.Errorf("write %s of %s: %w", f.file, p, err)
			}
			written++
		}
		return nil
	})
	return written, err
}

// deviceLine is the line of a throttle file's content that starts with dev ("" when none).
func deviceLine(content string, dev Device) string {
	prefix := dev.String() + " "
	for _, l := range strings.Split(content, "\n") {
		if strings.HasPrefix(l, prefix) {
			return strings.TrimSpace(l)
		}
	}
	return ""
}

// v2Rate is an io.max value: the rate, or "max" for none.
func v2Rate(r uint64) string {
	if r == 0 {
		return "max"
	}
	return strconv.FormatUint(r, 10)
}
