package lvm

import (
	"fmt"
	"strings"

	"github.com/plinth-storage/plinth/agents/backend"
)

// maxNameLen is the longest VG or LV name, and the longest device-mapper name
// "<vg>-<lv>" with hyphens inside each doubled (DM_NAME_LEN 128 including the
// NUL; man lvm(8) "VALID NAMES").
const maxNameLen = 127

// reservedLVNames may not be LV names (man lvm(8) "VALID NAMES").
var reservedLVNames = []string{".", "..", "snapshot", "pvmove"}

// reservedLVSubstrings may not occur in LV names: lvm uses them for hidden
// sub-LVs (man lvm(8), lvm2 lib/metadata/lv_manip.c apply_lvname_restrictions).
var reservedLVSubstrings = []string{
	"_cdata", "_cmeta", "_corig", "_cpool", "_cvol", "_imeta", "_iorig", "_mimage", "_mlog",
	"_pmspare", "_rimage", "_rmeta", "_tdata", "_tmeta", "_vdata", "_vorigin", "_wcorig",
}

// LVName maps a CSI volume id to its LV name in vg. The id ("vol-" + 40 hex,
// see backend.VolumeID) is already a safe LV name, so the LV carries it
// verbatim: an operator reading `lvs` sees the VolumeState name. Errors
// (ErrInvalidArgument) for a malformed id or when the dm name would exceed
// the limit because vg is long.
func LVName(vg, volumeID string) (string, error) {
	if err := backend.ValidateVolumeID(volumeID); err != nil {
		return "", err
	}
	if err := ValidateNames(vg, volumeID); err != nil {
		return "", err
	}
	return volumeID, nil
}

// ValidateNames checks a VG name and an LV name against LVM's rules: each
// 1..127 bytes of [A-Za-z0-9+_.-] without a leading '-', the LV name not
// reserved and free of reserved substrings, and the device-mapper name
// (DMName) at most 127 bytes. lv may be "" to check only the VG.
// Errors wrap backend.ErrInvalidArgument.
func ValidateNames(vg, lv string) error {
	if err := validateName("volume group", vg); err != nil {
		return err
	}
	if vg == "." || vg == ".." {
		return fmt.Errorf("volume group name %q is reserved: %w", vg, backend.ErrInvalidArgument)
	}
	if lv == "" {
		return nil
	}
	if err := validateName("logical volume", lv); err != nil {
		return err
	}
	for _, r := range reservedLVNames {
		if lv == r {
			return fmt.Errorf("logical volume name %q is reserved: %w", lv, backend.ErrInvalidArgument)
		}
	}
	for _, r := range reservedLVSubstrings {
		if strings.Contains(lv, r) {
			return fmt.Errorf("logical volume name %q contains reserved %q: %w", lv, r, backend.ErrInvalidArgument)
		}
	}
	if dm := DMName(vg, lv); len(dm) > maxNameLen {
		return fmt.Errorf("device-mapper name %q is %d bytes, over %d: %w", dm, len(dm), maxNameLen, backend.ErrInvalidArgument)
	}
	return nil
}

// DMName is the device-mapper name of vg/lv: hyphens inside each name are
// doubled and the two are joined with one hyphen (/dev/mapper/<DMName>).
func DMName(vg, lv string) string {
	return strings.ReplaceAll(vg, "-", "--") + "-" + strings.ReplaceAll(lv, "-", "--")
}

func validateName(what, name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%s name is empty: %w", what, backend.ErrInvalidArgument)
	case len(name) > maxNameLen:
		return fmt.Errorf("%s name is %d bytes, over %d: %w", what, len(name), maxNameLen, backend.ErrInvalidArgument)
	case name[0] == '-':
		return fmt.Errorf("%s name %q begins with '-': %w", what, name, backend.ErrInvalidArgument)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '+' || c == '_' || c == '.' || c == '-') {
			return fmt.Errorf("%s name %q has invalid character %q: %w", what, name, c, backend.ErrInvalidArgument)
		}
	}
	return nil
}
