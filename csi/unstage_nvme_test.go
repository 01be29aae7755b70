package csi_test

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/nvme"
)

// NodeUnstageVolume of an NVMe-oF volume whose stage record is gone (the node's state folder
// lost) while the node is still connected to its subsystem: unstage finds the controller by the
// subsystem NQN in sysfs and disconnects it, and when the controller refuses to go it fails —
// never OK while connected. The sysfs tree is a FAKE laid out as drivers/nvme/host/core.c does
// (the real kernel path runs in the guest: TestInGuestNVMeoFNode).
func TestNodeUnstageNVMeoFWithoutRecord(t *testing.T) {
	const id = "vol-00000000000000000000000000000000000000a1"
	nqn := "nqn.2026-01.dev.plinth:" + id
	for _, tc := range []struct {
		name    string
		refuse  bool
		wantErr codes.Code
	}{{"disconnects", false, codes.OK}, {"controller refuses", true, codes.Internal}} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
			sub := filepath.Join(sys, "class", "nvme-subsystem", "nvme-subsys0")
			ctrl := filepath.Join(sys, "class", "nvme", "nvme0")
			for p, v := range map[string]string{
				filepath.Join(sub, "subsysnqn"): nqn, filepath.Join(ctrl, "subsysnqn"): nqn, filepath.Join(ctrl, "delete_controller"): "",
				filepath.Join(dev, "nvme0n1"): "",
			} {
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(v+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			for _, d := range []string{filepath.Join(sub, "nvme0"), filepath.Join(sub, "nvme0n1")} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			deletes := 0
			in := &nvme.Initiator{SysRoot: sys, DevRoot: dev, PollInterval: time.Millisecond, Timeout: 200 * time.Millisecond,
				WriteFile: func(p string, _ []byte) error {
					if filepath.Base(p) != "delete_controller" {
						t.Errorf("write to %s", p)
					}
					deletes++
					if tc.refuse {
						return syscall.EBUSY
					}
					os.RemoveAll(ctrl)
					return os.RemoveAll(sub) // the last controller gone: the subsystem goes too
				}}
			state := filepath.Join(root, "state") // empty: no stage record
			node := csipb.NewNodeClient(startDriver(t, csi.Options{Mode: csi.ModeNode, NodeName: "host-node", StateDir: state,
				HostNQNFile: filepath.Join(state, "no-hostnqn"), Initiator: in}))
			_, err := node.NodeUnstageVolume(t.Context(), &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(root, "staging")})
			if got := status.Code(err); got != tc.wantErr {
				t.Fatalf("NodeUnstageVolume: %v, want %v", err, tc.wantErr)
			}
			if deletes != 1 {
				t.Errorf("%d writes to delete_controller, want 1", deletes)
			}
			_, statErr := os.Stat(sub)
			if connected := statErr == nil; connected != tc.refuse {
				t.Errorf("subsystem still in sysfs: %v after unstage answered %v", connected, err)
			}
		})
	}
}
