package csi_test

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	apierrors "k8s.io/apimachinery/pkg/api/errors"

	"github.com/plinth-storage/plinth/csi"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/wait"
	"github.com/plinth-storage/plinth/test/prereq"
)

// When a Store's status overstates its free room (another volume landed in the pool after the
// agent's last report), the controller still picks the Store, and it is the REAL agent that finds
// the room missing: its InsufficientCapacity must reach CreateVolume as RESOURCE_EXHAUSTED (so
// csi-provisioner reschedules instead of retrying a dead end), and no VolumeState, file or loop
// device of the refused volume is left behind. The pool's directory is a 128 MiB tmpfs; the agent
// reports once (refresh 1 h), then a 100 MiB volume file appears that no VolumeState owns (the
// file backend counts every volume file in its directory as provisioned).
func TestRealAgentInsufficientCapacity(t *testing.T) {
	prereq.Root(t, "a tmpfs for the pool, the file backend")
	cp := sharedControlPlane(t)
	plinth := buildPlinth(t, t.TempDir())
	dir := t.TempDir()
	volumes := filepath.Join(dir, "volumes")
	if err := os.MkdirAll(volumes, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", volumes, "tmpfs", 0, "size=128m"); err != nil {
		t.Fatalf("mount a tmpfs for the pool: %v", err)
	}
	// registered before the agent starts, so it runs after the agent has stopped
	t.Cleanup(func() {
		if err := unix.Unmount(volumes, 0); err != nil {
			t.Errorf("unmount the pool's tmpfs: %v", err)
		}
	})
	params := fileBackendNodeIn(t, cp, plinth, "full", time.Hour, dir)
	c := kubeClient(t, cp.Admin.Config)
	ctx := t.Context()
	var st storev1.Store
	if err := c.Get(ctx, clientKey(storev1.StoreName("full", "full-node")), &st); err != nil {
		t.Fatal(err)
	}
	reported := st.Status.Capacity.Available
	if reported < 100<<20 {
		t.Fatalf("the agent reported %d bytes available on a 128 MiB tmpfs, want at least 100 MiB", reported)
	}
	// a volume file Plinth's controller does not know of: the Store still says `reported`
	filler := filepath.Join(volumes, storev1.VolumeID("not-from-this-cluster")+".img")
	if err := os.WriteFile(filler, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(filler, 100<<20); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(filler)

	conn := startDriver(t, csi.Options{Mode: csi.ModeController, Config: cp.Admin.Config})
	ctrl := csipb.NewControllerClient(conn)
	const want = 64 << 20 // under what the Store says, over what the disk has
	_, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "full", CapacityRange: &csipb.CapacityRange{RequiredBytes: want},
		VolumeCapabilities: mountCap(rwo), Parameters: params, AccessibilityRequirements: &csipb.TopologyRequirement{Preferred: topology("full-node")}})
	if err == nil {
		// never leave the volume's loop device on the tmpfs behind
		_, derr := ctrl.DeleteVolume(ctx, &csipb.DeleteVolumeRequest{VolumeId: storev1.VolumeID("full")})
		t.Fatalf("CreateVolume succeeded on a pool without room (delete: %v)", derr)
	}
	wantCode(t, "the real agent finds no room the Store status promised", err, codes.ResourceExhausted)

	// the refused volume leaves nothing behind: its VolumeState is removed, no file in the pool
	id := storev1.VolumeID("full")
	if err := wait.Poll(ctx, 30*time.Second, 50*time.Millisecond, func() error {
		if err := c.Get(ctx, clientKey(id), &storev1.VolumeState{}); !apierrors.IsNotFound(err) {
			return fmt.Errorf("get: %v", err)
		}
		return nil
	}); err != nil {
		t.Fatalf("the VolumeState of the refused volume is still there: %v", err)
	}
	entries, err := os.ReadDir(volumes)
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != filepath.Base(filler) {
		names := []string{}
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Errorf("pool directory holds %v, want only the filler", names)
	}
}
