package crypt

import "golang.org/x/sys/unix"

// devNumber returns the device number of the block device at path.
func devNumber(path string) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return 0, err
	}
	return st.Rdev, nil
}
