// Package backend defines the one interface every storage backend of the node
// agent implements (lvm, file, and later zfs), the shapes it exchanges
// (Volume, Capacity), its typed errors, and small pure helpers shared by the
// backends: the CSI volume id derivation and the capacity arithmetic of
// docs/design.md ("Capacity").
//
// All sizes are int64 bytes. A backend is bound to one Store (one pool on one
// node); volumes are addressed by their CSI volume id ("vol-" + 40 hex), never
// by the CSI name.
package backend
