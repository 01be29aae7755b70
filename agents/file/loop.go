package file

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/agents/backend"
)

// attachMu serialises this process's loop attaches (see attachLoop).
var attachMu sync.Mutex

// loopMajor is the block major number of loop devices (Documentation/admin-guide/devices.txt).
const loopMajor = 7

// attachLoop binds path to a free loop device (LOOP_CTL_GET_FREE, then
// LOOP_CONFIGURE, or LOOP_SET_FD + LOOP_SET_STATUS64 on kernels before 5.8)
// and returns its node. A race with another process for the same device
// (EBUSY) is retried.
func attachLoop(devDir, path string) (string, error) {
	// LOOP_CTL_GET_FREE hands concurrent callers the same device, and all but one then
	// fail on EBUSY and retry: attaches of this process take turns instead
	attachMu.Lock()
	defer attachMu.Unlock()
	ctl, err := unix.Open(filepath.Join(devDir, "loop-control"), unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open loop-control: %w", err)
	}
	defer unix.Close(ctl)
	file, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return "", fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(file)
	for attempt := 0; attempt < 10; attempt++ {
		n, err := unix.IoctlRetInt(ctl, unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return "", fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev := filepath.Join(devDir, "loop"+strconv.Itoa(n))
		if _, err := os.Stat(dev); errors.Is(err, os.ErrNotExist) {
			// no devtmpfs (some containers): make the node ourselves
			if err := unix.Mknod(dev, unix.S_IFBLK|0o600, int(unix.Mkdev(loopMajor, uint32(n)))); err != nil && !errors.Is(err, os.ErrExist) {
				return "", fmt.Errorf("mknod %s: %w", dev, err)
			}
		}
		fd, err := unix.Open(dev, unix.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("open %s: %w", dev, err)
		}
		var info unix.LoopInfo64
		copy(info.File_name[:len(info.File_name)-1], path)
		err = unix.IoctlLoopConfigure(fd, &unix.LoopConfig{Fd: uint32(file), Info: info})
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOTTY) {
			// kernel without LOOP_CONFIGURE
			if err = unix.IoctlSetInt(fd, unix.LOOP_SET_FD, file); err == nil {
				if err = unix.IoctlLoopSetStatus64(fd, &info); err != nil {
					unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
				}
			}
		}
		unix.Close(fd)
		if errors.Is(err, unix.EBUSY) {
			continue // taken by someone else between GET_FREE and configure
		}
		if err != nil {
			return "", fmt.Errorf("attach %s to %s: %w", path, dev, err)
		}
		return dev, nil
	}
	return "", fmt.Errorf("attach %s: no free loop device after retries: %w", path, backend.ErrInUse)
}

// loopStatus returns the status of loop device dev (LOOP_GET_STATUS64): the
// backing file's device and inode numbers among others. An unbound device
// answers ENXIO.
func loopStatus(dev string) (*unix.LoopInfo64, error) {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	return unix.IoctlLoopGetStatus64(fd)
}

// detach unbinds a loop device. The kernel would only mark an open device
// for auto-clear and report success, so an exclusive open checks first that
// nothing (a mount, a holder) uses it: EBUSY → backend.ErrInUse.
func detach(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_EXCL|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.EBUSY) {
		return fmt.Errorf("%s: %w", dev, backend.ErrInUse)
	}
	if err != nil {
		return fmt.Errorf("open %s: %w", dev, err)
	}
	defer unix.Close(fd)
	if err := unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0); err != nil && !errors.Is(err, unix.ENXIO) {
		return fmt.Errorf("LOOP_CLR_FD %s: %w", dev, err)
	}
	return nil
}

// setCapacity makes the loop device re-read its backing file's size.
func setCapacity(dev string) error {
	fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.IoctlSetInt(fd, unix.LOOP_SET_CAPACITY, 0)
}
