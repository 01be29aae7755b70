package csi_test

import (
	"os"
	"path/filepath"
	"strings"
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

// NodeStageVolume of an NVMe-oF volume on a node whose kernel lacks the initiator: the
// nvme_tcp module not loaded (no /sys/module/nvme_tcp in a FAKE sysfs), or also no
// /dev/nvme-fabrics. NodeStage fails FAILED_PRECONDITION naming what is missing, writes no
// connect string and leaves no stage record (a retry after the module is loaded stages it).
func TestNodeStageNVMeoFWithoutInitiatorModule(t *testing.T) {
	const id = "vol-00000000000000000000000000000000000000a2"
	for _, tc := range []struct {
		name    string
		fabrics bool
		want    []string
	}{
		{"nvme_tcp not loaded", true, []string{"nvme_tcp"}},
		{"nvme_tcp and nvme_fabrics missing", false, []string{"nvme_tcp", "nvme-fabrics", "nvme_fabrics"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			root := t.TempDir()
			sys, dev := filepath.Join(root, "sys"), filepath.Join(root, "dev")
			for _, d := range []string{filepath.Join(sys, "module", "nvme_core"), dev} {
				if err := os.MkdirAll(d, 0o755); err != nil {
					t.Fatal(err)
				}
			}
			if tc.fabrics {
				if err := os.WriteFile(filepath.Join(dev, "nvme-fabrics"), nil, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			connects := 0
			in := &nvme.Initiator{SysRoot: sys, DevRoot: dev, PollInterval: time.Millisecond, Timeout: 200 * time.Millisecond,
				Fabrics: func(string) error { connects++; return nil }}
			state := filepath.Join(root, "state")
			if err := os.MkdirAll(state, 0o755); err != nil {
				t.Fatal(err)
			}
			node := csipb.NewNodeClient(startDriver(t, csi.Options{Mode: csi.ModeNode, NodeName: "host-node", StateDir: state,
				HostNQNFile: filepath.Join(state, "no-hostnqn"), Initiator: in}))
			_, err := node.NodeStageVolume(t.Context(), &csipb.NodeStageVolumeRequest{VolumeId: id, StagingTargetPath: filepath.Join(root, "staging"),
				VolumeCapability: &csipb.VolumeCapability{AccessType: &csipb.VolumeCapability_Mount{Mount: &csipb.VolumeCapability_MountVolume{FsType: "ext4"}},
					AccessMode: &csipb.VolumeCapability_AccessMode{Mode: csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER}},
				PublishContext: map[string]string{csi.ContextKind: "nvmeofTcp", csi.PublishNQN: "nqn.2014-08.dev.plinth:" + id,
					csi.PublishAddress: "192.0.2.1", csi.PublishPort: "4420"}})
			if status.Code(err) != codes.FailedPrecondition {
				t.Fatalf("NodeStageVolume: %v, want FailedPrecondition", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(status.Convert(err).Message(), w) {
					t.Errorf("NodeStageVolume: %q does not name %s", status.Convert(err).Message(), w)
				}
			}
			if connects != 0 {
				t.Errorf("%d connect strings written to /dev/nvme-fabrics, want none", connects)
			}
			var files []string
			if err := filepath.WalkDir(state, func(p string, d os.DirEntry, err error) error {
				if err == nil && !d.IsDir() {
					files = append(files, p)
				}
				return err
			}); err != nil {
				t.Fatal(err)
			}
			if len(files) != 0 {
				t.Errorf("files in the state folder after the refused stage: %v, want none (no stage record)", files)
			}
			t.Logf("refused: %v", err)
		})
	}
}
