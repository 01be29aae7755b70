package stage

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestSaveLoadRemove(t *testing.T) {
	d := Dir{Path: filepath.Join(t.TempDir(), "node")}
	if _, err := d.Load("vol-1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("Load of absent record: %v, want ErrNotFound", err)
	}
	r := Record{VolumeID: "vol-1", StagingPath: "/s", Kind: KindNVMeoFTCP, Device: "/dev/nvme1n1", NQN: "nqn.2014-08.dev.plinth:vol-1", FSType: "xfs"}
	if err := d.Save(r); err != nil {
		t.Fatal(err)
	}
	// A fresh Dir value stands for a restarted plugin (B19): only the disk holds the record.
	got, err := Dir{Path: d.Path}.Load("vol-1")
	if err != nil {
		t.Fatal(err)
	}
	if got.VolumeID != r.VolumeID || got.Device != r.Device || got.NQN != r.NQN || got.Kind != r.Kind || got.FSType != r.FSType {
		t.Errorf("Load = %+v, want %+v", got, r)
	}
	r.Device = "/dev/nvme2n1"
	if err := d.Save(r); err != nil {
		t.Fatal(err)
	}
	if got, _ := d.Load("vol-1"); got.Device != "/dev/nvme2n1" {
		t.Errorf("overwrite kept %q", got.Device)
	}
	entries, _ := os.ReadDir(d.Path)
	if len(entries) != 1 {
		t.Errorf("folder holds %d files, want 1 (no temp files left)", len(entries))
	}
	list, err := d.List()
	if err != nil || len(list) != 1 {
		t.Errorf("List = %v, %v", list, err)
	}
	if err := d.Remove("vol-1"); err != nil {
		t.Fatal(err)
	}
	if err := d.Remove("vol-1"); err != nil {
		t.Errorf("second Remove: %v", err)
	}
	if _, err := d.Load("vol-1"); !errors.Is(err, ErrNotFound) {
		t.Errorf("Load after Remove: %v", err)
	}
}

func TestCorruptRecordIsAnError(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	if err := os.WriteFile(filepath.Join(d.Path, "vol-2.json"), []byte("{trunc"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := d.Load("vol-2"); err == nil || errors.Is(err, ErrNotFound) {
		t.Errorf("Load of a corrupt record = %v, want a parse error (never 'absent')", err)
	}
}

func TestBadVolumeIDs(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	for _, id := range []string{"", "a/b", "..", "."} {
		if err := d.Save(Record{VolumeID: id}); err == nil {
			t.Errorf("Save(%q) succeeded", id)
		}
	}
}
