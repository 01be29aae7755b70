// Package volume is the layer under the CSI RPCs of package csi: what an RPC holds while it
// works on one volume or snapshot, and the errors it reports, free of gRPC.
//
// A Handle (Kind.Open) holds the per-object lock (a second operation on the same id gets
// ErrBusy: CSI spec "Concurrency"), the subscription to the object's informer events, and the
// object's state as last read or written; Close gives both back. Waits (Handle.Wait,
// Handle.WaitFrom) sleep on that subscription until a condition holds, never polling.
// Lockless reads (Kind.Get, Kind.Watch) serve the RPCs that take no lock.
//
// Errors carry a kind (ErrInvalid, ErrNotFound, ErrExists, ErrBusy, ErrConflict,
// ErrPrecondition, ErrInsufficientCapacity, ErrOutOfRange, ErrUnavailable, ErrTimeout,
// ErrInternal) that errors.Is finds; the CSI driver maps kinds to gRPC codes in one place, at
// the RPC edge (docs/design.md, "CSI driver layout").
package volume
