package backend

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"regexp"
)

// VolumeIDPrefix starts every CSI volume id.
const VolumeIDPrefix = "vol-"

var volumeIDRe = regexp.MustCompile(`^vol-[0-9a-f]{40}$`)

// VolumeID derives the CSI volume id from the CSI CreateVolume name:
// "vol-" + the first 40 hex digits of sha256(name) (docs/design.md, "Names
// and keys"). It is 44 bytes of [a-z0-9-] whatever the name holds (csi-sanity
// sends 128-byte, upper-case and "/" names, which no backend takes as is).
func VolumeID(csiName string) string {
	sum := sha256.Sum256([]byte(csiName))
	return VolumeIDPrefix + hex.EncodeToString(sum[:])[:40]
}

// ValidateVolumeID returns ErrInvalidArgument unless id has the shape
// VolumeID produces.
func ValidateVolumeID(id string) error {
	if !volumeIDRe.MatchString(id) {
		return fmt.Errorf("volume id %q: want vol- and 40 lower-case hex digits: %w", id, ErrInvalidArgument)
	}
	return nil
}
