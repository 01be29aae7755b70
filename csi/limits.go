package csi

import (
	"context"
	"time"

	"github.com/plinth-storage/plinth/csi/iolimit"
)

// DefaultLimitsInterval is the node plugin's default period of the I/O limits round
// (node.Limits): on cgroup v1 a container started in a limited pod is limited within it.
const DefaultLimitsInterval = 2 * time.Second

// startLimits starts the node plugin's keeper of the VolumeAttributesClass limits
// (docs/design.md#qos) on the host's cgroup mount.
func (d *Driver) startLimits(ctx context.Context) error {
	l, err := d.node.NewLimits(d.opts.Config, d.scheme, iolimit.Detect(d.opts.CgroupRoot))
	if err != nil {
		return err
	}
	go func() {
		if err := l.Run(ctx, d.opts.LimitsInterval); err != nil {
			d.log.Error(err, "I/O limits stopped")
		}
	}()
	return nil
}
