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
