package csi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/nvme"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/failpoint"
	"github.com/plinth-storage/plinth/internal/hostnqn"
	policyv1 "github.com/plinth-storage/plinth/schema/policy/v1alpha1"
)

// node is the CSI Node service.
type node struct {
	csipb.UnimplementedNodeServer
	d *Driver
}

// The node service's API access (kustomize/rbac/csi_node.yaml): the merge patch of its own
// Node in initNode, after reading the Nodes for another one presenting the same host NQN.
//
// +kubebuilder:rbac:groups="",resources=nodes,verbs=get;list;patch

// initNode removes stage record temp files a crash left, reads the host NQN and, with an API config, labels the Node
// plinth.dev/nvme-initiator=true when nvme-tcp is usable and annotates it with
// plinth.dev/host-nqn (docs/design.md, "Names and keys": ControllerPublish reads the host NQN
// there).
func (d *Driver) initNode(ctx context.Context) error {
	// Before any Save of this process: temp files of records a crash left half-written.
	removed, err := d.stages.CleanTemp()
	if err != nil {
		return fmt.Errorf("clean stage records: %w", err)
	}
	if len(removed) > 0 {
		d.log.Info("removed stage record temp files left by a crash", "folder", d.stages.Path, "files", removed)
	}
	nqn, err := nvme.HostNQN(d.opts.HostNQNFile)
	if err != nil {
		return fmt.Errorf("read host NQN: %w", err)
	}
	d.hostNQN = nqn
	if d.kube == nil {
		return nil
	}
	meta := map[string]any{}
	if d.initiator.Usable() && nqn != "" {
		meta["labels"] = map[string]string{policyv1.LabelNVMeInitiator: "true"}
	}
	if nqn != "" {
		meta["annotations"] = map[string]string{policyv1.AnnotationHostNQN: nqn}
		rejected, err := d.duplicateHostNQN(ctx, nqn)
		if err != nil {
			return err
		}
		if rejected {
			// not registered: no annotation (ControllerPublish grants nothing to this node)
			// and no initiator label (the scheduler places no NVMe-oF volume here)
			meta = map[string]any{
				"labels":      map[string]any{policyv1.LabelNVMeInitiator: nil},
				"annotations": map[string]any{policyv1.AnnotationHostNQN: nil},
			}
		}
	}
	if len(meta) == 0 {
		d.log.Info("no NVMe host NQN: this node cannot consume NVMe-oF volumes", "file", d.opts.HostNQNFile)
		return nil
	}
	patch, _ := json.Marshal(map[string]any{"metadata": meta})
	n := &corev1.Node{}
	n.Name = d.opts.NodeName
	if err := d.kube.Patch(ctx, n, client.RawPatch(types.MergePatchType, patch)); err != nil {
		return fmt.Errorf("label and annotate Node %s: %w", d.opts.NodeName, err)
	}
	if _, rejected := meta["annotations"].(map[string]any); !rejected {
		d.log.Info("node registered for NVMe-oF", "node", d.opts.NodeName, "hostNQN", nqn, "initiator", meta["labels"] != nil)
	}
	return nil
}

// duplicateHostNQN applies the rule of internal/hostnqn to this node's host NQN and the other
// Nodes' plinth.dev/host-nqn annotations: when another Node presents nqn and registered it first,
// this node's registration is rejected, reported as a Warning event on its Node naming both
// nodes and in the log.
func (d *Driver) duplicateHostNQN(ctx context.Context, nqn string) (bool, error) {
	var nodes corev1.NodeList
	if err := d.kube.List(ctx, &nodes); err != nil {
		return false, fmt.Errorf("list Nodes for host NQN %s: %w", nqn, err)
	}
	var self *corev1.Node
	var others []string
	for i, n := range nodes.Items {
		switch {
		case n.Name == d.opts.NodeName:
			self = &nodes.Items[i]
		case n.Annotations[policyv1.AnnotationHostNQN] == nqn:
			others = append(others, n.Name)
		}
	}
	holds := self != nil && self.Annotations[policyv1.AnnotationHostNQN] == nqn
	if !hostnqn.Rejected(d.opts.NodeName, holds, others) {
		return false, nil
	}
	msg := hostnqn.Message(nqn, d.opts.NodeName, others) + "; this node's registration is rejected: it is granted no NVMe-oF volume until its host NQN is its own"
	d.log.Error(nil, "host NQN registration rejected", "node", d.opts.NodeName, "hostNQN", nqn, "alsoPresentedBy", others)
	if self != nil {
		d.warn(self, hostnqn.ReasonDuplicate, "Register", msg)
	}
	return true, nil
}

func (s *node) NodeGetInfo(context.Context, *csipb.NodeGetInfoRequest) (*csipb.NodeGetInfoResponse, error) {
	return &csipb.NodeGetInfoResponse{
		NodeId:             s.d.opts.NodeName,
		AccessibleTopology: &csipb.Topology{Segments: map[string]string{policyv1.TopologyKeyNode: s.d.opts.NodeName}},
	}, nil
}

func (s *node) NodeGetCapabilities(context.Context, *csipb.NodeGetCapabilitiesRequest) (*csipb.NodeGetCapabilitiesResponse, error) {
	var caps []*csipb.NodeServiceCapability
	for _, c := range []csipb.NodeServiceCapability_RPC_Type{
		csipb.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME,
		csipb.NodeServiceCapability_RPC_EXPAND_VOLUME,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_STATS,
		csipb.NodeServiceCapability_RPC_GET_VOLUME_HEALTH,
		csipb.NodeServiceCapability_RPC_SINGLE_NODE_MULTI_WRITER,
	} {
		caps = append(caps, &csipb.NodeServiceCapability{Type: &csipb.NodeServiceCapability_Rpc{Rpc: &csipb.NodeServiceCapability_RPC{Type: c}}})
	}
	return &csipb.NodeGetCapabilitiesResponse{Capabilities: caps}, nil
}

func jsonList(s string) []string {
	var out []string
	if s != "" {
		_ = json.Unmarshal([]byte(s), &out)
	}
	return out
}

// NodeStageVolume attaches the volume (local device, or NVMe-oF connect with this node's host
// NQN), records what unstage needs (atomically, before mounting, so a crash in between still
// lets unstage disconnect), then formats a blank device only and mounts it at the staging path.
func (s *node) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	id, staging, capability := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	switch {
	case id == "":
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	case staging == "":
		return nil, volume.Errorf(volume.ErrInvalid, "staging target path is required")
	case capability == nil:
		return nil, volume.Errorf(volume.ErrInvalid, "volume capability is required")
	}
	if _, _, err := checkCapabilities([]*csipb.VolumeCapability{capability}); err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	release, err := s.d.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	block := capability.GetBlock() != nil
	pc, vc := req.GetPublishContext(), req.GetVolumeContext()
	kind := pc[ContextKind]
	if kind == "" {
		kind = vc[ContextKind]
	}

	rec, err := s.d.stages.Load(id)
	switch {
	case err == nil && rec.StagingPath == staging:
		if rec.Block {
			return &csipb.NodeStageVolumeResponse{}, nil
		}
		if src, err := s.d.mounter.SourceOf(staging); err == nil && src != "" {
			return &csipb.NodeStageVolumeResponse{}, nil // staged already, also after a restart
		}
	case err == nil:
		return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is staged at %s, not %s", id, rec.StagingPath, staging)
	case !errors.Is(err, stage.ErrNotFound):
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}

	rec = stage.Record{VolumeID: id, StagingPath: staging, Block: block}
	switch kind {
	case "local", "":
		rec.Kind = stage.KindLocal
		rec.Device = pc[PublishDevicePath]
		if rec.Device == "" {
			return nil, volume.Errorf(volume.ErrInvalid, "publish context has no %s (was the volume published to this node?)", PublishDevicePath)
		}
	case stage.KindNVMeoFTCP:
		port, _ := strconv.Atoi(pc[PublishPort])
		t := nvme.Target{NQN: pc[PublishNQN], Address: pc[PublishAddress], Port: int32(port), HostNQN: s.d.hostNQN}
		if v, err := strconv.Atoi(pc[PublishCtrlLossTmo]); err == nil {
			tmo := int32(v)
			t.CtrlLossTmo = &tmo
		}
		if v, err := strconv.Atoi(pc[PublishReconnectDelay]); err == nil {
			t.ReconnectDelay = int32(v)
		}
		if v, err := strconv.Atoi(pc[PublishQueueSize]); err == nil {
			t.QueueSize = int32(v)
		}
		if t.NQN == "" || t.Address == "" || t.Port == 0 {
			return nil, volume.Errorf(volume.ErrInvalid, "publish context lacks nqn, address or port")
		}
		if pc[PublishAuth] != "" {
			// never a connect without the secret the target asks for
			if err := s.d.hostSecrets(ctx, &t, pc[PublishAuth], pc[PublishTargetNode], pc[PublishAuthBidirectional] == "true"); err != nil {
				return nil, err
			}
		} else {
			// a volume without authentication on a target whose host entry has this node's key
			// (another volume asked for it): the target asks for the key on every subsystem
			s.d.optionalHostSecret(ctx, &t, pc[PublishTargetNode])
		}
		rec.Kind, rec.NQN = stage.KindNVMeoFTCP, t.NQN
		// Record first: a crash after connecting must still let unstage disconnect.
		if err := s.d.stages.Save(rec); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
		}
		dev, err := s.d.initiator.Connect(ctx, t)
		if err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "connect: %v", err)
		}
		rec.Device = dev
	default:
		return nil, volume.Errorf(volume.ErrInvalid, "unknown protocol kind %q", kind)
	}
	if err := mount.CheckBlockDevice(rec.Device); err != nil {
		return nil, volume.Errorf(volume.ErrNotFound, "%w", err)
	}
	if !block {
		rec.FSType = capability.GetMount().GetFsType()
		if rec.FSType == "" {
			rec.FSType = vc[ContextFSType]
		}
		if rec.FSType == "" {
			rec.FSType = "ext4"
		}
	}
	if err := s.d.stages.Save(rec); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
	}
	failpoint.Hit(failpoint.CSIStageRecordSaved)
	if block {
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "create staging path: %v", err)
	}
	opts := append(jsonList(vc[ContextMountOptions]), capability.GetMount().GetMountFlags()...)
	if err := s.d.mounter.FormatAndMount(rec.Device, staging, rec.FSType, jsonList(vc[ContextMkfsOptions]), opts); err != nil {
		if errors.Is(err, mount.ErrDeviceNotFound) {
			return nil, volume.Errorf(volume.ErrNotFound, "%w", err)
		}
		return nil, volume.Errorf(volume.ErrInternal, "format and mount %s: %v", rec.Device, err)
	}
	if err := s.growToDevice(rec); err != nil {
		return nil, err
	}
	failpoint.Hit(failpoint.CSIStageMounted)
	return &csipb.NodeStageVolumeResponse{}, nil
}

// growToDevice grows the filesystem staged for rec to its device. A volume restored from a
// snapshot, or cloned, larger than its source holds the source's filesystem on a larger device,
// and kubelet asks for no NodeExpandVolume then (the PVC's capacity is the PV's from the start),
// so staging does the resize, as mount-utils' resize-on-mount drivers do. The goal is the
// device's size rounded down to a MiB, so that a device a few sectors beyond the filesystem's
// last block runs no resize tool at every stage; a filesystem of that size is left alone.
func (s *node) growToDevice(rec stage.Record) error {
	switch rec.FSType {
	case "ext2", "ext3", "ext4", "xfs":
	default:
		return nil
	}
	size, err := mount.DeviceSize(rec.Device)
	if err != nil {
		return volume.Errorf(volume.ErrInternal, "device size of %s: %v", rec.Device, err)
	}
	if _, _, err := s.d.mounter.Grow(rec.Device, rec.StagingPath, size&^(1<<20-1)); err != nil {
		return volume.Errorf(volume.ErrInternal, "grow the filesystem on %s to its device (%d bytes): %v", rec.Device, size, err)
	}
	return nil
}

// NodeUnstageVolume works from the stage record alone (the CO sends no context, and the plugin
// may have restarted): unmount even a dead mount (EIO, ENOTCONN, ESTALE), refuse success while
// still mounted, disconnect NVMe-oF (absent is success), remove the record. Without a record,
// a mounted NVMe-oF device is found through mountinfo and sysfs; a mount whose device is gone
// is an error, never a silent OK.
func (s *node) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if staging == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "staging target path is required")
	}
	release, err := s.d.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := s.d.stages.Load(id)
	if errors.Is(err, stage.ErrNotFound) {
		src, err := s.d.mounter.SourceOf(staging)
		if err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "read mounts: %v", err)
		}
		if src == "" {
			// Nothing mounted; but a connection no record remembers must not stay behind.
			if err := s.disconnectUnrecorded(ctx, id); err != nil {
				return nil, err
			}
			return &csipb.NodeUnstageVolumeResponse{}, nil // not staged: OK (CSI spec)
		}
		if _, err := os.Stat(src); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "%s is mounted from %s, which is gone, and no stage record says how it was attached", staging, src)
		}
		rec = stage.Record{VolumeID: id, StagingPath: staging, Kind: stage.KindLocal, Device: src}
		if nqn := s.d.initiator.SubsystemNQNOfDevice(src); nqn != "" {
			rec.Kind, rec.NQN = stage.KindNVMeoFTCP, nqn
		}
	} else if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	if err := s.d.mounter.Unmount(staging, false); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "unmount %s: %v", staging, err)
	}
	if rec.Kind == stage.KindNVMeoFTCP {
		if err := s.d.initiator.Disconnect(ctx, rec.NQN); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "disconnect: %v", err)
		}
	}
	failpoint.Hit(failpoint.CSIUnstageUnmounted)
	if err := s.d.stages.Remove(id); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "remove stage record: %v", err)
	}
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

// disconnectUnrecorded disconnects the NVMe-oF subsystems of volume id that this node is
// connected to although no stage record says so (the record was lost), found by subsystem NQN
// in sysfs. A namespace still mounted somewhere is FAILED_PRECONDITION: without a record the
// plugin cannot tell what uses it and refuses to guess. Unstage is never OK while connected.
func (s *node) disconnectUnrecorded(ctx context.Context, id string) error {
	nqns, err := s.d.initiator.SubsystemNQNsOfVolume(id)
	if err != nil {
		return volume.Errorf(volume.ErrInternal, "look for NVMe-oF connections of %s: %v", id, err)
	}
	for _, nqn := range nqns {
		dev, err := s.d.initiator.Device(nqn)
		if err != nil {
			return volume.Errorf(volume.ErrInternal, "device of %s: %v", nqn, err)
		}
		if dev != "" {
			mps, err := s.d.mounter.MountPointsOf(dev)
			if err != nil {
				return volume.Errorf(volume.ErrInternal, "read mounts: %v", err)
			}
			if len(mps) > 0 {
				return volume.Errorf(volume.ErrPrecondition, "volume %s has no stage record, and its NVMe-oF namespace %s (%s) is mounted at %s: not disconnecting",
					id, dev, nqn, strings.Join(mps, ", "))
			}
		}
		if err := s.d.initiator.Disconnect(ctx, nqn); err != nil {
			return volume.Errorf(volume.ErrInternal, "disconnect %s (no stage record): %v", nqn, err)
		}
	}
	return nil
}

func (s *node) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
	id, target, staging, capability := req.GetVolumeId(), req.GetTargetPath(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	switch {
	case id == "":
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	case target == "":
		return nil, volume.Errorf(volume.ErrInvalid, "target path is required")
	case staging == "":
		return nil, volume.Errorf(volume.ErrInvalid, "staging target path is required")
	case capability == nil:
		return nil, volume.Errorf(volume.ErrInvalid, "volume capability is required")
	}
	if _, _, err := checkCapabilities([]*csipb.VolumeCapability{capability}); err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	release, err := s.d.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := s.d.stages.Load(id)
	if errors.Is(err, stage.ErrNotFound) {
		return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is not staged", id)
	} else if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	if mounted, err := s.d.mounter.IsMounted(target); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "read mounts: %v", err)
	} else if mounted {
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	single := capability.GetAccessMode().GetMode() == csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	for _, other := range rec.Targets {
		if other == target {
			continue
		}
		if m, _ := s.d.mounter.IsMounted(other); m && (single || rec.SingleWriter) {
			return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is published single-writer at %s", id, other)
		}
	}
	source := staging
	if capability.GetBlock() != nil {
		source = rec.Device
		if err := os.MkdirAll(filepath.Dir(target), 0o750); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "create target folder: %v", err)
		}
		f, err := os.OpenFile(target, os.O_CREATE|os.O_RDONLY, 0o640)
		if err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "create target file: %v", err)
		}
		f.Close()
	} else if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "create target: %v", err)
	}
	if err := s.d.mounter.BindMount(source, target, req.GetReadonly(), capability.GetMount().GetMountFlags()); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "bind mount: %v", err)
	}
	failpoint.Hit(failpoint.CSINodePublishMounted)
	if !slices.Contains(rec.Targets, target) {
		rec.Targets = append(rec.Targets, target)
	}
	rec.SingleWriter = rec.SingleWriter || single
	if err := s.d.stages.Save(rec); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
	}
	return &csipb.NodePublishVolumeResponse{}, nil
}

func (s *node) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if target == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "target path is required")
	}
	release, err := s.d.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	// Unmount also a dead mount (stat fails) and remove the path we created (CSI spec NodeUnpublish).
	if err := s.d.mounter.Unmount(target, true); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "unmount %s: %v", target, err)
	}
	if rec, err := s.d.stages.Load(id); err == nil && slices.Contains(rec.Targets, target) {
		rec.Targets = slices.DeleteFunc(rec.Targets, func(p string) bool { return p == target })
		if len(rec.Targets) == 0 {
			rec.SingleWriter = false
		}
		if err := s.d.stages.Save(rec); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
		}
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}

func (s *node) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	path := req.GetVolumePath()
	if path == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume path is required")
	}
	fi, err := s.d.mounter.Stat(path)
	switch {
	case err != nil && mount.IsCorrupted(err):
		// CSI v1.13 moved volume conditions to NodeGetVolumeHealth, which reports this as INACCESSIBLE.
		return nil, volume.Errorf(volume.ErrInternal, "mount at %s is dead: %v", path, err)
	case errors.Is(err, os.ErrNotExist):
		return nil, volume.Errorf(volume.ErrNotFound, "volume path %s does not exist", path)
	case err != nil:
		return nil, volume.Errorf(volume.ErrInternal, "stat %s: %v", path, err)
	}
	if fi.Mode()&os.ModeDevice != 0 {
		size, err := mount.DeviceSize(path)
		if err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "device size: %v", err)
		}
		return &csipb.NodeGetVolumeStatsResponse{Usage: []*csipb.VolumeUsage{{Unit: csipb.VolumeUsage_BYTES, Total: size}}}, nil
	}
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "statfs %s: %v", path, err)
	}
	bs := st.Bsize
	return &csipb.NodeGetVolumeStatsResponse{
		Usage: []*csipb.VolumeUsage{
			{Unit: csipb.VolumeUsage_BYTES, Total: int64(st.Blocks) * bs, Available: int64(st.Bavail) * bs, Used: int64(st.Blocks-st.Bfree) * bs},
			{Unit: csipb.VolumeUsage_INODES, Total: int64(st.Files), Available: int64(st.Ffree), Used: int64(st.Files - st.Ffree)},
		},
	}, nil
}

// ReasonMountDead is the VolumeHealth reason of a mount whose probe returns EIO, ENOTCONN,
// ESTALE or similar (the backing path died under the mount).
const ReasonMountDead = "MountDead"

// ReasonDeviceGone is the VolumeHealth reason of a staged volume whose block device vanished.
const ReasonDeviceGone = "DeviceGone"

// NodeGetVolumeHealth reports INACCESSIBLE when the staging or publish mount is dead or the
// staged device is gone; no entries mean healthy (CSI v1.13 NodeGetVolumeHealth, which
// replaced the VolumeCondition of NodeGetVolumeStats).
func (s *node) NodeGetVolumeHealth(ctx context.Context, req *csipb.NodeGetVolumeHealthRequest) (*csipb.NodeGetVolumeHealthResponse, error) {
	id := req.GetVolumeId()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	rec, err := s.d.stages.Load(id)
	if err != nil && !errors.Is(err, stage.ErrNotFound) {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	staged := err == nil
	if !staged && req.GetVolumePublishPath() == "" && req.GetStagingTargetPath() == "" {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s is not staged on this node", id)
	}
	var r *stage.Record
	if staged {
		r = &rec
	}
	h := &csipb.VolumeHealth{VolumeId: id, HealthStatuses: s.d.volumeHealth(r, req.GetStagingTargetPath(), req.GetVolumePublishPath())}
	return &csipb.NodeGetVolumeHealthResponse{VolumeHealth: h}, nil
}

// NodeExpandVolume grows the filesystem to the device (resize2fs, xfs_growfs); block volumes
// need nothing. It grows nothing while the device is smaller than the size asked (the agent, or
// the NVMe-oF initiator, has not caught up: UNAVAILABLE, the resizer retries) and runs no resize
// tool when the filesystem already has that size; already large enough is success (CSI spec
// NodeExpandVolume).
func (s *node) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
	id, path := req.GetVolumeId(), req.GetVolumePath()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if path == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume path is required")
	}
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil, volume.Errorf(volume.ErrNotFound, "volume path %s does not exist", path)
	}
	release, err := s.d.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := s.d.stages.Load(id)
	if errors.Is(err, stage.ErrNotFound) {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s is not staged on this node", id)
	} else if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	want := req.GetCapacityRange().GetRequiredBytes()
	if rec.Block || req.GetVolumeCapability().GetBlock() != nil {
		size, err := mount.DeviceSize(rec.Device)
		if err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "device size: %v", err)
		}
		if size < want {
			return nil, volume.Errorf(volume.ErrUnavailable, "device %s has %d bytes, %d asked: not grown yet", rec.Device, size, want)
		}
		return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
	}
	mnt := rec.StagingPath
	if m, _ := s.d.mounter.IsMounted(mnt); !m {
		mnt = path
	}
	_, size, err := s.d.mounter.Grow(rec.Device, mnt, want)
	switch {
	case errors.Is(err, mount.ErrDeviceTooSmall):
		return nil, volume.Errorf(volume.ErrUnavailable, "%v: not grown yet, the filesystem is left as it is", err)
	case err != nil:
		return nil, volume.Errorf(volume.ErrInternal, "grow filesystem on %s: %v", rec.Device, err)
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size}, nil
}
