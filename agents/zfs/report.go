package zfs

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"

	"github.com/plinth-storage/plinth/internal/identity"
)

// PropManaged is the user property (zfsprops(7) "User Properties") Plinth
// sets to ManagedValue on every zvol it creates: a zvol carrying it under the
// parent dataset is Plinth's (adopted after a crash); one without it is
// someone else's and is never listed, resized or destroyed.
const PropManaged = "plinth.dev:managed"

// ManagedValue is PropManaged's value on Plinth's zvols.
const ManagedValue = "true"

// PropIdentity is the user property holding a zvol's identity stamp
// (identity.ZFSProperty; docs/design.md "Volume identity stamp").
const PropIdentity = identity.ZFSProperty

// datasetFields are the columns of every `zfs list -Hp -o` the backend runs,
// in this order (ParseDatasets). The user properties are last, their values
// the only free text: -H ends the last at the line's end, and a tab inside
// PropManaged's value (a hand edit) shifts text into PropIdentity's column,
// whose stamp then fails to decode (torn, never adopted) rather than being
// read as another's.
var datasetFields = []string{"name", "type", "used", "available", "referenced", "volsize", "volblocksize", "refreservation", PropManaged, PropIdentity}

// Dataset is one row of `zfs list -Hp -o <datasetFields>`. Byte counts are
// exact (-p); properties that do not apply (volsize of a filesystem) are 0.
type Dataset struct {
	// Name is the full dataset name, "<pool>/<path>".
	Name string
	// Type is "filesystem", "volume", "snapshot" or "bookmark".
	Type string
	// UsedBytes is the space the dataset and its descendants consume,
	// including a thick zvol's refreservation.
	UsedBytes int64
	// AvailableBytes is the space available to the dataset and its children
	// (pool free space less reservations, slop space and quotas).
	AvailableBytes int64
	// ReferencedBytes is the data the dataset references (written blocks).
	ReferencedBytes int64
	// VolSizeBytes is a zvol's logical size (0 for filesystems).
	VolSizeBytes int64
	// VolBlockSizeBytes is a zvol's volblocksize (0 for filesystems).
	VolBlockSizeBytes int64
	// RefReservationBytes is the refreservation: ~volsize plus metadata for
	// a thick zvol, 0 for a sparse one.
	RefReservationBytes int64
	// Managed is PropManaged's value, "" when unset.
	Managed string
	// Identity is PropIdentity's value, "" when unset.
	Identity string
}

// IsVolume reports whether the dataset is a zvol.
func (d Dataset) IsVolume() bool { return d.Type == "volume" }

// SnapshotBytes is the space the dataset's snapshots hold alone (zfs usedbysnapshots), derived
// from the listed properties: used = referenced + usedbysnapshots + the part of the
// refreservation not yet written (zfsprops(7) "usedby*"; a zvol has no children). Clamped at 0.
func (d Dataset) SnapshotBytes() int64 {
	unused := max(d.RefReservationBytes-d.ReferencedBytes, 0)
	return max(d.UsedBytes-d.ReferencedBytes-unused, 0)
}

// Sparse reports whether a zvol has no refreservation (zfs create -s).
func (d Dataset) Sparse() bool { return d.IsVolume() && d.RefReservationBytes == 0 }

// ParseDatasets parses the output of
// `zfs list -Hp -o name,type,used,available,referenced,volsize,volblocksize,refreservation,plinth.dev:managed,plinth.dev:identity`:
// one line per dataset, fields separated by one tab, "-" for a property that
// does not apply or is unset. Errors name the line and field.
func ParseDatasets(out []byte) ([]Dataset, error) {
	var ds []Dataset
	for i, line := range lines(out) {
		f := strings.SplitN(line, "\t", len(datasetFields))
		if len(f) != len(datasetFields) {
			return nil, fmt.Errorf("zfs list line %d: %d fields, want %d: %q", i+1, len(f), len(datasetFields), line)
		}
		d := Dataset{Name: f[0], Type: f[1]}
		if d.Name == "" || d.Type == "" {
			return nil, fmt.Errorf("zfs list line %d: empty name or type: %q", i+1, line)
		}
		for j, p := range []*int64{&d.UsedBytes, &d.AvailableBytes, &d.ReferencedBytes, &d.VolSizeBytes, &d.VolBlockSizeBytes, &d.RefReservationBytes} {
			v, err := parseBytes(f[2+j])
			if err != nil {
				return nil, fmt.Errorf("zfs list line %d (%s): %s: %w", i+1, d.Name, datasetFields[2+j], err)
			}
			*p = v
		}
		if m := f[len(f)-2]; m != "-" {
			d.Managed = m
		}
		if id := f[len(f)-1]; id != "-" {
			d.Identity = id
		}
		ds = append(ds, d)
	}
	return ds, nil
}

// poolFields are the columns of `zpool list -Hp -o` (ParsePools).
var poolFields = []string{"name", "size", "allocated", "free", "health"}

// Pool is one row of `zpool list -Hp -o name,size,allocated,free,health`.
// Sizes are raw vdev space (parity included for raidz), in bytes.
type Pool struct {
	Name           string
	SizeBytes      int64
	AllocatedBytes int64
	FreeBytes      int64
	// Health is ONLINE, DEGRADED, FAULTED, OFFLINE, UNAVAIL or REMOVED.
	Health string
}

// ParsePools parses `zpool list -Hp -o name,size,allocated,free,health`.
func ParsePools(out []byte) ([]Pool, error) {
	var ps []Pool
	for i, line := range lines(out) {
		f := strings.Split(line, "\t")
		if len(f) != len(poolFields) {
			return nil, fmt.Errorf("zpool list line %d: %d fields, want %d: %q", i+1, len(f), len(poolFields), line)
		}
		p := Pool{Name: f[0], Health: f[4]}
		if p.Name == "" {
			return nil, fmt.Errorf("zpool list line %d: empty name: %q", i+1, line)
		}
		for j, v := range []*int64{&p.SizeBytes, &p.AllocatedBytes, &p.FreeBytes} {
			n, err := parseBytes(f[1+j])
			if err != nil {
				return nil, fmt.Errorf("zpool list line %d (%s): %s: %w", i+1, p.Name, poolFields[1+j], err)
			}
			*v = n
		}
		ps = append(ps, p)
	}
	return ps, nil
}

func lines(out []byte) []string {
	var ls []string
	for _, l := range bytes.Split(out, []byte("\n")) {
		if s := strings.TrimRight(string(l), "\r"); s != "" {
			ls = append(ls, s)
		}
	}
	return ls
}

// parseBytes reads an exact (-p) byte count; "-" (not applicable) is 0.
func parseBytes(s string) (int64, error) {
	if s == "-" {
		return 0, nil
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("not a byte count: %q", s)
	}
	if n < 0 {
		return 0, fmt.Errorf("negative byte count: %q", s)
	}
	return n, nil
}
