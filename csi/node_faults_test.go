package csi_test

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
)

// nodeProcess is `plinth csi --mode node` as a real process (no API server: kubelet's calls
// only), with its state folder kept across restarts and crash points armed by env.
type nodeProcess struct {
	t      *testing.T
	plinth string
	dir    string // socket and state
	env    []string
	p      *controlplane.Process
	node   csipb.NodeClient
}

func (n *nodeProcess) start() {
	n.t.Helper()
	sock := filepath.Join(n.dir, "csi.sock")
	os.Remove(sock)
	args := []string{"csi", "--mode", "node", "--endpoint", "unix://" + sock, "--node-name", "fault-node",
		"--state-dir", filepath.Join(n.dir, "state"), "--host-nqn-file", filepath.Join(n.dir, "no-hostnqn"),
		"--registration-dir=", "--health-address=", "-v", "2"}
	p, err := sharedControlPlane(n.t).StartProcess(n.t.Context(), controlplane.ProcessSpec{Name: "plinth-csi-node-fault", Binary: n.plinth,
		Args: args, Env: n.env, Ready: controlplane.SocketReady(sock), ReadyTimeout: time.Minute})
	if err != nil {
		n.t.Fatal(err)
	}
	n.p = p
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		n.t.Fatal(err)
	}
	n.t.Cleanup(func() { conn.Close() })
	n.node = csipb.NewNodeClient(conn)
}

// crashed waits for the process to end and fails unless it exited at a crash point.
func (n *nodeProcess) crashed(point string) {
	n.t.Helper()
	select {
	case <-n.p.Done():
	case <-time.After(time.Minute):
		n.t.Fatalf("%s: the node plugin did not exit at the crash point", point)
	}
	var ee *exec.ExitError
	if err := n.p.Err(); !errors.As(err, &ee) || ee.ExitCode() != failpoint.ExitCode {
		n.t.Fatalf("%s: node plugin ended with %v, want exit code %d\n%s", point, err, failpoint.ExitCode, n.p.Tail(20))
	}
}

// TestNodeCrashPoints stops the node plugin — a real process — at each of its crash points
// (internal/failpoint, armed "once" as a DaemonSet would arm it), restarts it with the same
// environment and state folder, and repeats kubelet's call: the call succeeds, the staging
// path and target hold exactly one mount each, the stage record matches, and unpublish plus
// unstage leave no mount and no record. The volume is a real loop device formatted by the
// first NodeStage; its data survives every crash.
func TestNodeCrashPoints(t *testing.T) {
	plinth := buildPlinth(t, "")
	for _, point := range []string{failpoint.CSIStageRecordSaved, failpoint.CSIStageMounted, failpoint.CSINodePublishMounted, failpoint.CSIUnstageUnmounted} {
		t.Run(point, func(t *testing.T) {
			dev, _ := loopDevice(t, 320<<20)
			dir, err := os.MkdirTemp("", "plinth-csi-fault-") // short unix socket path
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { os.RemoveAll(dir) })
			n := &nodeProcess{t: t, plinth: plinth, dir: dir, env: []string{failpoint.Env + "=" + point + "=once"}}
			n.start()
			t.Cleanup(func() { n.p.Stop() })
			ctx := t.Context()
			root := t.TempDir()
			staging, target := filepath.Join(root, "staging"), filepath.Join(root, "pods", "target")
			record := filepath.Join(dir, "state", "vol-fault.json")
			stageReq := &csipb.NodeStageVolumeRequest{VolumeId: "vol-fault", StagingTargetPath: staging, VolumeCapability: fsCap("xfs", rwo), PublishContext: localPublish(dev)}
			publishReq := &csipb.NodePublishVolumeRequest{VolumeId: "vol-fault", StagingTargetPath: staging, TargetPath: target, VolumeCapability: fsCap("xfs", rwo)}
			unpublishReq := &csipb.NodeUnpublishVolumeRequest{VolumeId: "vol-fault", TargetPath: target}
			unstageReq := &csipb.NodeUnstageVolumeRequest{VolumeId: "vol-fault", StagingTargetPath: staging}

			// call runs kubelet's call; at the armed point the process exits, the call fails,
			// and kubelet's retry goes to the restarted plugin.
			call := func(what string, at string, f func() error) {
				t.Helper()
				if point != at {
					if err := f(); err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					return
				}
				if err := f(); err == nil {
					t.Fatalf("%s answered OK although the plugin stopped at %s", what, point)
				}
				n.crashed(point)
				n.start()
				if err := f(); err != nil {
					t.Fatalf("%s after the restart: %v", what, err)
				}
			}
			stageAt := failpoint.CSIStageRecordSaved
			if point == failpoint.CSIStageMounted {
				stageAt = point
			}
			call("NodeStage", stageAt, func() error { _, err := n.node.NodeStageVolume(ctx, stageReq); return err })
			if got := mountsAt(t, staging); got != 1 {
				t.Fatalf("after NodeStage: %d mounts at the staging path, want 1", got)
			}
			if err := os.WriteFile(filepath.Join(staging, "data"), []byte("kept"), 0o644); err != nil {
				t.Fatal(err)
			}
			call("NodePublish", failpoint.CSINodePublishMounted, func() error { _, err := n.node.NodePublishVolume(ctx, publishReq); return err })
			if got := mountsAt(t, target); got != 1 {
				t.Fatalf("after NodePublish: %d mounts at the target, want 1", got)
			}
			if b, err := os.ReadFile(filepath.Join(target, "data")); err != nil || string(b) != "kept" {
				t.Errorf("data through the target: %q, %v", b, err)
			}
			if _, err := n.node.NodeUnpublishVolume(ctx, unpublishReq); err != nil {
				t.Fatal(err)
			}
			call("NodeUnstage", failpoint.CSIUnstageUnmounted, func() error { _, err := n.node.NodeUnstageVolume(ctx, unstageReq); return err })
			for _, p := range []string{staging, target} {
				if got := mountsAt(t, p); got != 0 {
					t.Errorf("after unpublish and unstage: %d mounts at %s", got, p)
				}
			}
			if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("stage record left after unstage: %v", err)
			}
			// The filesystem made by the first NodeStage kept the data: stage again, read it.
			if _, err := n.node.NodeStageVolume(ctx, stageReq); err != nil {
				t.Fatal(err)
			}
			if b, err := os.ReadFile(filepath.Join(staging, "data")); err != nil || string(b) != "kept" {
				t.Errorf("data after restage: %q, %v", b, err)
			}
			if _, err := n.node.NodeUnstageVolume(ctx, unstageReq); err != nil {
				t.Fatal(err)
			}
			if n.p.Exited() {
				t.Errorf("the node plugin exited a second time:\n%s", n.p.Tail(20))
			}
		})
	}
}
