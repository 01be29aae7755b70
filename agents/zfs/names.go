package zfs

import (
	"fmt"
	"strings"

	"github.com/plinth-storage/plinth/agents/backend"
)

// MaxNameLen is the longest zvol name Plinth makes, in bytes. ZFS allows 255
// (ZFS_MAX_DATASET_NAME_LEN 256 with the NUL), but a pool holding a 255-byte
// name could not be imported (openzfs/zfs #5432), so Plinth keeps every
// generated name at 254 bytes or less.
const MaxNameLen = 254

// MaxPoolNameLen is the longest pool name the policy accepts (StoragePool
// zfs.pool, schema/cue/policy.cue).
const MaxPoolNameLen = 63

// reservedPoolPrefixes may not begin a pool name: zpool(8) uses them as vdev
// keywords (OpenZFS module/zcommon/zfs_namecheck.c pool_namecheck).
var reservedPoolPrefixes = []string{"mirror", "raidz", "draid", "spare"}

// ZvolName maps a CSI volume id to the zvol's dataset name
// "<pool>/<parent>/<id>" (parent may be "": "<pool>/<id>"). The id ("vol-" +
// 40 hex, backend.VolumeID) is already a valid ZFS component, so the zvol
// carries it verbatim: an operator reading `zfs list` sees the VolumeState
// name, and the name is the same on every retry. Errors (wrapping
// backend.ErrInvalidArgument): a malformed id, or names that break
// ValidateParent.
func ZvolName(pool, parent, volumeID string) (string, error) {
	if err := backend.ValidateVolumeID(volumeID); err != nil {
		return "", err
	}
	if err := ValidateParent(pool, parent); err != nil {
		return "", err
	}
	return ParentName(pool, parent) + "/" + volumeID, nil
}

// ParentName is the dataset holding the zvols: "<pool>/<parent>", or the
// pool's root dataset when parent is "".
func ParentName(pool, parent string) string {
	if parent == "" {
		return pool
	}
	return pool + "/" + parent
}

// ValidateParent checks a pool name and a parent dataset path (relative to
// the pool, "" for the pool's root dataset) against ZFS's naming rules
// (zfs(8) "Naming"; OpenZFS zfs_namecheck.c), restricted to the characters
// Plinth allows, [A-Za-z0-9_.:-]:
//   - pool: 1..63 bytes, begins with a letter, not "log" nor beginning with a
//     vdev keyword (mirror, raidz, draid, spare) or "c<digit>" (disk-like);
//   - parent: '/'-separated components of those characters, none empty, "."
//     or "..";
//   - a zvol name "<pool>/<parent>/<volume id>" must fit MaxNameLen, so a
//     parent too long for any volume is refused here, before any command runs.
//
// Errors wrap backend.ErrInvalidArgument.
func ValidateParent(pool, parent string) error {
	switch {
	case pool == "":
		return fmt.Errorf("pool name is empty: %w", backend.ErrInvalidArgument)
	case len(pool) > MaxPoolNameLen:
		return fmt.Errorf("pool name is %d bytes, over %d: %w", len(pool), MaxPoolNameLen, backend.ErrInvalidArgument)
	case !isLetter(pool[0]):
		return fmt.Errorf("pool name %q must begin with a letter: %w", pool, backend.ErrInvalidArgument)
	case pool == "log":
		return fmt.Errorf("pool name %q is reserved: %w", pool, backend.ErrInvalidArgument)
	case len(pool) > 1 && pool[0] == 'c' && pool[1] >= '0' && pool[1] <= '9':
		return fmt.Errorf("pool name %q looks like a disk (c<digit>...): %w", pool, backend.ErrInvalidArgument)
	}
	for _, r := range reservedPoolPrefixes {
		if strings.HasPrefix(pool, r) {
			return fmt.Errorf("pool name %q begins with the reserved %q: %w", pool, r, backend.ErrInvalidArgument)
		}
	}
	if err := validComponent("pool", pool); err != nil {
		return err
	}
	if parent != "" {
		for _, c := range strings.Split(parent, "/") {
			if err := validComponent("parent dataset", c); err != nil {
				return fmt.Errorf("parent dataset %q: %w", parent, err)
			}
		}
	}
	if n := len(ParentName(pool, parent)) + 1 + len(backend.VolumeIDPrefix) + 40; n > MaxNameLen {
		return fmt.Errorf("zvol names %q would be %d bytes, over %d: shorten the pool or parentDataset: %w",
			ParentName(pool, parent)+"/vol-<40 hex>", n, MaxNameLen, backend.ErrInvalidArgument)
	}
	return nil
}

func isLetter(c byte) bool { return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' }

func validComponent(what, c string) error {
	switch c {
	case "":
		return fmt.Errorf("%s: empty name component: %w", what, backend.ErrInvalidArgument)
	case ".", "..":
		return fmt.Errorf("%s: component %q is reserved: %w", what, c, backend.ErrInvalidArgument)
	}
	for i := 0; i < len(c); i++ {
		b := c[i]
		if !(isLetter(b) || b >= '0' && b <= '9' || b == '_' || b == '.' || b == ':' || b == '-') {
			return fmt.Errorf("%s %q has invalid character %q (want [A-Za-z0-9_.:-]): %w", what, c, b, backend.ErrInvalidArgument)
		}
	}
	return nil
}

// validateProperty checks a policy property name=value before it reaches
// `zfs create -o`: the name is a native property in lower case or a user
// property ("module:property", zfsprops(7) "User Properties"), and not one
// Plinth sets itself; the value is printable, single-line and at most 8191
// bytes (ZFS_MAXPROPLEN 8192 with the NUL) so -H output stays parsable.
func validateProperty(name, value string) error {
	if name == "" || len(name) > 255 {
		return fmt.Errorf("property name %q: want 1..255 bytes: %w", name, backend.ErrInvalidArgument)
	}
	for i := 0; i < len(name); i++ {
		b := name[i]
		if !(b >= 'a' && b <= 'z' || b >= '0' && b <= '9' || b == '_' || b == '.' || b == ':' || b == '-' || b == '+') {
			return fmt.Errorf("property name %q has invalid character %q: %w", name, b, backend.ErrInvalidArgument)
		}
	}
	for _, r := range plinthProperties {
		if name == r {
			return fmt.Errorf("property %q is set by Plinth, not by policy: %w", name, backend.ErrInvalidArgument)
		}
	}
	if len(value) > 8191 {
		return fmt.Errorf("property %s: value of %d bytes, over 8191: %w", name, len(value), backend.ErrInvalidArgument)
	}
	for i := 0; i < len(value); i++ {
		if value[i] < 0x20 || value[i] == 0x7f {
			return fmt.Errorf("property %s: value has control character %q: %w", name, value[i], backend.ErrInvalidArgument)
		}
	}
	return nil
}

// plinthProperties are set by the backend from the volume and the policy's
// structured fields; policy properties may not override them.
var plinthProperties = []string{"volsize", "volblocksize", "refreservation", "reservation", PropManaged, PropIdentity}
