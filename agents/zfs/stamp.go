package zfs

import (
	"context"
	"errors"
	"fmt"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

var _ backend.Stamper = (*ZFS)(nil)

// stampOf reads the identity stamp of zvol d (volume id): (nil, nil) when it has none. A
// stamp naming another volume (the property set on the parent and inherited, or copied by
// hand) is torn.
func stampOf(d Dataset, id string) (*identity.Stamp, error) {
	if d.Identity == "" {
		return nil, nil
	}
	s, err := identity.FromZFSProperty(d.Identity)
	if errors.Is(err, identity.ErrNoStamp) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if s.VolumeID != id {
		return nil, fmt.Errorf("%w: property %s of %s names volume %s", identity.ErrTorn, PropIdentity, d.Name, s.VolumeID)
	}
	return &s, nil
}

// Stamp writes s as the zvol's PropIdentity user property (identity.Stamp.Line) with one
// `zfs set`: ZFS sets one property in one transaction, so a crash leaves the old stamp or
// the new one. Nothing is run when the zvol carries s already; the zvol's data is not
// touched. Errors: backend.ErrNotFound when the volume is absent (or not Plinth's),
// backend.ErrInvalidArgument for an invalid stamp.
func (z *ZFS) Stamp(ctx context.Context, s identity.Stamp) error {
	line, err := s.Line()
	if err != nil {
		return fmt.Errorf("stamp %s: %v: %w", s.VolumeID, err, backend.ErrInvalidArgument)
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	_, d, err := z.find(ctx, s.VolumeID)
	if err != nil {
		return err
	}
	if d.Identity == line {
		return nil
	}
	if _, err := z.run(ctx, "zfs", "set", PropIdentity+"="+line, d.Name); err != nil {
		return fmt.Errorf("stamp %s: %w", s.VolumeID, err)
	}
	return nil
}

// ReadStamp returns the zvol's stamp (one `zfs list`): (nil, nil) when it has none.
// Errors: backend.ErrNotFound; identity.ErrTorn, identity.ErrUnknownVersion.
func (z *ZFS) ReadStamp(ctx context.Context, id string) (*identity.Stamp, error) {
	_, d, err := z.find(ctx, id)
	if err != nil {
		return nil, err
	}
	return stampOf(d, id)
}
