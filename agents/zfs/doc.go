// Package zfs is the ZFS backend of the node agent: volumes are zvols under a
// StoragePool's parent dataset (<pool>/<parentDataset>/<volume id>), driven
// through the zfs and zpool commands in parsable mode (-H: tab-separated, no
// header; -p: exact numbers in bytes). It implements backend.Backend.
//
// Zvols get the pool's volblocksize and a volsize rounded UP to a multiple of
// it (zfs refuses any other volsize); thick zvols carry ZFS's refreservation,
// sparse ones (Config.Sparse, for pools that allow overcommit) none. Every zvol Plinth
// creates carries the user property PropManaged, so one left behind by a
// crash is adopted and zvols of others are never listed, resized or
// destroyed. Names derive from the CSI volume id only and are checked against
// ZFS's limits before any command runs. One refresh is one `zfs list`
// of the parent dataset, whatever the number of zvols. Failed commands return
// a *backend.CommandError carrying the command line and its stderr.
//
// Device paths are /dev/zvol/<dataset>: udev (60-zvol.rules, zvol_id) makes
// them on a node; DevicePath waits for the link like zvol_wait does.
package zfs
