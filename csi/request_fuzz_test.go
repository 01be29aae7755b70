package csi

import (
	"errors"
	"math"
	"math/big"
	"slices"
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// FuzzRoundSize feeds arbitrary CapacityRange bounds and store allocation units to RoundSize.
// Properties: an accepted size is positive, a multiple of the unit and within the range
// (InRange agrees); a refusal wraps ErrOutOfRange and happens only when no positive multiple
// of the unit fits (counted in big integers, so no overflow hides one).
func FuzzRoundSize(f *testing.F) {
	f.Add(int64(1), int64(0), int64(4<<20))
	f.Add(int64(1073741825), int64(2147483648), int64(4<<20))
	f.Add(int64(0), int64(10<<20+5), int64(4<<20))
	f.Add(int64(math.MaxInt64-1), int64(0), int64(4<<20))
	f.Fuzz(func(t *testing.T, req, lim, unit int64) {
		got, err := RoundSize(req, lim, unit)
		u := unit
		if u <= 0 {
			u = DefaultExtentBytes
		}
		if err == nil {
			if got <= 0 || got < req || (lim > 0 && got > lim) || got%u != 0 || !InRange(got, req, lim) {
				t.Fatalf("RoundSize(%d, %d, %d) = %d", req, lim, unit, got)
			}
			return
		}
		if !errors.Is(err, ErrOutOfRange) {
			t.Fatalf("RoundSize(%d, %d, %d): %v does not wrap ErrOutOfRange", req, lim, unit, err)
		}
		if req < 0 || lim < 0 || (lim > 0 && req > lim) {
			return
		}
		// the smallest positive multiple of u at or above req (the default size when req is 0
		// may be rounded down to the limit instead)
		bu := big.NewInt(u)
		least := new(big.Int).Mul(new(big.Int).Div(new(big.Int).Add(big.NewInt(max(req, 1)), big.NewInt(u-1)), bu), bu)
		if req == 0 && lim > 0 {
			least = bu
		}
		top := big.NewInt(math.MaxInt64)
		if lim > 0 {
			top = big.NewInt(lim)
		}
		if least.Cmp(top) <= 0 {
			t.Fatalf("RoundSize(%d, %d, %d): %v, but %s fits", req, lim, unit, err, least)
		}
	})
}

// secretMarker stands for every secret value in FuzzStripSecrets.
const secretMarker = "s3cr3t-marker-9f2c"

// FuzzStripSecrets decodes arbitrary bytes as each CSI request that carries secrets (what a CO
// sends on the socket), puts secretMarker into every csi_secret field and into an unknown field
// (a secret field of a newer CSI spec), and logs it as the interceptor does. Properties: the
// log text never holds the marker, and the request itself is left unchanged.
func FuzzStripSecrets(f *testing.F) {
	msgs := []proto.Message{
		&csipb.CreateVolumeRequest{}, &csipb.DeleteVolumeRequest{}, &csipb.ControllerPublishVolumeRequest{},
		&csipb.ControllerUnpublishVolumeRequest{}, &csipb.ValidateVolumeCapabilitiesRequest{}, &csipb.ListSnapshotsRequest{},
		&csipb.CreateSnapshotRequest{}, &csipb.DeleteSnapshotRequest{}, &csipb.ControllerExpandVolumeRequest{},
		&csipb.NodeStageVolumeRequest{}, &csipb.NodePublishVolumeRequest{}, &csipb.NodeExpandVolumeRequest{},
	}
	seed, _ := proto.Marshal(&csipb.CreateVolumeRequest{
		Name: "pvc-1", Secrets: map[string]string{"k": "v"}, Parameters: map[string]string{"placement": "fast"},
		VolumeCapabilities: []*csipb.VolumeCapability{{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}}}},
	})
	f.Add(uint8(0), seed)
	stage, _ := proto.Marshal(&csipb.NodeStageVolumeRequest{VolumeId: "vol-1", Secrets: map[string]string{"password": "x"}})
	f.Add(uint8(9), stage)
	f.Fuzz(func(t *testing.T, which uint8, wire []byte) {
		m := msgs[int(which)%len(msgs)].ProtoReflect().New().Interface()
		if err := proto.Unmarshal(wire, m); err != nil {
			return
		}
		plantSecrets(m.ProtoReflect())
		unk := protowire.AppendTag(nil, 9999, protowire.BytesType)
		m.ProtoReflect().SetUnknown(append(m.ProtoReflect().GetUnknown(), protowire.AppendString(unk, secretMarker)...))
		before := proto.Clone(m)
		if got := stripSecrets(m); strings.Contains(got, secretMarker) {
			t.Fatalf("%T logged a secret: %s", m, got)
		}
		if !proto.Equal(before, m) {
			t.Fatalf("stripSecrets changed the %T it logged", m)
		}
	})
}

// plantSecrets sets secretMarker as the value of every entry of every csi_secret map (adding
// one entry to an empty map) throughout m.
func plantSecrets(m protoreflect.Message) {
	fields := m.Descriptor().Fields()
	for i := 0; i < fields.Len(); i++ {
		fd := fields.Get(i)
		if secret, _ := proto.GetExtension(fd.Options(), csipb.E_CsiSecret).(bool); secret && fd.IsMap() {
			mp := m.Mutable(fd).Map()
			mp.Set(protoreflect.ValueOfString("planted").MapKey(), protoreflect.ValueOfString(secretMarker))
			mp.Range(func(k protoreflect.MapKey, _ protoreflect.Value) bool {
				mp.Set(k, protoreflect.ValueOfString(secretMarker))
				return true
			})
			continue
		}
		if !m.Has(fd) || fd.Message() == nil || fd.IsMap() {
			continue
		}
		if fd.IsList() {
			l := m.Get(fd).List()
			for j := 0; j < l.Len(); j++ {
				plantSecrets(l.Get(j).Message())
			}
			continue
		}
		plantSecrets(m.Mutable(fd).Message())
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
		mode, fsType, err := checkCapabilities(caps)
		broken := len(caps) == 0
		types, filesystems := map[string]bool{}, map[string]bool{}
		for _, c := range caps {
			if c.GetAccessMode() == nil || !slices.Contains(supportedModes, c.GetAccessMode().GetMode()) {
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
