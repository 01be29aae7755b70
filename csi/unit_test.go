package csi

import (
	"strings"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
)

func TestStripSecrets(t *testing.T) {
	req := &csipb.NodeStageVolumeRequest{
		VolumeId: "vol-1",
		Secrets:  map[string]string{"password": "hunter2"},
		VolumeCapability: &csipb.VolumeCapability{
			AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "xfs"}},
		},
	}
	got := stripSecrets(req)
	if strings.Contains(got, "hunter2") || !strings.Contains(got, strippedSecret) || !strings.Contains(got, "vol-1") {
		t.Errorf("stripSecrets = %s", got)
	}
	if req.Secrets["password"] != "hunter2" {
		t.Error("stripSecrets changed the request itself")
	}
	cr := &csipb.CreateVolumeRequest{Name: "n", Secrets: map[string]string{"k": "s3cret"}}
	if strings.Contains(stripSecrets(cr), "s3cret") {
		t.Error("CreateVolume secrets logged")
	}
}
