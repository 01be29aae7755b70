package mount

import (
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Filesystem magic numbers of statfs(2) f_type (linux/magic.h).
const (
	ext4Magic = 0xEF53
	xfsMagic  = 0x58465342
)

// FilesystemSize returns the bytes the filesystem mounted at mountPath spans on its device dev:
// for ext2/3/4 the superblock's block count times its block size (read from dev, which shares
// ext4's metadata cache, so an online resize2fs shows at once), for xfs the data blocks times
// the block size of the live geometry (XFS_IOC_FSGEOMETRY_V1, xfs_fs.h). Other filesystems are
// an error. These are the sizes resize2fs and xfs_growfs compare with the device.
func FilesystemSize(dev, mountPath string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(mountPath, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", mountPath, err)
	}
	switch uint32(st.Type) {
	case ext4Magic:
		return extSize(dev)
	case xfsMagic:
		return xfsSize(mountPath)
	}
	return 0, fmt.Errorf("filesystem at %s (statfs type %#x): only ext2/3/4 and xfs can be grown", mountPath, st.Type)
}

// extSize reads the ext2/3/4 superblock (1024 bytes at offset 1024, little-endian; fields per
// the kernel's Documentation/filesystems/ext4/super.rst).
func extSize(dev string) (int64, error) {
	f, err := os.Open(dev)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sb := make([]byte, 1024)
	if _, err := f.ReadAt(sb, 1024); err != nil && err != io.EOF {
		return 0, fmt.Errorf("read ext superblock of %s: %w", dev, err)
	}
	return parseExtSuperblock(sb)
}

func parseExtSuperblock(sb []byte) (int64, error) {
	le := binary.LittleEndian
	if len(sb) < 1024 || le.Uint16(sb[0x38:]) != ext4Magic {
		return 0, fmt.Errorf("no ext2/3/4 superblock")
	}
	logBlock := le.Uint32(sb[0x18:])
	if logBlock > 6 { // block sizes 1 KiB to 64 KiB
		return 0, fmt.Errorf("ext superblock: block size 2^(10+%d) out of range", logBlock)
	}
	blocks := uint64(le.Uint32(sb[0x4:]))
	const incompat64bit = 0x80
	if le.Uint32(sb[0x60:])&incompat64bit != 0 {
		blocks |= uint64(le.Uint32(sb[0x150:])) << 32
	}
	return int64(blocks << (10 + logBlock)), nil
}

// xfsGeometryV1 is struct xfs_fsop_geom_v1 (xfs_fs.h): the fields up to datablocks, padded to
// the struct's 112 bytes.
type xfsGeometryV1 struct {
	BlockSize, RTExtSize, AGBlocks, AGCount, LogBlocks, SectSize, InodeSize, IMaxPct uint32
	DataBlocks                                                                       uint64
	_                                                                                [72]byte
}

// xfsIocFSGeometryV1 is XFS_IOC_FSGEOMETRY_V1, _IOR('X', 100, struct xfs_fsop_geom_v1).
const xfsIocFSGeometryV1 = 2<<30 | uint32(unsafe.Sizeof(xfsGeometryV1{}))<<16 | 'X'<<8 | 100

func xfsSize(mountPath string) (int64, error) {
	f, err := os.Open(mountPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var g xfsGeometryV1
	if _, _, errno := unix.Syscall(unix.SYS_IOCTL, f.Fd(), uintptr(xfsIocFSGeometryV1), uintptr(unsafe.Pointer(&g))); errno != 0 {
		return 0, fmt.Errorf("XFS_IOC_FSGEOMETRY %s: %w", mountPath, errno)
	}
	return int64(g.DataBlocks) * int64(g.BlockSize), nil
}
