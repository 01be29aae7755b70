package agent

import (
	"context"
	"fmt"
	"time"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/agents/file"
	"github.com/plinth-storage/plinth/agents/lvm"
	"github.com/plinth-storage/plinth/agents/raw"
	"github.com/plinth-storage/plinth/agents/zfs"
	storev1 "github.com/plinth-storage/plinth/schema/storage/v1alpha1"
)

// newBackend is the default Options.NewBackend; sysRoot is the node's sysfs (Options.SysRoot),
// where the LVM cache drives bcache.
func newBackend(s *storev1.Store, reserveBytes int64, sysRoot string, onCommand func(string, []string, time.Duration, error)) (backend.Backend, error) {
	b := s.Spec.Backend
	switch {
	case b.LVM != nil:
		cfg := lvm.Config{
			VolumeGroup:       b.LVM.VolumeGroup,
			Devices:           b.LVM.Devices,
			ReserveBytes:      reserveBytes,
			OvercommitPercent: int64(s.Spec.OvercommitPercent),
			OnCommand:         onCommand,
			Kernel:            lvm.SysKernel{Root: sysRoot},
		}
		if b.LVM.ThinPool != nil {
			cfg.ThinPool = b.LVM.ThinPool.Name
			cfg.ThinPoolSizePercent = int(b.LVM.ThinPool.SizePercent)
		}
		if c := b.LVM.Cache; c != nil {
			cfg.Cache = &lvm.CacheConfig{VolumeGroup: c.VolumeGroup, Devices: c.Devices, Mode: string(c.Mode), RatioPercent: int(c.RatioPercent)}
		}
		return lvm.New(cfg)
	case b.File != nil:
		return file.New(file.Config{Directory: b.File.Directory, ReserveBytes: reserveBytes, OvercommitPercent: int64(s.Spec.OvercommitPercent)})
	case b.ZFS != nil:
		bs, err := zfs.ParseVolBlockSize(b.ZFS.VolBlockSize)
		if err != nil {
			return nil, err
		}
		// Plinth creates zvols sparse: ZFS is a thin backend (docs/design.md,
		// "The policy API", overcommitPercent).
		return zfs.New(zfs.Config{
			Pool: b.ZFS.Pool, ParentDataset: b.ZFS.ParentDataset, VolBlockSize: bs, Sparse: true,
			Properties: b.ZFS.Properties, ReserveBytes: reserveBytes, OvercommitPercent: int64(s.Spec.OvercommitPercent),
			OnCommand: onCommand,
		})
	case b.Raw != nil:
		return raw.New(raw.Config{Devices: b.Raw.Devices, Partitioning: string(b.Raw.Partitioning), ReserveBytes: reserveBytes, OnCommand: onCommand})
	}
	return nil, fmt.Errorf("store %s declares no backend", s.Name)
}

// ensurer is a backend that brings its node-level objects (VG, thin pool)
// to the declaration (lvm.LVM.Ensure).
type ensurer interface {
	Ensure(ctx context.Context) error
}

// observer returns capacity and volumes from one report (lvm.LVM.Observe).
type observer interface {
	Observe(ctx context.Context) (backend.Capacity, []backend.Volume, error)
}

// observe is one refresh of a backend: one vgs+lvs pair for LVM.
func observe(ctx context.Context, be backend.Backend) (backend.Capacity, []backend.Volume, error) {
	if o, ok := be.(observer); ok {
		return o.Observe(ctx)
	}
	c, err := be.Capacity(ctx)
	if err != nil {
		return c, nil, err
	}
	vols, err := be.List(ctx)
	return c, vols, err
}
