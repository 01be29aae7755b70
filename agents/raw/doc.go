// Package raw is the raw-disk backend of the node agent (Carina's raw volumes): volumes live
// directly on declared whole disks, without a volume manager, either as one GPT partition per
// volume (Partitioning GPT) or as one whole disk per volume (Partitioning Whole). It
// implements backend.Backend.
//
// The partition tables are written with sfdisk and read with `sfdisk --json` (util-linux,
// Debian package fdisk): a maintained tool with a machine-readable report, from the same
// project as the partx, wipefs and blkid the agent already uses, so no GPT code of Plinth's
// own writes to disks. sfdisk runs with --no-tell-kernel and the kernel learns each change
// from partx (BLKPG add, resize, delete of that one partition), which works while other
// partitions of the disk are mounted and needs no udev.
//
// Marks. A partition is Plinth's when its GPT type is TypeGUID and its name and unique GUID
// carry its volume id: GPT names hold 36 UTF-16 units, so the 44-byte id does not fit; the
// name is the id's first 36 bytes ("vol-" + 32 hex digits) and the unique GUID its last 32
// hex digits, which overlap in 24 digits that must agree (PartitionName, PartitionGUID,
// VolumeIDOf). A partition made before a crash is therefore found and adopted by id.
//
// Identity stamps (stamp.go): nothing of the GPT can hold one, so each disk has a stamp
// area at bytes [512 KiB, 1 MiB), below the first usable LBA sfdisk records and outside every
// partition: one 4 KiB slot per GPT entry number, written whole with one pwrite and an fsync,
// read with one read per disk per refresh.
//
// Whole-disk volumes: a bare disk has nowhere to keep a volume id, so a Whole volume is a
// GPT with one partition spanning the disk's usable area (about 2 MiB less than the disk:
// the GPT headers and the 1 MiB alignment). It can never grow: it already spans its disk.
//
// Limits: a partition grows only into free space right after it (Expand returns
// backend.ErrOutOfRange otherwise); no snapshots or clones; deletion wipes the signatures
// (wipefs -a) and refuses a partition the kernel reports open (BLKPG delete fails with EBUSY
// while anything holds it: a mount, an nvmet export, a process).
package raw
