package mount

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// FIFREEZE and FITHAW are _IOWR('X', 119, int) and _IOWR('X', 120, int) of linux/fs.h.
const (
	fiFreeze = 0xc0045877
	fiThaw   = 0xc0045878
)

// Freeze freezes the filesystem mounted at path (ioctl_fifreeze(2)): its dirty data is
// written back and new writes are held until Thaw. Errors: the open or the ioctl's (EBUSY:
// frozen already; EOPNOTSUPP: a filesystem without freeze).
func Freeze(path string) error { return fsIoctl(path, fiFreeze, "FIFREEZE") }

// Thaw thaws the filesystem mounted at path. A filesystem that is not frozen (EINVAL) is
// thawed already: nil.
func Thaw(path string) error {
	err := fsIoctl(path, fiThaw, "FITHAW")
	if errors.Is(err, unix.EINVAL) {
		return nil
	}
	return err
}

func fsIoctl(path string, req uint, name string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := unix.IoctlSetInt(int(f.Fd()), req, 0); err != nil {
		return fmt.Errorf("%s %s: %w", name, path, err)
	}
	return nil
}

// Frozen is a filesystem frozen by FreezeHeld. It keeps the mount's root directory open, so
// the thaw reaches the frozen superblock even when the mount point was unmounted or covered
// since: Linux lets umount(2) of a frozen filesystem succeed and keeps the superblock frozen
// with no mount left to thaw it through, its block device held with no visible holder. The
// open directory also makes a plain umount of the mount fail EBUSY while frozen.
type Frozen struct {
	f    *os.File
	path string
}

// FreezeHeld freezes the filesystem mounted at path, as Freeze, and returns it held for Thaw.
// Errors: the open or the ioctl's (EBUSY: frozen already; EOPNOTSUPP: no freeze support).
func FreezeHeld(path string) (*Frozen, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	if err := unix.IoctlSetInt(int(f.Fd()), fiFreeze, 0); err != nil {
		f.Close()
		return nil, fmt.Errorf("FIFREEZE %s: %w", path, err)
	}
	return &Frozen{f: f, path: path}, nil
}

// Thaw thaws the held filesystem through its open root directory and releases it; a
// filesystem thawed already by someone else (EINVAL) is nil. A second Thaw is nil.
func (z *Frozen) Thaw() error {
	if z == nil || z.f == nil {
		return nil
	}
	err := unix.IoctlSetInt(int(z.f.Fd()), fiThaw, 0)
	z.f.Close()
	z.f = nil
	if err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("FITHAW %s: %w", z.path, err)
	}
	return nil
}
