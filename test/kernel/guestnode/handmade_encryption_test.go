package guestnode

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

func init() {
	extraTests = append(extraTests, extraTest{"EncryptedOnTheWire", testEncryptedOnTheWire})
}

// Expected: a volume of the clear class and one of the encrypted class (LUKS2, pool-luks), each
// published to worker A and staged there (the encrypted one with its key Secret, which the
// test reads and hands to NodeStage as kubelet would), get the same 4 MiB of a known line
// written and read back across the relay (page cache dropped). The clear volume shows the line
// in the relay's frames and on the storage guest's LV (the scans work); the encrypted one in
// neither, and reads back equal on the worker. Same run: sequential read of the mounted device
// on the worker (over NVMe/TCP), clear vs encrypted.
func testEncryptedOnTheWire(t *testing.T, s *suite) {
	raw := make([]byte, 12)
	if _, err := rand.Read(raw); err != nil {
		t.Fatal(err)
	}
	marker := "PLINTH-PLAINTEXT-" + hex.EncodeToString(raw)
	secs := map[string]float64{}
	for _, c := range []struct {
		name, placement string
		encrypted       bool
	}{{"clear", pool + "-nvme", false}, {"luks", pool + "-luks", true}} {
		// 128 MiB usable each (CreateVolume adds the 16 MiB LUKS2 header of the encrypted one), more than readSeconds reads
		capability := fsCap(csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)
		cv, err := s.ctrl.CreateVolume(t.Context(), &csipb.CreateVolumeRequest{Name: "pvc-crossnode-" + c.name, CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20},
			VolumeCapabilities: []*csipb.VolumeCapability{capability},
			Parameters:         map[string]string{policyv1.ParamPlacement: c.placement, policyv1.ParamPool: pool, policyv1.ParamProtocol: pool + "-nvme"}})
		if err != nil {
			t.Fatalf("%s: CreateVolume: %v", c.name, err)
		}
		v := &volume{id: cv.GetVolume().GetVolumeId(), vc: cv.GetVolume().GetVolumeContext(), capability: capability, staging: "/tmp/staging-" + cv.GetVolume().GetVolumeId()}
		s.publish(t, v, workerA)
		var secrets map[string]string
		if c.encrypted {
			if v.vc[csi.ContextEncryption] != "LUKS2" {
				t.Fatalf("volume context %v: not encrypted", v.vc)
			}
			var sec corev1.Secret
			if err := s.c.Get(t.Context(), client.ObjectKey{Namespace: policyv1.VolumeKeyNamespace, Name: policyv1.VolumeKeyPrefix + "pvc-crossnode-" + c.name}, &sec); err != nil {
				t.Fatalf("key Secret: %v", err)
			}
			secrets = map[string]string{policyv1.VolumeKeyData: string(sec.Data[policyv1.VolumeKeyData])}
		}
		if _, err := s.nodeA.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: v.id, PublishContext: v.pc,
			StagingTargetPath: v.staging, VolumeCapability: v.capability, VolumeContext: v.vc, Secrets: secrets}); err != nil {
			t.Fatalf("%s: NodeStage: %v", c.name, err)
		}
		stop := s.relay.Scan([]byte(marker))
		out := s.worker.sh(t, 5*time.Minute, fmt.Sprintf("yes %s | head -c 4194304 > %s/data && sync && sha256sum %s/data", marker, v.staging, v.staging))
		sum := strings.Fields(out)[0]
		if got := s.readSum(t, s.worker, v, "data"); got != sum {
			t.Errorf("%s: read back %s, wrote %s", c.name, got, sum)
		}
		frames := stop()
		dev, _ := mounted(t, s.worker, v)
		secs[c.name] = readSeconds(t, s.worker, dev)
		var vs storev1.VolumeState
		if err := s.c.Get(t.Context(), client.ObjectKey{Name: v.id}, &vs); err != nil {
			t.Fatal(err)
		}
		_, onLV := s.storage.try(5*time.Minute, fmt.Sprintf("grep -q -F %s %s", marker, vs.Status.DevicePath))
		t.Logf("%s: %d relay frames and LV %s: grep exit %d (0: found); worker device %s", c.name, frames, vs.Status.DevicePath, onLV, dev)
		if c.encrypted {
			if frames != 0 || onLV != 1 { // grep: 1 is "read it all, not found"; 2 an error
				t.Errorf("encrypted volume: the plaintext is in %d relay frames; grep of the storage node's LV exits %d, want 1", frames, onLV)
			}
			if !strings.HasPrefix(dev, "/dev/mapper/") && !strings.HasPrefix(dev, "/dev/dm-") {
				t.Errorf("encrypted volume mounted from %s, not its mapping", dev)
			}
		} else if frames == 0 || onLV != 0 {
			t.Fatalf("clear volume: %d relay frames and LV grep exit %d: the scans would not see plaintext", frames, onLV)
		}
		s.unstage(t, s.nodeA, v)
		if c.encrypted {
			if out, _ := s.worker.try(time.Minute, "ls /dev/mapper/ | grep plinth-"); strings.TrimSpace(out) != "" {
				t.Errorf("mapping left on the worker after unstage: %s", out)
			}
		}
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerA}); err != nil {
			t.Errorf("ControllerUnpublish: %v", err)
		}
		s.removeVolume(t, v)
	}
	t.Logf("MEASURE sequential read 64 MiB bs=128k O_DIRECT over NVMe/TCP on worker A: clear %.2fs (%.1f MiB/s), LUKS2 aes-xts-plain64 %.2fs (%.1f MiB/s), encrypted/clear bandwidth %.2f",
		secs["clear"], 64/secs["clear"], secs["luks"], 64/secs["luks"], secs["clear"]/secs["luks"])
}
