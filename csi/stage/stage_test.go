package stage

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
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
	// A fresh Dir value stands for a restarted plugin: only the disk holds the record.
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

// A record torn at any byte (a crash mid-write without the rename's protection, a disk that
// lost the tail), empty, garbage, or lacking what unstage needs is ErrCorrupt naming the file,
// never a record to act on and never "absent".
func TestTornAndCorruptRecords(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	good := Record{VolumeID: "vol-3", StagingPath: "/s", Kind: KindNVMeoFTCP, Device: "/dev/nvme1n1", NQN: "nqn.2014-08.dev.plinth:vol-3", FSType: "xfs"}
	if err := d.Save(good); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(d.Path, "vol-3.json")
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	bad := map[string][]byte{"garbage": []byte("\x00\x01not json"), "null": []byte("null"),
		"other volume":  []byte(`{"volumeID":"vol-4","stagingPath":"/s","kind":"local"}`),
		"no staging":    []byte(`{"volumeID":"vol-3","kind":"local"}`),
		"unknown kind":  []byte(`{"volumeID":"vol-3","stagingPath":"/s","kind":"iscsi"}`),
		"nvme, no nqn":  []byte(`{"volumeID":"vol-3","stagingPath":"/s","kind":"nvmeofTcp"}`),
		"empty (0 B)":   {},
		"torn at 1 B":   data[:1],
		"torn mid-file": data[:len(data)/2],
	}
	for n := 0; n < len(data); n++ {
		bad["torn at byte "+itoa(n)] = data[:n]
	}
	for name, b := range bad {
		if err := os.WriteFile(file, b, 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := d.Load("vol-3")
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), file) {
			t.Errorf("%s: Load = %v, want ErrCorrupt naming %s", name, err, file)
		}
		if _, err := d.List(); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: List = %v, want ErrCorrupt", name, err)
		}
	}
}

// Temp files a crash left between create and rename are removed; records stay.
func TestCleanTemp(t *testing.T) {
	d := Dir{Path: t.TempDir()}
	if err := d.Save(Record{VolumeID: "vol-5", StagingPath: "/s", Kind: KindLocal, Device: "/dev/loop0"}); err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{".tmp-vol-5-123", ".tmp-vol-6-456"} {
		if err := os.WriteFile(filepath.Join(d.Path, n), []byte(`{"volumeID":`), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	removed, err := d.CleanTemp()
	if err != nil || len(removed) != 2 {
		t.Fatalf("CleanTemp = %q, %v; want the 2 temp files", removed, err)
	}
	entries, _ := os.ReadDir(d.Path)
	if len(entries) != 1 || entries[0].Name() != "vol-5.json" {
		t.Errorf("folder after CleanTemp: %v", entries)
	}
	if _, err := d.Load("vol-5"); err != nil {
		t.Errorf("record after CleanTemp: %v", err)
	}
	if removed, err := (Dir{Path: filepath.Join(d.Path, "absent")}).CleanTemp(); err != nil || removed != nil {
		t.Errorf("CleanTemp of an absent folder: %q, %v", removed, err)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
