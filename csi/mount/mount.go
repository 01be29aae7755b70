// Package mount formats, mounts and unmounts for the node plugin on top of k8s.io/mount-utils,
// with the rules the field taught:
//
//   - format only a blank device: probe with blkid first and never run mkfs on a device that is
//     missing, unprobeable or already holds a filesystem or partition table;
//   - mount xfs with nouuid so a clone beside its origin mounts;
//   - decide "is it mounted" from /proc/self/mountinfo, never from stat, because stat of a dead
//     mount returns EIO, ENOTCONN or ESTALE, and never report an unmount as done while the
//     path is still listed there;
//   - compare paths as the kernel lists them: a target or staging path reached through a
//     symlink (a kubelet root dir that is a symlink) is listed under its resolved path, so
//     looking up the path as given would call a mounted path unmounted — publish would mount it
//     again and unpublish would then fail forever with "busy";
//   - grow a filesystem only once its device shows the size asked for, and not when the
//     filesystem already spans it.
package mount

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"
	mountutils "k8s.io/mount-utils"
	utilexec "k8s.io/utils/exec"
)

// ErrDeviceNotFound means the device path does not exist or is not a block device.
var ErrDeviceNotFound = errors.New("device not found")

// Mounter mounts and unmounts. The zero value is not usable; use New.
type Mounter struct {
	// MountInfo is the mountinfo file, /proc/self/mountinfo by default.
	MountInfo string
	// Stat probes a path; os.Stat by default (tests inject EIO/ENOTCONN/ESTALE).
	Stat func(path string) (os.FileInfo, error)

	safe *mountutils.SafeFormatAndMount
}

// New returns a Mounter using the system's mount, umount, blkid and mkfs.* commands.
func New() *Mounter {
	return &Mounter{
		MountInfo: "/proc/self/mountinfo",
		Stat:      os.Stat,
		safe:      mountutils.NewSafeFormatAndMount(mountutils.NewWithoutSystemd(""), utilexec.New()),
	}
}

// IsMounted reports whether path is a mount point according to mountinfo.
func (m *Mounter) IsMounted(path string) (bool, error) {
	src, err := m.SourceOf(path)
	return src != "", err
}

// SourceOf returns the mount source (device) of the topmost mount at path, "" when path is not
// a mount point. For a bind mount of a block device file it returns the device too.
func (m *Mounter) SourceOf(path string) (string, error) {
	infos, err := mountutils.ParseMountInfo(m.MountInfo)
	if err != nil {
		return "", fmt.Errorf("read %s: %w", m.MountInfo, err)
	}
	clean, resolved := filepath.Clean(path), Resolve(path)
	src := ""
	for _, mi := range infos {
		if mi.MountPoint == clean || mi.MountPoint == resolved {
			src = mi.Source
			if (mi.Source == "devtmpfs" || mi.Source == "udev") && mi.Root != "/" {
				src = filepath.Join("/dev", mi.Root)
			}
		}
	}
	return src, nil
}

// MountPointsOf returns where the block device dev is mounted: filesystems mounted from it and
// bind mounts of its device node (a published raw block volume), from mountinfo.
func (m *Mounter) MountPointsOf(dev string) ([]string, error) {
	infos, err := mountutils.ParseMountInfo(m.MountInfo)
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", m.MountInfo, err)
	}
	dev = filepath.Clean(dev)
	var out []string
	for _, mi := range infos {
		src := mi.Source
		if (mi.Source == "devtmpfs" || mi.Source == "udev") && mi.Root != "/" {
			src = filepath.Join("/dev", mi.Root)
		}
		if src == dev {
			out = append(out, mi.MountPoint)
		}
	}
	return out, nil
}

// Resolve returns path as mountinfo lists it: cleaned, with symlinks resolved. The last
// element is resolved only when it can be (a dead mount's root fails every stat); then its
// parent is resolved and the last element kept as given.
func Resolve(path string) string {
	clean := filepath.Clean(path)
	if r, err := filepath.EvalSymlinks(clean); err == nil {
		return r
	}
	if dir, err := filepath.EvalSymlinks(filepath.Dir(clean)); err == nil {
		return filepath.Join(dir, filepath.Base(clean))
	}
	return clean
}

// IsCorrupted reports whether err from probing a path means a dead mount (EIO, ENOTCONN,
// ESTALE, EACCES, EHOSTDOWN, ...), per mount-utils IsCorruptedMnt.
func IsCorrupted(err error) bool { return mountutils.IsCorruptedMnt(err) }

// Probe stats path and returns the error, classified by IsCorrupted by the caller.
func (m *Mounter) Probe(path string) error {
	_, err := m.Stat(path)
	return err
}

// CheckBlockDevice returns ErrDeviceNotFound unless dev exists and is a block device.
func CheckBlockDevice(dev string) error {
	fi, err := os.Stat(dev)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", ErrDeviceNotFound, dev, err)
	}
	if fi.Mode()&os.ModeDevice == 0 || fi.Mode()&os.ModeCharDevice != 0 {
		return fmt.Errorf("%w: %s is not a block device", ErrDeviceNotFound, dev)
	}
	return nil
}

// DiskFormat returns the filesystem (or "unknown data, probably partitions") blkid finds on
// dev, "" for a blank device. An unprobeable device is an error, never "blank".
func (m *Mounter) DiskFormat(dev string) (string, error) {
	if err := CheckBlockDevice(dev); err != nil {
		return "", err
	}
	return m.safe.GetDiskFormat(dev)
}

// MountOptions returns the options a filesystem mount uses: the given ones plus nouuid for xfs
// (a clone carries its origin's UUID, and XFS refuses a second mount of one UUID).
func MountOptions(fsType string, opts []string) []string {
	out := slices.Clone(opts)
	if fsType == "xfs" && !slices.Contains(out, "nouuid") {
		out = append(out, "nouuid")
	}
	return out
}

// FormatAndMount mounts dev at target as fsType, running mkfs (with mkfsOptions) first only
// when blkid says dev is blank. The device must exist (ErrDeviceNotFound otherwise: never mkfs
// what cannot be probed). target must exist.
//
// With mkfsOptions, a blank device is formatted here, with the defaults mount-utils uses
// before the options (MkfsArgs): mount-utils puts its defaults after them, and mke2fs takes
// the last of a repeated flag, so a "-m 1" would lose to its "-m0". A read-only mount of a
// blank device is left to mount-utils, which refuses it.
func (m *Mounter) FormatAndMount(dev, target, fsType string, mkfsOptions, options []string) error {
	if fsType == "" {
		fsType = "ext4"
	}
	format, err := m.DiskFormat(dev)
	if err != nil {
		return fmt.Errorf("probe %s: %w", dev, err)
	}
	if format == "" && len(mkfsOptions) > 0 && !slices.Contains(options, "ro") {
		args := MkfsArgs(fsType, mkfsOptions, dev)
		if out, err := m.safe.Exec.Command("mkfs."+fsType, args...).CombinedOutput(); err != nil {
			return fmt.Errorf("mkfs.%s %v: %w: %s", fsType, args, err, out)
		}
	}
	return m.safe.FormatAndMountSensitiveWithFormatOptions(dev, target, fsType, MountOptions(fsType, options), nil, mkfsOptions)
}

// MkfsArgs returns the arguments of mkfs.<fsType> for dev: mount-utils' defaults (ext3 and
// ext4: -F, -m0; xfs: -f), then opts, so that an option given wins over a default, then the
// device.
func MkfsArgs(fsType string, opts []string, dev string) []string {
	var args []string
	switch fsType {
	case "ext3", "ext4":
		args = []string{"-F", "-m0"}
	case "xfs":
		args = []string{"-f"}
	}
	args = append(args, opts...)
	return append(args, dev)
}

// BindMount bind-mounts source (a directory or a device file) at target, read-only when ro.
func (m *Mounter) BindMount(source, target string, ro bool, options []string) error {
	opts := append([]string{"bind"}, options...)
	if ro {
		opts = append(opts, "ro")
	}
	return m.safe.Mount(source, target, "", opts)
}

// Unmount unmounts every mount stacked at path — also a dead one whose stat returns EIO,
// ENOTCONN or ESTALE, falling back to a forced, then lazy unmount — and removes path
// (a directory or a file) when removePath. It returns nil only when mountinfo no longer lists
// path. A path that does not exist and is not mounted is success.
func (m *Mounter) Unmount(path string, removePath bool) error {
	for attempt := 0; ; attempt++ {
		mounted, err := m.IsMounted(path)
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		if attempt >= 8 {
			return fmt.Errorf("%s is still mounted after %d unmounts", path, attempt)
		}
		err = unix.Unmount(path, 0)
		if err != nil && !errors.Is(err, unix.EINVAL) {
			// A dead mount whose I/O hangs or fails: force, then detach.
			if ferr := unix.Unmount(path, unix.MNT_FORCE); ferr != nil {
				if lerr := unix.Unmount(path, unix.MNT_DETACH); lerr != nil {
					return fmt.Errorf("unmount %s: %v (force: %v, lazy: %v)", path, err, ferr, lerr)
				}
			}
		}
	}
	if !removePath {
		return nil
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove %s: %w", path, err)
	}
	return nil
}

// DeviceSize returns the size of a block device in bytes (BLKGETSIZE64).
func DeviceSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var size uint64
	if err := ioctlGetSize(f.Fd(), &size); err != nil {
		return 0, fmt.Errorf("BLKGETSIZE64 %s: %w", dev, err)
	}
	return int64(size), nil
}

// ErrDeviceTooSmall means the device does not show the size asked for yet (the agent has not
// grown the volume, or the initiator has not seen the new size): nothing was grown.
var ErrDeviceTooSmall = errors.New("device smaller than asked")

// Grow grows the filesystem on dev, mounted at mountPath, to the device's size with resize2fs
// (ext*) or xfs_growfs (xfs), but only when it must: it returns ErrDeviceTooSmall without
// touching anything while the device is smaller than wantBytes (0: no size asked), and does
// nothing when the filesystem already spans wantBytes (or, with no size asked, the device).
// grown says whether the resize tool ran; size is the device's size in bytes.
func (m *Mounter) Grow(dev, mountPath string, wantBytes int64) (grown bool, size int64, err error) {
	size, err = DeviceSize(dev)
	if err != nil {
		return false, 0, err
	}
	if size < wantBytes {
		return false, size, fmt.Errorf("%w: %s has %d bytes, %d asked", ErrDeviceTooSmall, dev, size, wantBytes)
	}
	fs, err := FilesystemSize(dev, mountPath)
	if err != nil {
		return false, size, err
	}
	goal := wantBytes
	if goal == 0 {
		goal = size
	}
	if fs >= goal {
		return false, size, nil
	}
	if _, err := mountutils.NewResizeFs(m.safe.Exec).Resize(dev, mountPath); err != nil {
		return false, size, err
	}
	return true, size, nil
}
