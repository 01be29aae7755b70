package csi

import (
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

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
