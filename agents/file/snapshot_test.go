package file

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
)

var (
	volA = backend.VolumeID("snapshot test source")
	volB = backend.VolumeID("snapshot test restore")
)

const (
	snapA = "snap-" + "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	snapB = "snap-" + "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

func writeAt(t *testing.T, path string, off int64, data []byte) {
	t.Helper()
	fh, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	if _, err := fh.WriteAt(data, off); err != nil {
		t.Fatal(err)
	}
	if err := fh.Sync(); err != nil {
		t.Fatal(err)
	}
}

func readAt(t *testing.T, path string, off int64, n int) []byte {
	t.Helper()
	fh, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer fh.Close()
	b := make([]byte, n)
	if _, err := fh.ReadAt(b, off); err != nil {
		t.Fatal(err)
	}
	return b
}

func allocated(t *testing.T, path string) int64 {
	t.Helper()
	st, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	return st.Sys().(*syscall.Stat_t).Blocks * 512
}

// TestSparseCopy copies a file with holes: the data is the same and the holes stay holes (the
// copy allocates about what the source's data takes, not its size). It needs no loop device.
func TestSparseCopy(t *testing.T) {
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	const size = 64 << 20
	if err := os.WriteFile(src, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(src, size); err != nil {
		t.Fatal(err)
	}
	data := make([]byte, 1<<20)
	rand.Read(data)
	writeAt(t, src, 8<<20, data)
	writeAt(t, src, 40<<20, data)
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	dst := filepath.Join(dir, "dst")
	out, err := os.Create(dst)
	if err != nil {
		t.Fatal(err)
	}
	if err := sparseCopy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Truncate(size); err != nil {
		t.Fatal(err)
	}
	out.Close()
	for _, off := range []int64{0, 8 << 20, 40 << 20, size - (1 << 20)} {
		if !bytes.Equal(readAt(t, src, off, 1<<20), readAt(t, dst, off, 1<<20)) {
			t.Errorf("copy differs at offset %d", off)
		}
	}
	// the filesystem may round extents; 16 MiB is far below the 64 MiB a full copy takes
	if a := allocated(t, dst); a > 16<<20 {
		t.Errorf("copy allocates %d bytes for 2 MiB of data: holes were filled", a)
	}
}

// TestSnapshotRestoreClone takes a snapshot of a volume with data written through its loop
// device, changes the volume, restores the snapshot into a larger volume and clones the
// volume: each holds the data of its moment; deleting the snapshot leaves the restore intact.
func TestSnapshotRestoreClone(t *testing.T) {
	requireLoop(t)
	ctx := context.Background()
	f := newBackend(t, Config{})
	t.Cleanup(func() { f.DeleteSnapshot(ctx, snapA) }) //nolint:errcheck
	const size = 8 << 20
	vol, err := f.Create(ctx, volA, size)
	if err != nil {
		t.Fatal(err)
	}
	before := make([]byte, 1<<20)
	rand.Read(before)
	writeAt(t, vol.DevicePath, 1<<20, before) // through the loop device, as a filesystem would

	snap, err := f.CreateSnapshot(ctx, snapA, volA)
	if err != nil {
		t.Fatal(err)
	}
	if snap.SizeBytes != size || snap.SourceVolume != volA || snap.CreationTime.IsZero() {
		t.Errorf("snapshot = %+v, want %d bytes of %s with a creation time", snap, size, volA)
	}
	if again, err := f.CreateSnapshot(ctx, snapA, volA); err != nil || again != snap {
		t.Errorf("CreateSnapshot again = %+v, %v; want %+v (idempotent)", again, err, snap)
	}
	if _, err := f.CreateSnapshot(ctx, snapA, volB); !errors.Is(err, backend.ErrAlreadyExists) {
		t.Errorf("CreateSnapshot of another volume under the same id: %v, want ErrAlreadyExists", err)
	}
	if got, err := f.GetSnapshot(ctx, snapA); err != nil || got != snap {
		t.Errorf("GetSnapshot = %+v, %v", got, err)
	}
	// The snapshot holds at least the 1 MiB of data written (a reflink may share it, a sparse
	// copy holds its own blocks), counted apart from the provisioned volumes.
	if c, err := f.Capacity(ctx); err != nil || c.SnapshotBytes < 1<<20 || c.ProvisionedBytes != size {
		t.Errorf("Capacity = %+v, %v; want ≥ 1 MiB of snapshots and only the volume provisioned", c, err)
	}
	after := make([]byte, 1<<20)
	rand.Read(after)
	writeAt(t, vol.DevicePath, 1<<20, after)

	// a restore asked smaller than the snapshot gets the snapshot's size, a larger one its own
	small, err := f.CreateVolumeFrom(ctx, volB, snapA, size/2)
	if err != nil {
		t.Fatal(err)
	}
	if small.SizeBytes != size || devSize(t, small.DevicePath) != size {
		t.Errorf("restore asked at %d bytes: %d bytes (device %d), want the snapshot's %d", size/2, small.SizeBytes, devSize(t, small.DevicePath), size)
	}
	if !bytes.Equal(readAt(t, small.DevicePath, 1<<20, 1<<20), before) {
		t.Error("restore does not hold the data of the snapshot's moment")
	}
	volC := "vol-" + "cccccccccccccccccccccccccccccccccccccccc"
	big, err := f.CreateVolumeFrom(ctx, volC, snapA, size+5000)
	if err != nil {
		t.Fatal(err)
	}
	if want := int64(size + 2*UnitBytes); big.SizeBytes != want || devSize(t, big.DevicePath) != want {
		t.Errorf("restore asked at %d bytes: %d, want %d (rounded up to %d)", size+5000, big.SizeBytes, want, UnitBytes)
	}
	volD := "vol-" + "dddddddddddddddddddddddddddddddddddddddd"
	clone, err := f.CreateVolumeFrom(ctx, volD, volA, size)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(readAt(t, clone.DevicePath, 1<<20, 1<<20), after) {
		t.Error("clone does not hold the source's current data")
	}

	if err := f.DeleteSnapshot(ctx, snapA); err != nil {
		t.Fatal(err)
	}
	if err := f.DeleteSnapshot(ctx, snapA); err != nil {
		t.Errorf("DeleteSnapshot of a deleted snapshot: %v, want success", err)
	}
	if _, err := f.GetSnapshot(ctx, snapA); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("GetSnapshot after delete: %v, want ErrNotFound", err)
	}
	if !bytes.Equal(readAt(t, big.DevicePath, 1<<20, 1<<20), before) {
		t.Error("restore lost its data when the snapshot was deleted")
	}
	if _, err := f.CreateVolumeFrom(ctx, "vol-"+"eeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeeee", snapB, size); !errors.Is(err, backend.ErrNotFound) {
		t.Errorf("restore of a missing snapshot: %v, want ErrNotFound", err)
	}
	if _, err := f.CreateSnapshot(ctx, "snap-x", volA); !errors.Is(err, backend.ErrInvalidArgument) {
		t.Errorf("snapshot id snap-x: %v, want ErrInvalidArgument", err)
	}
	// snapshots are not volumes
	vols, err := f.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(vols) != 4 {
		t.Errorf("List = %d volumes, want 4 (the source, two restores, the clone)", len(vols))
	}
}
