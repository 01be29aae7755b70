package zfs

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

// TestGuestSnapshots: snapshots, restores and clones with the real zfs in the guest, and the
// delete order of snapshot.go: data written to a zvol is in its snapshot's restore (checksum
// of the device), the snapshot deleted while the restore lives is gone for Plinth but kept by
// ZFS (defer_destroy), the source deleted before the restore is destroyed after a promote, and
// when the restore goes nothing is left under the parent.
func TestGuestSnapshots(t *testing.T) {
	requireGuest(t)
	ctx := context.Background()
	setupPool(t)
	z := mustNew(t, Config{VolBlockSize: 16 << 10, Sparse: true})
	if err := z.Ensure(ctx); err != nil {
		t.Fatal(err)
	}
	src, restored, clone := backend.VolumeID("zsnap-src"), backend.VolumeID("zsnap-restored"), backend.VolumeID("zsnap-clone")
	snap := "snap-" + strings.Repeat("5", 40)
	v, err := z.Create(ctx, src, 64<<20)
	if err != nil {
		t.Fatal(err)
	}
	dev, err := z.DevicePath(ctx, src)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, "dd", "if=/dev/urandom", "of="+dev, "bs=1M", "count=8", "conv=fsync")
	before := sh(t, "sh", "-c", "head -c 8388608 "+dev+" | sha256sum")
	s, err := z.CreateSnapshot(ctx, snap, src)
	if err != nil {
		t.Fatal(err)
	}
	if s.SizeBytes != v.SizeBytes || s.SourceVolume != src || s.CreationTime.IsZero() {
		t.Errorf("snapshot %+v", s)
	}
	sh(t, "dd", "if=/dev/urandom", "of="+dev, "bs=1M", "count=8", "conv=fsync")
	after := sh(t, "sh", "-c", "head -c 8388608 "+dev+" | sha256sum")
	// The overwritten 8 MiB now belong to the snapshot alone: the Store's snapshot space is
	// zfs's usedbysnapshots of the zvol, at least those 8 MiB (random data: no compression).
	// (space accounting follows the transaction group: zpool sync commits it first)
	sh(t, "zpool", "sync", guestPool)
	c, err := z.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ubs := sh(t, "zfs", "get", "-Hp", "-o", "value", "usedbysnapshots", v.Name)
	if fmt.Sprint(c.SnapshotBytes) != ubs || c.SnapshotBytes < 8<<20 {
		t.Errorf("snapshot space %d bytes, zfs usedbysnapshots %s, want equal and at least 8 MiB", c.SnapshotBytes, ubs)
	}
	t.Logf("MEASURE zfs snapshot space %d bytes (usedbysnapshots %s)", c.SnapshotBytes, ubs)

	r, err := z.CreateVolumeFrom(ctx, restored, snap, 128<<20)
	if err != nil {
		t.Fatal(err)
	}
	rdev, err := z.DevicePath(ctx, restored)
	if err != nil {
		t.Fatal(err)
	}
	if r.SizeBytes != 128<<20 || blockSize(t, rdev) != 128<<20 {
		t.Errorf("restore %+v, device %d bytes", r, blockSize(t, rdev))
	}
	if got := sh(t, "sh", "-c", "head -c 8388608 "+rdev+" | sha256sum"); got != before {
		t.Errorf("restore holds %s, the snapshot's moment %s", got, before)
	}
	if _, err := z.CreateVolumeFrom(ctx, clone, src, 1); err != nil {
		t.Fatal(err)
	}
	cdev, err := z.DevicePath(ctx, clone)
	if err != nil {
		t.Fatal(err)
	}
	if got := sh(t, "sh", "-c", "head -c 8388608 "+cdev+" | sha256sum"); got != after {
		t.Errorf("clone holds %s, the source %s", got, after)
	}
	if err := z.Delete(ctx, src); !errors.Is(err, backend.ErrInUse) {
		t.Errorf("delete of a zvol with a live snapshot: %v, want ErrInUse", err)
	}
	if err := z.DeleteSnapshot(ctx, snap); err != nil {
		t.Fatal(err)
	}
	if _, err := z.GetSnapshot(ctx, snap); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("GetSnapshot after delete: %v", err)
	}
	if got := sh(t, "zfs", "get", "-H", "-o", "value", "defer_destroy", v.Name+"@"+snap); got != "on" {
		t.Errorf("defer_destroy of the snapshot with a clone = %q", got)
	}
	if err := z.Delete(ctx, src); err != nil {
		t.Fatalf("delete of the source after its snapshots were deleted: %v", err)
	}
	if got := sh(t, "sh", "-c", "head -c 8388608 "+rdev+" | sha256sum"); got != before {
		t.Errorf("restore after its source was deleted holds %s, want %s", got, before)
	}
	for _, id := range []string{restored, clone} {
		if err := z.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if left := sh(t, "zfs", "list", "-H", "-r", "-t", "all", "-o", "name", guestPool+"/"+guestParent); left != guestPool+"/"+guestParent {
		t.Errorf("left under the parent:\n%s", left)
	}
}
