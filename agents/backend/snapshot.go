package backend

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"
)

// SnapshotIDPrefix starts every CSI snapshot id ("snap-" + 40 hex digits of sha256 of the
// CreateSnapshot name, schema/storage/v1alpha1.SnapshotID).
const SnapshotIDPrefix = "snap-"

var snapshotIDRe = regexp.MustCompile(`^snap-[0-9a-f]{40}$`)

// ValidateSnapshotID returns ErrInvalidArgument unless id is a CSI snapshot id.
func ValidateSnapshotID(id string) error {
	if !snapshotIDRe.MatchString(id) {
		return fmt.Errorf("snapshot id %q: want snap- and 40 lower-case hex digits: %w", id, ErrInvalidArgument)
	}
	return nil
}

// ErrUnsupported: the backend cannot do this at all (snapshots of thick LVM volumes).
var ErrUnsupported = errors.New("not supported by this backend")

// Snapshotter is the optional part of a Backend that takes snapshots and makes volumes from
// snapshots and volumes (CSI CREATE_DELETE_SNAPSHOT, CLONE_VOLUME, volume content sources). A
// backend that does not implement it (or returns ErrUnsupported) has none; the CSI controller
// refuses such requests before they reach the agent. Snapshots live on the Store of their
// source volume; restores and clones are made on that same Store.
type Snapshotter interface {
	// CreateSnapshot takes a point-in-time snapshot snapID of volume volID. Idempotent: a
	// snapshot snapID that exists is returned unchanged. Errors: ErrNotFound (no volume volID),
	// ErrInvalidArgument, ErrInsufficientCapacity (a copy that does not fit), ErrUnsupported.
	CreateSnapshot(ctx context.Context, snapID, volID string) (Snapshot, error)

	// DeleteSnapshot removes the snapshot; an unknown id is success. Volumes restored from it
	// keep their data (backends that share blocks with the snapshot, ZFS clones, keep them
	// until the last such volume goes).
	DeleteSnapshot(ctx context.Context, snapID string) error

	// GetSnapshot returns one snapshot; ErrNotFound when absent.
	GetSnapshot(ctx context.Context, snapID string) (Snapshot, error)

	// CreateVolumeFrom makes volume id holding the data of source (a snapshot id or a volume
	// id of this Store), of at least sizeBytes rounded up to the unit and never smaller than
	// the source. Idempotent like Create. Errors: ErrNotFound (no source), ErrInvalidArgument,
	// ErrInsufficientCapacity, ErrAlreadyExists, ErrUnsupported.
	CreateVolumeFrom(ctx context.Context, id, source string, sizeBytes int64) (Volume, error)
}

// Snapshot is one snapshot as the backend sees it.
type Snapshot struct {
	// ID is the CSI snapshot id.
	ID string
	// Name is the backend-native name (file, LV, zfs snapshot).
	Name string
	// SourceVolume is the CSI volume id the snapshot was taken of, when the backend can tell.
	SourceVolume string
	// SizeBytes is the size of the source volume when the snapshot was taken: the smallest
	// volume a restore makes.
	SizeBytes int64
	// CreationTime is when the snapshot was taken.
	CreationTime time.Time
}

// GroupMember is one member of a group snapshot: snapshot SnapID of volume VolID.
type GroupMember struct {
	SnapID, VolID string
}

// GroupSnapshotter is the optional part of a Snapshotter that takes the snapshots of several
// volumes of its Store at one instant (CSI CREATE_DELETE_GET_VOLUME_GROUP_SNAPSHOT): a write
// acknowledged to any member before the instant is in every snapshot, one issued after it in
// none, as if the Store had lost power at that instant.
type GroupSnapshotter interface {
	// CreateGroupSnapshot takes the snapshots of members at one instant, all or none: when
	// every member's snapshot exists they are returned unchanged (in members' order); when
	// only some exist (a take cut short), those are removed and all are taken again, since
	// snapshots of different instants are no group. Errors: as CreateSnapshot, naming the
	// member; on error no snapshot of members is left.
	CreateGroupSnapshot(ctx context.Context, members []GroupMember) ([]Snapshot, error)
}
