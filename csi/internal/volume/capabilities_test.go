package volume

import (
	"slices"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/proto"
)

func TestCheckCapabilities(t *testing.T) {
	mountCap := func(fs string, m csipb.VolumeCapability_AccessMode_Mode) *csipb.VolumeCapability {
		return &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: fs}}, AccessMode: &csipb.VolumeCapability_AccessMode{Mode: m}}
	}
	blockCap := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}}, AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER}}
	if m, fs, err := CheckCapabilities([]*csipb.VolumeCapability{mountCap("xfs", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)}); err != nil || m != "Filesystem" || fs != "xfs" {
		t.Errorf("xfs RWO: %s %s %v", m, fs, err)
	}
	if m, _, err := CheckCapabilities([]*csipb.VolumeCapability{blockCap}); err != nil || m != "Block" {
		t.Errorf("block RWOP: %s %v", m, err)
	}
	for name, caps := range map[string][]*csipb.VolumeCapability{
		"none":    nil,
		"btrfs":   {mountCap("btrfs", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		"RWX":     {mountCap("", csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER)},
		"mixed":   {mountCap("", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), blockCap},
		"two fs":  {mountCap("ext4", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER), mountCap("xfs", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)},
		"no type": {{AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
	} {
		if _, _, err := CheckCapabilities(caps); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// FuzzCheckCapabilities decodes arbitrary bytes as a CreateVolumeRequest and judges its volume
// capabilities. Properties: accepted capabilities are at least one, each with a supported access
// mode and the same access type (block, or mount with fs_type "", ext4 or xfs, one filesystem
// at most), and the answer names that type and filesystem; refused ones break one of those rules.
func FuzzCheckCapabilities(f *testing.F) {
	for _, caps := range [][]*csipb.VolumeCapability{
		{{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "xfs"}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}},
		{{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
			AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_MULTI_NODE_MULTI_WRITER}}},
	} {
		b, _ := proto.Marshal(&csipb.CreateVolumeRequest{Name: "pvc-1", VolumeCapabilities: caps})
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, wire []byte) {
		var req csipb.CreateVolumeRequest
		if err := proto.Unmarshal(wire, &req); err != nil {
			return
		}
		caps := req.GetVolumeCapabilities()
		mode, fsType, err := CheckCapabilities(caps)
		broken := len(caps) == 0
		types, filesystems := map[string]bool{}, map[string]bool{}
		for _, c := range caps {
			if c.GetAccessMode() == nil || !slices.Contains(SupportedModes, c.GetAccessMode().GetMode()) {
				broken = true
			}
			switch {
			case c.GetBlock() != nil:
				types["Block"] = true
			case c.GetMount() != nil:
				types["Filesystem"] = true
				switch fs := c.GetMount().GetFsType(); fs {
				case "":
				case "ext4", "xfs":
					filesystems[fs] = true
				default:
					broken = true
				}
			default:
				broken = true
			}
		}
		broken = broken || len(types) > 1 || len(filesystems) > 1
		if err != nil {
			if !broken {
				t.Fatalf("capabilities %v refused: %v", caps, err)
			}
			return
		}
		if broken || !types[mode] || (fsType != "" && !filesystems[fsType]) || (fsType == "" && len(filesystems) > 0) {
			t.Fatalf("capabilities %v accepted as %q %q", caps, mode, fsType)
		}
	})
}
