// Package file is the development backend of the node agent: each volume is
// a sparse file <directory>/<volume id>.img attached to a loop device through
// the kernel's loop ioctls (/dev/loop-control, LOOP_CONFIGURE). Capacity comes
// from the filesystem holding the directory (statfs). It implements
// backend.Backend for nodes without LVM and for development on machines that
// have loop devices but no device-mapper.
package file
