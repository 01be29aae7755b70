package node

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/stage"
	"github.com/plinth-storage/plinth/internal/failpoint"
)

func (s *Service) NodePublishVolume(ctx context.Context, req *csipb.NodePublishVolumeRequest) (*csipb.NodePublishVolumeResponse, error) {
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
	if _, _, err := volume.CheckCapabilities([]*csipb.VolumeCapability{capability}); err != nil {
		return nil, volume.Errorf(volume.ErrInvalid, "%w", err)
	}
	release, err := s.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := s.stages.Load(id)
	if errors.Is(err, stage.ErrNotFound) {
		return nil, volume.Errorf(volume.ErrPrecondition, "volume %s is not staged", id)
	} else if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	s.rewrapStaged(ctx, rec, req.GetSecrets()) // crypt.go: a key rotation in flight
	if mounted, err := s.mounter.IsMounted(target); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "read mounts: %v", err)
	} else if mounted {
		return &csipb.NodePublishVolumeResponse{}, nil
	}
	single := capability.GetAccessMode().GetMode() == csipb.VolumeCapability_AccessMode_SINGLE_NODE_SINGLE_WRITER
	for _, other := range rec.Targets {
		if other == target {
			continue
		}
		if m, _ := s.mounter.IsMounted(other); m && (single || rec.SingleWriter) {
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
	if err := s.mounter.BindMount(source, target, req.GetReadonly(), capability.GetMount().GetMountFlags()); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "bind mount: %v", err)
	}
	failpoint.Hit(failpoint.CSINodePublishMounted)
	if !slices.Contains(rec.Targets, target) {
		rec.Targets = append(rec.Targets, target)
	}
	rec.SingleWriter = rec.SingleWriter || single
	if uid := req.GetVolumeContext()[PodUIDContext]; uid != "" { // qos.go
		rec.PodUIDs = mapsWith(rec.PodUIDs, target, uid)
	}
	if err := s.stages.Save(rec); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
	}
	s.limits.Nudge()
	return &csipb.NodePublishVolumeResponse{}, nil
}

func (s *Service) NodeUnpublishVolume(ctx context.Context, req *csipb.NodeUnpublishVolumeRequest) (*csipb.NodeUnpublishVolumeResponse, error) {
	id, target := req.GetVolumeId(), req.GetTargetPath()
	if id == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	if target == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "target path is required")
	}
	release, err := s.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	// Unmount also a dead mount (stat fails) and remove the path we created (CSI spec NodeUnpublish).
	if err := s.mounter.Unmount(target, true); err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "unmount %s: %v", target, err)
	}
	if rec, err := s.stages.Load(id); err == nil && slices.Contains(rec.Targets, target) {
		rec.Targets = slices.DeleteFunc(rec.Targets, func(p string) bool { return p == target })
		delete(rec.PodUIDs, target)
		if len(rec.Targets) == 0 {
			rec.SingleWriter = false
		}
		if err := s.stages.Save(rec); err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "save stage record: %v", err)
		}
	}
	return &csipb.NodeUnpublishVolumeResponse{}, nil
}
