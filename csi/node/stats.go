package node

import (
	"context"
	"errors"
	"os"

	csipb "github.com/container-storage-interface/spec/lib/go/csi"
	"golang.org/x/sys/unix"

	"github.com/plinth-storage/plinth/csi/internal/volume"
	"github.com/plinth-storage/plinth/csi/mount"
	"github.com/plinth-storage/plinth/csi/stage"
)

func (s *Service) NodeGetVolumeStats(ctx context.Context, req *csipb.NodeGetVolumeStatsRequest) (*csipb.NodeGetVolumeStatsResponse, error) {
	if req.GetVolumeId() == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume id is required")
	}
	path := req.GetVolumePath()
	if path == "" {
		return nil, volume.Errorf(volume.ErrInvalid, "volume path is required")
	}
	fi, err := s.mounter.Stat(path)
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

// NodeExpandVolume grows the filesystem to the device (resize2fs, xfs_growfs); block volumes
// need nothing. It grows nothing while the device is smaller than the size asked (the agent, or
// the NVMe-oF initiator, has not caught up: UNAVAILABLE, the resizer retries) and runs no resize
// tool when the filesystem already has that size; already large enough is success (CSI spec
// NodeExpandVolume).
func (s *Service) NodeExpandVolume(ctx context.Context, req *csipb.NodeExpandVolumeRequest) (*csipb.NodeExpandVolumeResponse, error) {
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
	release, err := s.locks.Acquire(id)
	if err != nil {
		return nil, err
	}
	defer release()
	rec, err := s.stages.Load(id)
	if errors.Is(err, stage.ErrNotFound) {
		return nil, volume.Errorf(volume.ErrNotFound, "volume %s is not staged on this node", id)
	} else if err != nil {
		return nil, volume.Errorf(volume.ErrInternal, "stage record: %v", err)
	}
	want, header := req.GetCapacityRange().GetRequiredBytes(), int64(0)
	if rec.Crypt != "" { // the mapping first, then what is inside it
		if want, header, err = s.growCrypt(ctx, rec, want); err != nil {
			return nil, err
		}
	}
	if rec.Block || req.GetVolumeCapability().GetBlock() != nil {
		size, err := mount.DeviceSize(rec.Device)
		if err != nil {
			return nil, volume.Errorf(volume.ErrInternal, "device size: %v", err)
		}
		if size < want {
			return nil, volume.Errorf(volume.ErrUnavailable, "device %s has %d bytes, %d asked: not grown yet", rec.Device, size, want)
		}
		return &csipb.NodeExpandVolumeResponse{CapacityBytes: size + header}, nil
	}
	mnt := rec.StagingPath
	if m, _ := s.mounter.IsMounted(mnt); !m {
		mnt = path
	}
	_, size, err := s.mounter.Grow(rec.Device, mnt, want)
	switch {
	case errors.Is(err, mount.ErrDeviceTooSmall):
		return nil, volume.Errorf(volume.ErrUnavailable, "%v: not grown yet, the filesystem is left as it is", err)
	case err != nil:
		return nil, volume.Errorf(volume.ErrInternal, "grow filesystem on %s: %v", rec.Device, err)
	}
	return &csipb.NodeExpandVolumeResponse{CapacityBytes: size + header}, nil
}
