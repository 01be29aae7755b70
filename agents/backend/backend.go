package backend

import (
	"context"

	"github.com/plinth-storage/plinth/internal/identity"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// Backend is the storage of one Store: it creates, resizes and deletes block
// volumes and reports capacity. Implementations are safe for concurrent use.
//
// Volume ids are CSI volume ids (see VolumeID); a backend derives its native
// names (LV name, file name) from them and never from the CSI name.
type Backend interface {
	// Create makes a volume of at least sizeBytes bytes, rounded UP to the
	// backend's allocation unit (LVM extent, page), and returns it with its
	// real size (never smaller than requested).
	// Idempotent: a volume with this id that already exists and is at least
	// sizeBytes is returned unchanged (also one left behind by a crash, when
	// the backend can tell it is Plinth's). Errors: ErrInvalidArgument (bad id
	// or sizeBytes <= 0), ErrAlreadyExists (the id exists but is smaller than
	// requested, or the name is taken by something that is not Plinth's),
	// ErrInsufficientCapacity (no room once the reserve is honoured).
	Create(ctx context.Context, id string, sizeBytes int64) (Volume, error)

	// Expand grows the volume to at least sizeBytes bytes (rounded up like
	// Create) and returns it. A volume already that big is returned unchanged;
	// volumes never shrink. Errors: ErrNotFound, ErrInsufficientCapacity,
	// ErrInvalidArgument.
	Expand(ctx context.Context, id string, sizeBytes int64) (Volume, error)

	// Delete removes the volume and its data. Deleting an unknown id is
	// success (CSI DeleteVolume is idempotent). ErrInUse when the device is
	// held open (mounted, exported) and the kernel refuses removal.
	Delete(ctx context.Context, id string) error

	// Get returns one volume. ErrNotFound when absent.
	Get(ctx context.Context, id string) (Volume, error)

	// List returns every volume of this Store that Plinth created (backend
	// objects without Plinth's mark are not listed), ordered by id. It costs
	// one report of the backend (e.g. one lvs), never one command per volume.
	List(ctx context.Context) ([]Volume, error)

	// Capacity reports the Store's physical capacity and use.
	Capacity(ctx context.Context) (Capacity, error)

	// DevicePath returns the block device node of the volume (e.g.
	// /dev/<vg>/<lv>, /dev/loop3), attaching or activating it when needed.
	// ErrNotFound when the volume does not exist.
	DevicePath(ctx context.Context, id string) (string, error)
}

// Volume is one block volume as the backend sees it.
type Volume struct {
	// ID is the CSI volume id ("vol-" + 40 hex digits).
	ID string
	// Name is the backend-native name (LV name, file name).
	Name string
	// SizeBytes is the real size of the block device in bytes (after
	// rounding up to the allocation unit); for thin volumes the virtual size.
	SizeBytes int64
	// Thin is true when the volume is thin-provisioned (thin LV, sparse file).
	Thin bool
	// DevicePath is the block device node when known and active, else "".
	DevicePath string
	// Stamp is the volume's identity stamp as List read it (backends that are Stampers),
	// nil when it has none or it is unreadable.
	Stamp *identity.Stamp
	// StampErr is why the stamp is unreadable (wraps identity.ErrTorn or
	// identity.ErrUnknownVersion), nil when it was read or there is none.
	StampErr error
}

// Capacity is the physical capacity of a Store as the backend reports it.
// Policy (reserve, overcommit) is applied by Available, not by the backend.
type Capacity struct {
	// TotalBytes is the physical space volumes are carved from: the VG size
	// for linear LVs, the thin pool's data size for thin LVs, the
	// filesystem size for the file backend.
	TotalBytes int64
	// FreeBytes is the physical space still free in that same space: VG free
	// (linear), thin pool data size × (1 − data used) (thin, never VG free,
	// which a pool filling the VG leaves at 0), filesystem free for
	// unprivileged use (file).
	FreeBytes int64
	// ProvisionedBytes is the sum of the sizes of Plinth's volumes (virtual
	// sizes for thin volumes), snapshots not included.
	ProvisionedBytes int64
	// SnapshotBytes is the space Plinth's snapshots hold in bytes: the file
	// backend's snapshot files (allocated blocks), the blocks thin snapshot LVs
	// map (lvs data_percent × size; shared with their origin until it is
	// overwritten, so at most what deleting them frees), the zvols'
	// usedbysnapshots (used − referenced − the unused refreservation).
	// Available subtracts it for thin backends; for linear LVM and thick zvols
	// it is already gone from FreeBytes.
	SnapshotBytes int64
	// Thin is true when volumes are thin-provisioned from TotalBytes
	// (overcommit applies).
	Thin bool
	// DataUsedRatio and MetadataUsedRatio are the thin pool's data and
	// metadata use, 0..1 (0 for non-thin backends).
	DataUsedRatio     float64
	MetadataUsedRatio float64
	// ExtentBytes is the allocation unit sizes are rounded up to (bytes).
	ExtentBytes int64
	// Contiguous is true when a volume must fit in one free region (raw partitions, whole
	// disks): LargestFreeBytes then bounds Available.
	Contiguous bool
	// LargestFreeBytes is the largest volume one free region still holds (bytes; the
	// largest aligned gap of a GPT, the largest free disk), used when Contiguous.
	LargestFreeBytes int64
	// CacheRatioPercent is set when every volume has a cache on a second, fast device (the
	// LVM backend's bcache cache): a volume of S bytes also takes a cache of S × ratio/100
	// bytes (at least CacheMinBytes) from the cache space. 0: no cache.
	CacheRatioPercent int64
	// CacheMinBytes is the smallest cache a volume gets (bytes; bcache needs more than 512
	// buckets).
	CacheMinBytes int64
	// CacheTotalBytes and CacheFreeBytes are the cache space (the fast VG's size and free
	// bytes); CacheProvisionedBytes is the sum of the volumes' caches in it. Bytes.
	CacheTotalBytes, CacheFreeBytes, CacheProvisionedBytes int64
}

// CacheBytes is the cache a volume of sizeBytes takes: sizeBytes × CacheRatioPercent/100, at
// least CacheMinBytes; 0 without a cache.
func (c Capacity) CacheBytes(sizeBytes int64) int64 {
	if c.CacheRatioPercent <= 0 {
		return 0
	}
	return max(sizeBytes/100*c.CacheRatioPercent+sizeBytes%100*c.CacheRatioPercent/100, c.CacheMinBytes)
}

// Allocatable is physical − reserve, clamped at 0 (no underflow).
// reserveBytes < 0 counts as 0.
func (c Capacity) Allocatable(reserveBytes int64) int64 {
	if reserveBytes < 0 {
		reserveBytes = 0
	}
	return clamp(c.TotalBytes - reserveBytes)
}

// Available is the number of bytes a new volume may still take, the one
// figure every part uses (docs/design.md, "Capacity"):
//
//   - thin: (total − reserve) × overcommitPercent/100 − provisioned −
//     snapshots; bounded by nothing else, since thin volumes use pool space
//     lazily (never derived from VG free, which does not see the room inside the thin pool);
//   - linear / file: free − reserve (the free space is what is physically
//     left, whoever else uses the VG or filesystem);
//   - contiguous (raw): that, and never more than LargestFreeBytes, since a
//     volume cannot span two free regions;
//   - cached (CacheRatioPercent > 0): that, and never more than the volume whose cache
//     still fits the free cache space (CacheFreeBytes × 100 / ratio; 0 when less than
//     CacheMinBytes is free).
//
// overcommitPercent <= 0 means 100 (no overcommit); it applies to thin
// capacity only. The result is clamped at 0 (a reserve above free is no underflow).
func (c Capacity) Available(reserveBytes int64, overcommitPercent int64) int64 {
	if reserveBytes < 0 {
		reserveBytes = 0
	}
	if !c.Thin {
		avail := c.FreeBytes - reserveBytes
		if c.Contiguous {
			avail = min(avail, c.LargestFreeBytes)
		}
		if c.CacheRatioPercent > 0 {
			cacheBound := int64(0)
			if c.CacheFreeBytes >= c.CacheMinBytes {
				cacheBound = c.CacheFreeBytes * 100 / c.CacheRatioPercent
			}
			avail = min(avail, cacheBound)
		}
		return clamp(avail)
	}
	limit := policyv1.ProvisionLimit(clamp(c.TotalBytes-reserveBytes), true, overcommitPercent)
	return clamp(limit - c.ProvisionedBytes - c.SnapshotBytes)
}

func clamp(v int64) int64 {
	if v < 0 {
		return 0
	}
	return v
}

// RoundUp rounds sizeBytes up to a multiple of unitBytes (never down). unitBytes <= 0
// returns sizeBytes unchanged.
func RoundUp(sizeBytes, unitBytes int64) int64 {
	if unitBytes <= 0 || sizeBytes%unitBytes == 0 {
		return sizeBytes
	}
	return (sizeBytes/unitBytes + 1) * unitBytes
}

// Stamper is a backend whose volumes carry the identity stamp (internal/identity,
// docs/design.md "Volume identity stamp"): LV tags, zvol user properties, the file
// backend's record beside the image. List fills Volume.Stamp and Volume.StampErr.
type Stamper interface {
	// Stamp writes s onto the backend object of volume s.VolumeID, replacing the stamp it
	// had, and never touches the volume's data. Errors: ErrNotFound when the volume is
	// absent; ErrInvalidArgument when s is not a valid stamp.
	Stamp(ctx context.Context, s identity.Stamp) error
	// ReadStamp returns the stamp of volume id: (nil, nil) when it has none. Errors:
	// ErrInvalidArgument for a bad id; identity.ErrTorn, identity.ErrUnknownVersion.
	ReadStamp(ctx context.Context, id string) (*identity.Stamp, error)
}
