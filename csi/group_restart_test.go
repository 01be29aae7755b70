package csi_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/internal/failpoint"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/wait"
	"github.com/plinth-storage/plinth/test/prereq"
)

// TestRealAgentGroupFreezeRestart kills the node plugin — `plinth csi --mode node`, a real
// process — while it holds a group snapshot's freeze: it froze the member's filesystem,
// answered Frozen, and exits at csi.freeze.answered (armed "once", as a DaemonSet would arm
// it), so the thaw that lived in its timer is gone and the filesystem stays frozen (FIFREEZE
// answers EBUSY). Started again with the same environment and state folder, it thaws that
// filesystem on start and answers Thawed (FreezeFailed, naming the restart): the freeze did
// not hold until the group was taken, so the group fails UNAVAILABLE saying so and leaves no
// member; the volume takes writes again, and unpublish, unstage and delete leave nothing
// behind (noLeftovers: no filesystem left frozen). The group spans two Stores (real agents,
// file backend), so its members carry spec.freeze.
func TestRealAgentGroupFreezeRestart(t *testing.T) {
	prereq.Root(t, "the file backend, mount and FIFREEZE")
	noLeftovers(t)
	cp := sharedControlPlane(t)
	plinth := buildPlinth(t, "")
	params := fileBackendNode(t, cp, plinth, "gfr")
	other := fileBackendNode(t, cp, plinth, "gfro")
	// the controller, and the node plugin of the other Store's node, in this process
	conn := startDriver(t, csi.Options{Mode: csi.ModeAll, Config: cp.Admin.Config, NodeName: "gfro-node", HostNQNFile: filepath.Join(t.TempDir(), "none")})
	ctrl, group := csipb.NewControllerClient(conn), csipb.NewGroupControllerClient(conn)
	c := kubeClient(t, cp.Admin.Config)
	ctx := t.Context()

	// gfr-node's node plugin: its own process, the crash point armed once
	dir, err := os.MkdirTemp("", "plinth-csi-gfr-") // short unix socket path
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	sock := filepath.Join(dir, "csi.sock")
	var proc *controlplane.Process
	start := func() {
		t.Helper()
		os.Remove(sock)
		p, err := cp.StartProcess(ctx, controlplane.ProcessSpec{Name: "plinth-csi-node-gfr", Binary: plinth,
			Args: []string{"csi", "--mode", "node", "--endpoint", "unix://" + sock, "--node-name", "gfr-node", "--kubeconfig", cp.Admin.Kubeconfig,
				"--state-dir", filepath.Join(dir, "state"), "--host-nqn-file", filepath.Join(dir, "no-hostnqn"),
				"--registration-dir=", "--health-address=", "-v", "2"},
			Env:   []string{failpoint.Env + "=" + failpoint.CSIFreezeAnswered + "=once"},
			Ready: controlplane.SocketReady(sock), ReadyTimeout: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		proc = p
	}
	start()
	// one cleanup for the plugin, whichever start is current: registered before the volumes'
	// teardown, it runs after it
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("--- node plugin log, last lines:\n%s", proc.Tail(40))
		}
		proc.Stop() //nolint:errcheck
	})
	nconn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nconn.Close() })
	node := csipb.NewNodeClient(nconn) // the same socket path across the restart

	xfs := fsCap("", rwo)
	create := func(name string, params map[string]string) *csipb.Volume {
		t.Helper()
		resp, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: name, CapacityRange: &csipb.CapacityRange{RequiredBytes: 320 << 20},
			VolumeCapabilities: []*csipb.VolumeCapability{xfs}, Parameters: params})
		if err != nil {
			t.Fatal(err)
		}
		return resp.GetVolume()
	}
	va := create("gfr-a", params)
	root := t.TempDir()
	staging, target := filepath.Join(root, "staging"), filepath.Join(root, "target")
	t.Cleanup(func() { teardown(t, ctrl, node, va.GetVolumeId(), "gfr-node", staging, target) })
	vo := create("gfro-a", other)
	t.Cleanup(func() { teardown(t, ctrl, node, vo.GetVolumeId(), "", "", "") })
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: va.GetVolumeId(), NodeId: "gfr-node", VolumeCapability: xfs, VolumeContext: va.GetVolumeContext()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodeStageVolume(ctx, &csipb.NodeStageVolumeRequest{VolumeId: va.GetVolumeId(), StagingTargetPath: staging, VolumeCapability: xfs,
		PublishContext: pub.GetPublishContext(), VolumeContext: va.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: va.GetVolumeId(), StagingTargetPath: staging, TargetPath: target, VolumeCapability: xfs,
		PublishContext: pub.GetPublishContext(), VolumeContext: va.GetVolumeContext()}); err != nil {
		t.Fatal(err)
	}

	// The group: gfr-node's plugin freezes A, answers Frozen and exits; the call waits for
	// the freeze's end, which only a plugin of that node can answer now.
	type result struct {
		resp *csipb.CreateVolumeGroupSnapshotResponse
		err  error
	}
	done := make(chan result, 1)
	go func() {
		resp, err := group.CreateVolumeGroupSnapshot(ctx, &csipb.CreateVolumeGroupSnapshotRequest{Name: "gfr", SourceVolumeIds: []string{va.GetVolumeId(), vo.GetVolumeId()},
			Parameters: map[string]string{"plinth.dev/freeze-timeout-seconds": "300"}})
		done <- result{resp, err}
	}()
	select {
	case <-proc.Done():
	case r := <-done:
		t.Fatalf("the group returned (%v, %v) before the node plugin stopped at %s", r.resp, r.err, failpoint.CSIFreezeAnswered)
	case <-time.After(time.Minute):
		t.Fatalf("the node plugin did not exit at %s", failpoint.CSIFreezeAnswered)
	}
	var ee *exec.ExitError
	if err := proc.Err(); !errors.As(err, &ee) || ee.ExitCode() != failpoint.ExitCode {
		t.Fatalf("node plugin ended with %v, want exit code %d at %s\n%s", err, failpoint.ExitCode, failpoint.CSIFreezeAnswered, proc.Tail(20))
	}
	// FIFREEZE of a frozen filesystem is EBUSY: the plugin's freeze outlived it
	if err := mount.Freeze(staging); !errors.Is(err, unix.EBUSY) {
		mount.Thaw(staging) //nolint:errcheck // undo the probe's own freeze
		t.Fatalf("A's filesystem with the plugin dead: FIFREEZE gives %v, want EBUSY (still frozen by the plugin)", err)
	}

	// Restarted, the plugin thaws it and answers Thawed (FreezeFailed): the freeze did not
	// hold until the group was taken, so the group fails and leaves no member.
	start()
	var r result
	select {
	case r = <-done:
	case <-time.After(2 * time.Minute):
		t.Fatal("the group did not end 2 minutes after the node plugin's restart")
	}
	wantCode(t, "group whose freeze was lost to a restart", r.err, codes.Unavailable)
	if r.err != nil && (!strings.Contains(r.err.Error(), storev1.ReasonFreezeFailed) || !strings.Contains(r.err.Error(), "restarted")) {
		t.Errorf("the failure does not say the restarted plugin thawed the freeze: %v", r.err)
	}
	if err := wait.Poll(ctx, 30*time.Second, 100*time.Millisecond, func() error {
		var list storev1.VolumeSnapshotStateList
		if err := c.List(ctx, &list, client.MatchingLabels{storev1.LabelGroup: storev1.GroupSnapshotID("gfr")}); err != nil {
			return err
		}
		if len(list.Items) != 0 {
			return fmt.Errorf("%d members", len(list.Items))
		}
		return nil
	}); err != nil {
		t.Errorf("members of the group whose freeze was lost are left: %v", err)
	}
	writableAgain(t, target, staging, "after-restart", "the restart", "the plugin did not thaw the freeze it left")
	if proc.Exited() {
		t.Errorf("the node plugin exited again after its restart:\n%s", proc.Tail(20))
	}
}
