// Package lvm is the LVM backend of the node agent: it drives the lvm2
// commands (JSON reports: --reportformat json --units b --nosuffix) to create
// a VG on declared, empty devices, an optional thin pool, and linear or thin
// LVs for volumes; it implements backend.Backend.
//
// Plinth's LVs are named by their CSI volume id (LVName) and tagged
// TagManaged, so an LV created before a crash is adopted, and LVs of others
// are never listed, resized or removed. One refresh is one `vgs` plus one
// `lvs` command, whatever the number of volumes, and an idle VG's report is
// kept: device-mapper (ioctls, no command) tells when it must be read again
// (Config.ResyncInterval). Warnings on stderr of a
// command that exits 0 are logged, not errors; failed commands return a
// *backend.CommandError carrying the command line and its stderr.
package lvm
