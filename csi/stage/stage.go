// Package stage keeps the node plugin's stage records: one small JSON file per staged volume
// holding what NodeUnstageVolume needs, because the CO sends only the volume id and the staging
// path at unstage (CSI spec, NodeUnstageVolumeRequest) and the plugin may have restarted since,
// its memory gone. Records are written atomically: temp file in the same folder, fsync, rename,
// fsync of the folder — a crash leaves either the old record or the new one, never half of one.
package stage

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Kinds of transport a staged volume uses.
const (
	// KindLocal is a block device on this node (LV, zvol, loop device of the file backend).
	KindLocal = "local"
	// KindNVMeoFTCP is a namespace of an NVMe-oF/TCP subsystem this node connected to.
	KindNVMeoFTCP = "nvmeofTcp"
)

// Record is what NodeStageVolume did for one volume.
type Record struct {
	// VolumeID is the CSI volume id.
	VolumeID string `json:"volumeID"`
	// StagingPath is the staging_target_path the CO gave.
	StagingPath string `json:"stagingPath"`
	// Kind is KindLocal or KindNVMeoFTCP.
	Kind string `json:"kind"`
	// Device is the block device path the volume was found at when staged, e.g. /dev/nvme1n1.
	Device string `json:"device,omitempty"`
	// NQN is the subsystem NQN for KindNVMeoFTCP (disconnect by NQN at unstage).
	NQN string `json:"nqn,omitempty"`
	// Block is true for raw block volumes (nothing mounted at StagingPath).
	Block bool `json:"block,omitempty"`
	// FSType is the filesystem mounted at StagingPath (ext4, xfs) for mount volumes.
	FSType string `json:"fsType,omitempty"`
	// Crypt is the dm-crypt mapping name of an encrypted volume (Device is then
	// /dev/mapper/<Crypt>), and Backing the device it is opened on (the LV, or the NVMe-oF
	// namespace); both empty for a clear volume.
	Crypt   string `json:"crypt,omitempty"`
	Backing string `json:"backing,omitempty"`
	// Targets are the NodePublishVolume target paths the volume is published at, with
	// SingleWriter set when one of them was published SINGLE_NODE_SINGLE_WRITER (RWOP: no
	// second target on the node, CSI spec NodePublishVolume errors).
	Targets      []string `json:"targets,omitempty"`
	SingleWriter bool     `json:"singleWriter,omitempty"`
	// PodUIDs maps each target to the UID of the pod it was published for (kubelet's volume
	// context with podInfoOnMount), whose cgroup gets the volume's I/O limits.
	PodUIDs map[string]string `json:"podUIDs,omitempty"`
}

// Dir is a folder of records, one file <volume id>.json each.
type Dir struct {
	// Path of the folder, such as /var/lib/plinth/node; created on first Save.
	Path string
}

// ErrNotFound is returned by Load when no record exists for the volume.
var ErrNotFound = errors.New("no stage record")

// ErrCorrupt is returned by Load for a record that exists but cannot be trusted: empty,
// truncated, not JSON, naming another volume or lacking what unstage needs. Callers report it
// and act on nothing: a guess could unmount or disconnect the wrong thing, or skip a disconnect.
var ErrCorrupt = errors.New("corrupt stage record")

// tempPrefix starts the name of a record being written; a crash between create and rename
// leaves such a file behind, which CleanTemp removes.
const tempPrefix = ".tmp-"

func (d Dir) file(volumeID string) (string, error) {
	if volumeID == "" || strings.ContainsAny(volumeID, "/\x00") || volumeID == "." || volumeID == ".." {
		return "", fmt.Errorf("volume id %q cannot name a stage record", volumeID)
	}
	return filepath.Join(d.Path, volumeID+".json"), nil
}

// Save writes r atomically (temp file + fsync + rename + fsync of the folder).
func (d Dir) Save(r Record) error {
	path, err := d.file(r.VolumeID)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(d.Path, 0o700); err != nil {
		return fmt.Errorf("create stage folder: %w", err)
	}
	data, err := json.Marshal(r)
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(d.Path, tempPrefix+r.VolumeID+"-*")
	if err != nil {
		return fmt.Errorf("create stage record: %w", err)
	}
	defer os.Remove(tmp.Name()) // no-op after the rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return fmt.Errorf("write stage record: %w", err)
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("fsync stage record: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("close stage record: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("rename stage record: %w", err)
	}
	return syncDir(d.Path)
}

// Load reads the record of a volume; ErrNotFound when there is none. A record that does not
// parse or lacks what unstage needs is ErrCorrupt (with the file named), never "absent":
// unstage must not silently skip a disconnect.
func (d Dir) Load(volumeID string) (Record, error) {
	path, err := d.file(volumeID)
	if err != nil {
		return Record{}, err
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return Record{}, ErrNotFound
	}
	if err != nil {
		return Record{}, fmt.Errorf("read stage record: %w", err)
	}
	if len(data) == 0 {
		return Record{}, fmt.Errorf("%w: %s is empty", ErrCorrupt, path)
	}
	var r Record
	if err := json.Unmarshal(data, &r); err != nil {
		return Record{}, fmt.Errorf("%w: %s (%d bytes): %v", ErrCorrupt, path, len(data), err)
	}
	switch {
	case r.VolumeID != volumeID:
		return Record{}, fmt.Errorf("%w: %s names volume %q", ErrCorrupt, path, r.VolumeID)
	case r.StagingPath == "":
		return Record{}, fmt.Errorf("%w: %s has no staging path", ErrCorrupt, path)
	case r.Kind != KindLocal && r.Kind != KindNVMeoFTCP:
		return Record{}, fmt.Errorf("%w: %s has kind %q, want %s or %s", ErrCorrupt, path, r.Kind, KindLocal, KindNVMeoFTCP)
	case r.Kind == KindNVMeoFTCP && r.NQN == "":
		return Record{}, fmt.Errorf("%w: %s is NVMe-oF without a subsystem NQN", ErrCorrupt, path)
	}
	return r, nil
}

// Remove deletes the record of a volume; absent is success.
func (d Dir) Remove(volumeID string) error {
	path, err := d.file(volumeID)
	if err != nil {
		return err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stage record: %w", err)
	}
	return syncDir(d.Path)
}

// List returns every record in the folder (for diagnostics and NodeGetVolumeStats lookups).
func (d Dir) List() ([]Record, error) {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	for _, e := range entries {
		name := e.Name()
		if !strings.HasSuffix(name, ".json") || strings.HasPrefix(name, ".") {
			continue
		}
		r, err := d.Load(strings.TrimSuffix(name, ".json"))
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, nil
}

// CleanTemp removes the temp files of records whose write a crash interrupted (before the
// rename: the record itself is the old one, or none) and returns their names. Call it before
// the first Save of a process: a Save running meanwhile would lose its temp file.
func (d Dir) CleanTemp() ([]string, error) {
	entries, err := os.ReadDir(d.Path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read stage folder: %w", err)
	}
	var removed []string
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), tempPrefix) || !e.Type().IsRegular() {
			continue
		}
		if err := os.Remove(filepath.Join(d.Path, e.Name())); err != nil && !errors.Is(err, os.ErrNotExist) {
			return removed, fmt.Errorf("remove stage temp file: %w", err)
		}
		removed = append(removed, e.Name())
	}
	if len(removed) > 0 {
		return removed, syncDir(d.Path)
	}
	return nil, nil
}

func syncDir(path string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil
		}
		return err
	}
	defer f.Close()
	if err := f.Sync(); err != nil {
		return fmt.Errorf("fsync stage folder: %w", err)
	}
	return nil
}
