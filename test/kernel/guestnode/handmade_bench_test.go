package guestnode

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/kernel/guest"
)

// Measured, not asserted (the emulation makes absolute numbers meaningless; the ratio is what
// the figures are for): 4 KiB random reads and then writes with O_DIRECT, 4 workers, of the
// first 64 MiB of one block volume that holds nothing — remotely on worker A through NVMe-oF over
// the relay, and locally from the LV on the storage guest — in the same run, one after another
// (never both at once). Printed as BENCH lines; the test fails only when a measurement cannot be
// made.
func testMeasureRandomIOPS(t *testing.T, s *suite) {
	root, err := controlplane.ModuleRoot()
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "randio")
	goBuild(t, root, bin, "./test/kernel/cmd/randio")
	data, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	for _, v := range []*vm{s.storage, s.worker} {
		if err := os.WriteFile(filepath.Join(v.g.ShareDir(), "randio"), data, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	block := &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Block{Block: &csipb.VolumeCapability_BlockVolume{}},
		AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}}
	cv, err := s.ctrl.CreateVolume(t.Context(), &csipb.CreateVolumeRequest{Name: "pvc-crossnode-bench", CapacityRange: &csipb.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csipb.VolumeCapability{block}, Parameters: s.params(pool + "-nvme")})
	if err != nil {
		t.Fatalf("CreateVolume (block): %v", err)
	}
	v := &volume{id: cv.GetVolume().GetVolumeId(), vc: cv.GetVolume().GetVolumeContext(), capability: block, staging: "/tmp/staging-" + cv.GetVolume().GetVolumeId()}
	defer s.removeVolume(t, v)
	s.publish(t, v, workerA)
	s.stage(t, s.nodeA, v)
	defer func() {
		s.unstage(t, s.nodeA, v)
		if _, err := s.ctrl.ControllerUnpublishVolume(t.Context(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: v.id, NodeId: workerA}); err != nil {
			t.Errorf("ControllerUnpublish: %v", err)
		}
	}()
	remoteDev := strings.TrimSpace(s.worker.sh(t, time.Minute, fmt.Sprintf(`for sub in /sys/class/nvme-subsystem/*; do
  [ "$(cat $sub/subsysnqn)" = %q ] || continue
  for n in $sub/nvme*n*; do [ -e "$n" ] && { echo /dev/${n##*/}; exit 0; }; done
done
exit 1`, v.nqn)))
	localDev := s.volumeState(t, v.id).Status.DevicePath
	iops := func(g *vm, dev, rw string) float64 {
		out := g.sh(t, 2*time.Minute, fmt.Sprintf("%s/randio -dev %s -rw %s -bs 4096 -jobs 4 -seconds 8", guest.SharePath, dev, rw))
		var f float64
		for _, w := range strings.Fields(out) {
			if x, ok := strings.CutPrefix(w, "iops="); ok {
				if _, err := fmt.Sscan(x, &f); err == nil && f > 0 {
					return f
				}
			}
		}
		t.Fatalf("randio %s on %s: %q", rw, dev, out)
		return 0
	}
	for _, rw := range []string{"read", "write"} {
		remote := iops(s.worker, remoteDev, rw)
		local := iops(s.storage, localDev, rw)
		t.Logf("BENCH random %s 4KiB O_DIRECT jobs=4 over 64 MiB: remote (worker A, %s) %.0f IOPS, local (storage, %s) %.0f IOPS, remote/local %.2f",
			rw, remoteDev, remote, localDev, local, remote/local)
	}
}
