package file

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

func stampOf(id string, size int64) identity.Stamp {
	return identity.Stamp{VolumeID: id, PVCNamespace: "ns", PVCName: "data", PVCUID: "u-1", PVName: "pvc-u-1",
		StorageClass: "sc", Placement: "pl", SizeBytes: size, Filesystem: "ext4", VolumeMode: "Filesystem",
		PolicyDigest: "00112233445566778899aabbccddeeff", StoreUID: "store-uid"}
}

// The record beside the image round-trips through List, never changes the image's bytes, is
// reported (not read as a stamp) when torn, and goes with the volume.
func TestStampRecordBesideTheImage(t *testing.T) {
	requireLoop(t)
	ctx := context.Background()
	f := newBackend(t, Config{})
	id := backend.VolumeID("stamp")
	v, err := f.Create(ctx, id, 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(f.cfg.Directory, id+suffix)
	before, err := os.ReadFile(img)
	if err != nil {
		t.Fatal(err)
	}
	if vols, _ := f.List(ctx); len(vols) != 1 || vols[0].Stamp != nil || vols[0].StampErr != nil {
		t.Fatalf("unstamped volume listed as %+v", vols)
	}
	want := stampOf(id, v.SizeBytes)
	if err := f.Stamp(ctx, want); err != nil {
		t.Fatal(err)
	}
	vols, err := f.List(ctx)
	if err != nil || len(vols) != 1 || vols[0].Stamp == nil || *vols[0].Stamp != want {
		t.Fatalf("List after Stamp = %+v, %v; want stamp %+v", vols, err, want)
	}
	if after, _ := os.ReadFile(img); !bytes.Equal(before, after) {
		t.Fatal("stamping changed the image's bytes")
	}
	rec := filepath.Join(f.cfg.Directory, id+stampSuffix)
	text, _ := os.ReadFile(rec)
	if err := os.WriteFile(rec, text[:len(text)/2], 0o600); err != nil {
		t.Fatal(err)
	}
	vols, _ = f.List(ctx)
	if len(vols) != 1 || vols[0].Stamp != nil || !errors.Is(vols[0].StampErr, identity.ErrTorn) {
		t.Fatalf("torn record listed as %+v", vols)
	}
	if err := f.Stamp(ctx, stampOf(backend.VolumeID("absent"), 4096)); !errors.Is(err, backend.ErrNotFound) {
		t.Fatalf("Stamp of an absent volume = %v, want ErrNotFound", err)
	}
	// a crash in the middle of a stamp's write leaves its temp file: Delete removes it too
	if err := os.WriteFile(rec+".tmp", text[:3], 0o600); err != nil {
		t.Fatal(err)
	}
	if err := f.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{rec, rec + ".tmp"} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Fatalf("%s left after Delete: %v", p, err)
		}
	}
}
