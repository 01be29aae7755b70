package node

import (
	"context"
	"errors"
	"os"
	"strconv"
	"strings"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi/crypt"
	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/nvme"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/failpoint"
)

// NodeStageVolume attaches the volume (local device, or NVMe-oF connect with this node's host
// NQN), records what unstage needs (atomically, before mounting, so a crash in between still
// lets unstage disconnect), then formats a blank device only and mounts it at the staging path.
func (s *Service) NodeStageVolume(ctx context.Context, req *csipb.NodeStageVolumeRequest) (*csipb.NodeStageVolumeResponse, error) {
	id, staging, capability := req.GetVolumeId(), req.GetStagingTargetPath(), req.GetVolumeCapability()
	switch {
	case id == "":
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	case staging == "":
		return nil, volume.Errorf(volume.ErrInvalid, "staging target path is required")
	case capability == nil:
		return nil, volume.Errorf(volume.ErrInvalid, "volume capability is required")
	}
	if _, _, err := volume.CheckCapabilities([]*csipb.VolumeCapability{capability}); err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	release, err := s.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	block := capability.GetBlock() != nil
	pc, vc := req.GetPublishContext(), req.GetVolumeContext()
	kind := pc[volume.ContextKind]
	if kind == "" {
		kind = vc[volume.ContextKind]
	}

	rec, err := s.stages.Load(id)
	switch {
	case err == nil && rec.StagingPath == staging:
		if rec.Block && (rec.Crypt == "" || mount.CheckBlockDevice(rec.Device) == nil) {
			return &csipb.NodeStageVolumeResponse{}, nil
		}
		if src, err := s.mounter.SourceOf(staging); err == nil && src != "" {
			return &csipb.NodeStageVolumeResponse{}, nil // staged already, also after a restart
		}
	case err == nil:
		return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is staged at %s, not %s", id, rec.StagingPath, staging)
	case !errors.Is(err, stage.ErrNotFound):
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}

	var key []byte
	if vc[volume.ContextEncryption] != "" {
		if key, err = volumeKey(id, vc, req.GetSecrets()); err != nil {
			return nil, err
		}
	}
	rec = stage.Record{VolumeID: id, StagingPath: staging, Block: block}
	switch kind {
	case "local", "":
		rec.Kind = stage.KindLocal
		rec.Device = pc[volume.PublishDevicePath]
		if rec.Device == "" {
			return nil, volume.Errorf(volume.ErrInvalid, "publish context has no %s (was the volume published to this node?)", volume.PublishDevicePath)
		}
	case stage.KindNVMeoFTCP:
		if err := s.connect(ctx, &rec, pc); err != nil {
			return nil, err
		}
	default:
		return nil, volume.Errorf(volume.ErrInvalid, "unknown protocol kind %q", kind)
	}
	if err := mount.CheckBlockDevice(rec.Device); err != nil {
		return nil, volume.Errorf(volume.ErrNotFound, "%w", err)
	}
	if key != nil {
		cryptRecord(&rec, id)
	}
	if !block {
		rec.FSType = capability.GetMount().GetFsType()
		if rec.FSType == "" {
			rec.FSType = vc[volume.ContextFSType]
		}
		if rec.FSType == "" {
			rec.FSType = "ext4"
		}
	}
	if err := s.stages.Save(rec); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
	}
	failpoint.Hit(failpoint.CSIStageRecordSaved)
	if key != nil {
		if err := s.stageCrypt(ctx, rec, key, vc, req.GetSecrets()); err != nil {
			return nil, err
		}
	}
	if block {
		return &csipb.NodeStageVolumeResponse{}, nil
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "create staging path: %v", err)
	}
	opts := append(jsonList(vc[volume.ContextMountOptions]), capability.GetMount().GetMountFlags()...)
	if err := s.mounter.FormatAndMount(rec.Device, staging, rec.FSType, jsonList(vc[volume.ContextMkfsOptions]), opts); err != nil {
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

// connect connects this node to the NVMe-oF/TCP export the publish context pc names, with
// this node's host NQN and, when the target asks for them, its DH-HMAC-CHAP secrets, and sets
// rec's kind, subsystem NQN and device. ErrPrecondition, naming the module, when this node's
// kernel lacks the initiator (nvme.Initiator.Unusable). The record is saved before connecting: a crash after
// connecting must still let unstage disconnect.
func (s *Service) connect(ctx context.Context, rec *stage.Record, pc map[string]string) error {
	if why := s.initiator.Unusable(); why != "" {
		// a node that lacks the initiator: nothing recorded, nothing to retry until it is fixed
		return volume.Errorf(volume.ErrPrecondition, "node cannot connect over NVMe-oF/TCP: %s", why)
	}
	port, _ := strconv.Atoi(pc[volume.PublishPort])
	t := nvme.Target{NQN: pc[volume.PublishNQN], Address: pc[volume.PublishAddress], Port: int32(port), HostNQN: s.hostNQN}
	if v, err := strconv.Atoi(pc[volume.PublishCtrlLossTmo]); err == nil {
		tmo := int32(v)
		t.CtrlLossTmo = &tmo
	}
	if v, err := strconv.Atoi(pc[volume.PublishReconnectDelay]); err == nil {
		t.ReconnectDelay = int32(v)
	}
	if v, err := strconv.Atoi(pc[volume.PublishQueueSize]); err == nil {
		t.QueueSize = int32(v)
	}
	if t.NQN == "" || t.Address == "" || t.Port == 0 {
		return volume.Errorf(volume.ErrInvalid, "publish context lacks nqn, address or port")
	}
	if pc[volume.PublishAuth] != "" {
		// never a connect without the secret the target asks for
		if err := s.hostSecrets(ctx, &t, pc[volume.PublishAuth], pc[volume.PublishTargetNode], pc[volume.PublishAuthBidirectional] == "true"); err != nil {
			return err
		}
	} else {
		// a volume without authentication on a target whose host entry has this node's key
		// (another volume asked for it): the target asks for the key on every subsystem
		s.optionalHostSecret(ctx, &t, pc[volume.PublishTargetNode])
	}
	rec.Kind, rec.NQN = stage.KindNVMeoFTCP, t.NQN
	if err := s.stages.Save(*rec); err != nil {
		return volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
	}
	dev, err := s.initiator.Connect(ctx, t)
	if err != nil {
		return volume.Errorf(volume.ErrInternal, "connect: %v", err)
	}
	rec.Device = dev
	return nil
}

// growToDevice grows the filesystem staged for rec to its device. A volume restored from a
// snapshot, or cloned, larger than its source holds the source's filesystem on a larger device,
// and kubelet asks for no NodeExpandVolume then (the PVC's capacity is the PV's from the start),
// so staging does the resize, as mount-utils' resize-on-mount drivers do. The goal is the
// device's size rounded down to a MiB, so that a device a few sectors beyond the filesystem's
// last block runs no resize tool at every stage; a filesystem of that size is left alone.
func (s *Service) growToDevice(rec stage.Record) error {
	switch rec.FSType {
	case "ext2", "ext3", "ext4", "xfs":
	default:
		return nil
	}
	size, err := mount.DeviceSize(rec.Device)
	if err != nil {
		return volume.Errorf(volume.ErrInternal, "device size of %s: %v", rec.Device, err)
	}
	if _, _, err := s.mounter.Grow(rec.Device, rec.StagingPath, size&^(1<<20-1)); err != nil {
		return volume.Errorf(volume.ErrInternal, "grow the filesystem on %s to its device (%d bytes): %v", rec.Device, size, err)
	}
	return nil
}

// NodeUnstageVolume works from the stage record alone (the CO sends no context, and the plugin
// may have restarted): unmount even a dead mount (EIO, ENOTCONN, ESTALE), refuse success while
// still mounted, disconnect NVMe-oF (absent is success), remove the record. Without a record,
// a mounted NVMe-oF device is found through mountinfo and sysfs; a mount whose device is gone
// is an error, never a silent OK.
func (s *Service) NodeUnstageVolume(ctx context.Context, req *csipb.NodeUnstageVolumeRequest) (*csipb.NodeUnstageVolumeResponse, error) {
	id, staging := req.GetVolumeId(), req.GetStagingTargetPath()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if staging == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "staging target path is required")
	}
	release, err := s.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := s.stages.Load(id)
	if errors.Is(err, stage.ErrNotFound) {
		src, err := s.mounter.SourceOf(staging)
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
		dev := src
		if b, ok, err := s.crypt.Backing(ctx, crypt.MapperName(id)); err == nil && ok {
			dev = b // an encrypted volume: its NVMe-oF namespace is under the mapping
		}
		if nqn := s.initiator.SubsystemNQNOfDevice(dev); nqn != "" {
			rec.Kind, rec.NQN = stage.KindNVMeoFTCP, nqn
		}
	} else if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	// Linux unmounts a frozen filesystem but keeps its superblock frozen, with its device
	// held and no mount left to thaw it through: wait for the group snapshot's thaw (at the
	// latest its timeout) instead.
	if member := s.frozenAt(staging); member != "" {
		return nil, volume.Errorf(volume.ErrUnavailable, "%s is frozen for group snapshot member %s; unstage after its thaw", staging, member)
	}
	if err := s.mounter.Unmount(staging, false); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "unmount %s: %v", staging, err)
	}
	// an encrypted volume's mapping, named from the id: closed also without a record
	if err := s.crypt.Close(ctx, crypt.MapperName(id)); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "close the dm-crypt mapping of %s: %v", id, err)
	}
	if rec.Kind == stage.KindNVMeoFTCP {
		if err := s.initiator.Disconnect(ctx, rec.NQN); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "disconnect: %v", err)
		}
	}
	failpoint.Hit(failpoint.CSIUnstageUnmounted)
	if err := s.stages.Remove(id); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "remove stage record: %v", err)
	}
	return &csipb.NodeUnstageVolumeResponse{}, nil
}

// disconnectUnrecorded disconnects the NVMe-oF subsystems of volume id that this node is
// connected to although no stage record says so (the record was lost), found by subsystem NQN
// in sysfs. A namespace still mounted somewhere is FAILED_PRECONDITION: without a record the
// plugin cannot tell what uses it and refuses to guess. Unstage is never OK while connected.
func (s *Service) disconnectUnrecorded(ctx context.Context, id string) error {
	nqns, err := s.initiator.SubsystemNQNsOfVolume(id)
	if err != nil {
		return volume.Errorf(volume.ErrInternal, "look for NVMe-oF connections of %s: %v", id, err)
	}
	for _, nqn := range nqns {
		dev, err := s.initiator.Device(nqn)
		if err != nil {
			return volume.Errorf(volume.ErrInternal, "device of %s: %v", nqn, err)
		}
		if dev != "" {
			mps, err := s.mounter.MountPointsOf(dev)
			if err != nil {
				return volume.Errorf(volume.ErrInternal, "read mounts: %v", err)
			}
			if len(mps) > 0 {
				return volume.Errorf(volume.ErrPrecondition, "volume %s has no stage record, and its NVMe-oF namespace %s (%s) is mounted at %s: not disconnecting",
					id, dev, nqn, strings.Join(mps, ", "))
			}
		}
		if err := s.initiator.Disconnect(ctx, nqn); err != nil {
			return volume.Errorf(volume.ErrInternal, "disconnect %s (no stage record): %v", nqn, err)
		}
	}
	return nil
}
