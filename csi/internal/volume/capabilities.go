package volume

import (
	"errors"
	"fmt"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

// SupportedModes are the access modes the driver serves: RWO, RWOP (and
// SINGLE_NODE_MULTI_WRITER, which the capability brings), single-node read-only, and ROX.
var SupportedModes = []csipb.VolumeCapability_AccessMode_Mode{
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER,
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_READER_ONLY,
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER,
	csipb.VolumeCapability_AccessMode_SINGLE_NODE_MULTI_WRITER,
	csipb.VolumeCapability_AccessMode_MULTI_NODE_READER_ONLY,
}

// CheckCapabilities returns the volume mode ("Block" or "Filesystem") and the fs_type the
// capabilities ask for, or why they are unsupported (a plain error: the caller says which kind,
// or reports it in ValidateVolumeCapabilities' message).
func CheckCapabilities(caps []*csipb.VolumeCapability) (mode, fsType string, err error) {
	if len(caps) == 0 {
		return "", "", errors.New("volume capabilities are required")
	}
	for _, c := range caps {
		if c.GetAccessMode() == nil || !slices.Contains(SupportedModes, c.GetAccessMode().GetMode()) {
			return "", "", fmt.Errorf("access mode %v is not supported", c.GetAccessMode().GetMode())
		}
		m := ""
		switch {
		case c.GetBlock() != nil:
			m = "Block"
		case c.GetMount() != nil:
			m = "Filesystem"
			switch t := c.GetMount().GetFsType(); t {
			case "", "ext4", "xfs":
				if t != "" {
					if fsType != "" && fsType != t {
						return "", "", errors.New("capabilities ask for two filesystems")
					}
					fsType = t
				}
			default:
				return "", "", fmt.Errorf("filesystem %q is not supported (ext4, xfs)", t)
			}
		default:
			return "", "", errors.New("capability has neither block nor mount access type")
		}
		if mode != "" && mode != m {
			return "", "", errors.New("capabilities mix block and mount access")
		}
		mode = m
	}
	return mode, fsType, nil
}
