package csi_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/nvme"
)

// nvmeSubsystem is what sysfs shows of one subsystem NQN on this node: its controllers
// (nvme<X>) and their host NQNs.
type nvmeSubsystem struct {
	controllers []string
	hostNQNs    []string
}

var controllerName = regexp.MustCompile(`^nvme[0-9]+$`)

func readSys(p string) string {
	b, _ := os.ReadFile(p)
	return strings.TrimSpace(string(b))
}

// subsystemOf reads /sys/class/nvme-subsystem for nqn; ok false when not connected.
func subsystemOf(t *testing.T, nqn string) (s nvmeSubsystem, ok bool) {
	t.Helper()
	dirs, _ := filepath.Glob("/sys/class/nvme-subsystem/*")
	for _, d := range dirs {
		if readSys(filepath.Join(d, "subsysnqn")) != nqn {
			continue
		}
		ok = true
		ctrls, _ := filepath.Glob(filepath.Join(d, "nvme[0-9]*"))
		for _, c := range ctrls {
			name := filepath.Base(c)
			if !controllerName.MatchString(name) { // nvme0n1: a namespace head
				continue
			}
			s.controllers = append(s.controllers, name)
			s.hostNQNs = append(s.hostNQNs, readSys(filepath.Join("/sys/class/nvme", name, "hostnqn")))
		}
	}
	return s, ok
}

func run(t *testing.T, name string, args ...string) string {
	t.Helper()
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
	return string(out)
}

// TestInGuestNVMeoFNode runs INSIDE the qemu guest of TestGuestCSISanityLVMNVMeoF, next to
// `plinth csi --mode all` and the agent (LVM thin pool, nvmet export on 127.0.0.1:4420): the
// node path over nvme-tcp on the real kernel — a subsystem already connected (by hand or by
// an earlier attempt, is reused: stage succeeds with one controller, and the kernel's own
// answer to a duplicate connect is EALREADY, which Connect treats as success), NodeExpand after
// ControllerExpand (the initiator sees the new size), unstage with the controller already gone
// and unstage twice (both succeed), and that unstage really disconnects.
func TestInGuestNVMeoFNode(t *testing.T) {
	sock := inGuestSocket(t)
	params := readParams(t, "PLINTH_CSI_GUEST_PARAMS")
	state, nodeName := os.Getenv("PLINTH_CSI_GUEST_STATE"), os.Getenv("PLINTH_CSI_GUEST_NODE")
	hostNQN, err := nvme.HostNQN("/etc/nvme/hostnqn")
	if err != nil || hostNQN == "" {
		t.Fatalf("host NQN: %q %v", hostNQN, err)
	}
	conn := dialUnix(t, sock)
	ctrl, node := csipb.NewControllerClient(conn), csipb.NewNodeClient(conn)
	ctx := t.Context()
	dir := t.TempDir()
	staging, target := filepath.Join(dir, "staging"), filepath.Join(dir, "target")
	capability := fsCap("ext4", csipb.VolumeCapability_AccessMode_SINGLE_NODE_WRITER)

	cv, err := ctrl.CreateVolume(ctx, &csipb.CreateVolumeRequest{Name: "pvc-in-guest", CapacityRange: &csipb.CapacityRange{RequiredBytes: 64 << 20},
		VolumeCapabilities: []*csipb.VolumeCapability{capability}, Parameters: params})
	if err != nil {
		t.Fatal(err)
	}
	id := cv.GetVolume().GetVolumeId()
	defer func() {
		if _, err := ctrl.DeleteVolume(context.Background(), &csipb.DeleteVolumeRequest{VolumeId: id}); err != nil {
			t.Errorf("DeleteVolume: %v", err)
		}
	}()
	pub, err := ctrl.ControllerPublishVolume(ctx, &csipb.ControllerPublishVolumeRequest{VolumeId: id, NodeId: nodeName, VolumeCapability: capability})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if _, err := ctrl.ControllerUnpublishVolume(context.Background(), &csipb.ControllerUnpublishVolumeRequest{VolumeId: id, NodeId: nodeName}); err != nil {
			t.Errorf("ControllerUnpublishVolume: %v", err)
		}
	}()
	pc := pub.GetPublishContext()
	nqn, addr, port := pc[csi.PublishNQN], pc[csi.PublishAddress], pc[csi.PublishPort]
	t.Logf("published: %v", pc)
	if nqn == "" || addr != "127.0.0.1" || port != "4420" {
		t.Fatalf("publish context %v", pc)
	}
	if _, ok := subsystemOf(t, nqn); ok {
		t.Fatalf("%s connected before any stage", nqn)
	}
	stageReq := &csipb.NodeStageVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging, VolumeCapability: capability,
		VolumeContext: cv.GetVolume().GetVolumeContext()}
	v := &guestNodeVolume{ctrl: ctrl, node: node, id: id, nqn: nqn, addr: addr, port: port, hostNQN: hostNQN, state: state,
		staging: staging, target: target, pc: pc, capability: capability, stageReq: stageReq}

	t.Run("AlreadyConnected", func(t *testing.T) { guestAlreadyConnected(t, v) })

	t.Run("PublishWriteExpand", func(t *testing.T) { guestPublishWriteExpand(t, v) })

	t.Run("UnstageDisconnects", func(t *testing.T) { guestUnstageDisconnects(t, v) })

	t.Run("ControllerAlreadyGone", func(t *testing.T) {
		if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
			t.Fatal(err)
		}
		s, ok := subsystemOf(t, nqn)
		if !ok || len(s.controllers) != 1 || s.hostNQNs[0] != hostNQN {
			t.Fatalf("after stage: connected %v, controllers %v, host NQNs %v (want one, made with %s)", ok, s.controllers, s.hostNQNs, hostNQN)
		}
		data, err := os.ReadFile(filepath.Join(staging, "data"))
		if err != nil || string(data) != "over nvme-tcp" {
			t.Errorf("data after restage: %q %v", data, err)
		}
		// the controller goes under the mount (an operator, a lost path past ctrl_loss_tmo)
		run(t, "nvme", "disconnect", "-n", nqn)
		if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstage with the controller gone: %v", err)
		}
		if m, _ := mount.New().IsMounted(staging); m {
			t.Errorf("%s still mounted", staging)
		}
		if _, ok := subsystemOf(t, nqn); ok {
			t.Errorf("%s connected again", nqn)
		}
	})

	t.Run("UnstageWithoutRecord", func(t *testing.T) { guestUnstageWithoutRecord(t, v) })
}

// guestUnstageWithoutRecord: a stage record lost (a node plugin state folder wiped, a crash
// between connect and the record's write) must not leave the volume mounted or its NVMe-oF
// controller connected: unstage finds the subsystem from the mounted device, or, with nothing
// mounted, from the volume's subsystem NQN among this node's connections.
func guestUnstageWithoutRecord(t *testing.T, v *guestNodeVolume) {
	ctx, node, id, nqn, staging, state := t.Context(), v.node, v.id, v.nqn, v.staging, v.state
	unstage := func(what string) {
		t.Helper()
		if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
			t.Fatalf("NodeUnstage %s: %v", what, err)
		}
		if m, _ := mount.New().IsMounted(staging); m {
			t.Errorf("%s: %s still mounted", what, staging)
		}
		if _, ok := subsystemOf(t, nqn); ok {
			t.Errorf("%s: %s still connected", what, nqn)
		}
	}
	record := filepath.Join(state, id+".json")

	// Staged and mounted, then the record removed.
	if _, err := node.NodeStageVolume(ctx, v.stageReq); err != nil {
		t.Fatal(err)
	}
	if s, ok := subsystemOf(t, nqn); !ok || len(s.controllers) != 1 {
		t.Fatalf("after stage: connected %v, controllers %v", ok, s.controllers)
	}
	if err := os.Remove(record); err != nil {
		t.Fatalf("remove the stage record: %v", err)
	}
	unstage("mounted, record lost")

	// Connected by hand, never mounted, no record.
	run(t, "nvme", "connect", "-t", "tcp", "-a", v.addr, "-s", v.port, "-n", nqn, "-q", v.hostNQN)
	if _, err := (&nvme.Initiator{}).WaitDevice(ctx, nqn); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(record); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a stage record exists for a connection made by hand: %v", err)
	}
	unstage("connected, not mounted, no record")
}

// guestNodeVolume is the NVMe-oF volume of TestInGuestNVMeoFNode, published to this node: the
// clients, its id, its export (subsystem NQN, address, port), this node's host NQN, the stage
// records' folder, the staging and target paths, the publish context and the stage request.
type guestNodeVolume struct {
	ctrl                                                 csipb.ControllerClient
	node                                                 csipb.NodeClient
	id, nqn, addr, port, hostNQN, state, staging, target string
	pc                                                   map[string]string
	capability                                           *csipb.VolumeCapability
	stageReq                                             *csipb.NodeStageVolumeRequest
}

// guestAlreadyConnected: NodeStage of a subsystem connected before the stage (a connect that
// outlived a crashed attempt, or by hand) reuses that controller, and a retried stage is OK.
func guestAlreadyConnected(t *testing.T, v *guestNodeVolume) {
	ctx, node, stageReq, staging := t.Context(), v.node, v.stageReq, v.staging
	nqn, addr, port, hostNQN := v.nqn, v.addr, v.port, v.hostNQN
	// connected before the stage (a connect that outlived a crashed attempt, or by hand)
	run(t, "nvme", "connect", "-t", "tcp", "-a", addr, "-s", port, "-n", nqn, "-q", hostNQN)
	in := &nvme.Initiator{}
	dev, err := in.WaitDevice(ctx, nqn)
	if err != nil {
		t.Fatal(err)
	}
	// the kernel's answer to a duplicate connect with the same host NQN: EALREADY
	p, _ := strconv.Atoi(port)
	err = writeFabrics(nvme.ConnectOptions(nvme.Target{NQN: nqn, Address: addr, Port: int32(p), HostNQN: hostNQN}))
	if !errors.Is(err, syscall.EALREADY) {
		t.Errorf("duplicate connect through /dev/nvme-fabrics: %v, want EALREADY", err)
	}
	if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
		t.Fatalf("NodeStage with the subsystem already connected: %v", err)
	}
	s, _ := subsystemOf(t, nqn)
	if len(s.controllers) != 1 || s.hostNQNs[0] != hostNQN {
		t.Errorf("controllers %v with host NQNs %v, want one with %s (the existing one reused)", s.controllers, s.hostNQNs, hostNQN)
	}
	if src, err := mount.New().SourceOf(staging); err != nil || src != dev {
		t.Errorf("staging mounted from %q (%v), want %s", src, err, dev)
	}
	if fs := strings.TrimSpace(run(t, "blkid", "-p", "-o", "value", "-s", "TYPE", dev)); fs != "ext4" {
		t.Errorf("%s holds %q, want ext4", dev, fs)
	}
	// a retried stage is OK too
	if _, err := node.NodeStageVolume(ctx, stageReq); err != nil {
		t.Errorf("second NodeStage: %v", err)
	}
}

// guestPublishWriteExpand publishes, writes, expands (ControllerExpand, then at once
// NodeExpand, as the CO does) and unpublishes.
func guestPublishWriteExpand(t *testing.T, v *guestNodeVolume) {
	ctx, ctrl, node, id, pc := t.Context(), v.ctrl, v.node, v.id, v.pc
	staging, target, capability := v.staging, v.target, v.capability
	if _, err := node.NodePublishVolume(ctx, &csipb.NodePublishVolumeRequest{VolumeId: id, PublishContext: pc, StagingTargetPath: staging,
		TargetPath: target, VolumeCapability: capability}); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(target, "data"), []byte("over nvme-tcp"), 0o600); err != nil {
		t.Fatal(err)
	}
	ex, err := ctrl.ControllerExpandVolume(ctx, &csipb.ControllerExpandVolumeRequest{VolumeId: id, CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20},
		VolumeCapability: capability})
	if err != nil {
		t.Fatal(err)
	}
	if !ex.GetNodeExpansionRequired() || ex.GetCapacityBytes() != 128<<20 {
		t.Errorf("ControllerExpand: %+v", ex)
	}
	// at once, as the CO does: the initiator must see the grown namespace
	ne, err := node.NodeExpandVolume(ctx, &csipb.NodeExpandVolumeRequest{VolumeId: id, VolumePath: target, StagingTargetPath: staging,
		CapacityRange: &csipb.CapacityRange{RequiredBytes: 128 << 20}, VolumeCapability: capability})
	if err != nil {
		t.Fatalf("NodeExpand right after ControllerExpand: %v", err)
	}
	if ne.GetCapacityBytes() != 128<<20 {
		t.Errorf("NodeExpand capacity %d", ne.GetCapacityBytes())
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(target, &st); err != nil {
		t.Fatal(err)
	}
	if size := int64(st.Blocks) * st.Bsize; size < 100<<20 {
		t.Errorf("filesystem %d bytes after expansion to 128 MiB", size)
	}
	if _, err := node.NodeUnpublishVolume(ctx, &csipb.NodeUnpublishVolumeRequest{VolumeId: id, TargetPath: target}); err != nil {
		t.Fatal(err)
	}
}

// guestUnstageDisconnects: unstage unmounts, disconnects and removes the stage record; a
// second unstage is OK.
func guestUnstageDisconnects(t *testing.T, v *guestNodeVolume) {
	ctx, node, id, nqn, staging, state := t.Context(), v.node, v.id, v.nqn, v.staging, v.state
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Fatal(err)
	}
	if _, ok := subsystemOf(t, nqn); ok {
		t.Errorf("%s still connected after unstage", nqn)
	}
	if m, _ := mount.New().IsMounted(staging); m {
		t.Errorf("%s still mounted", staging)
	}
	if _, err := os.Stat(filepath.Join(state, id+".json")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("stage record after unstage: %v", err)
	}
	// Nothing staged, nothing connected: unstage is still OK.
	if _, err := node.NodeUnstageVolume(ctx, &csipb.NodeUnstageVolumeRequest{VolumeId: id, StagingTargetPath: staging}); err != nil {
		t.Errorf("second NodeUnstage: %v", err)
	}
}

// writeFabrics writes one connect option string to /dev/nvme-fabrics, as nvme-cli does.
func writeFabrics(options string) error {
	f, err := os.OpenFile("/dev/nvme-fabrics", os.O_RDWR, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = f.Write([]byte(options))
	if err == nil {
		// a new controller: this test wanted none; remove it again
		var buf [256]byte
		n, _ := f.Read(buf[:])
		if name, ok := strings.CutPrefix(strings.TrimSpace(string(buf[:n])), "instance="); ok {
			os.WriteFile(fmt.Sprintf("/sys/class/nvme/nvme%s/delete_controller", strings.Split(name, ",")[0]), []byte("1"), 0) //nolint:errcheck
		}
	}
	return err
}
