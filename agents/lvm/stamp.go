package lvm

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

var _ backend.Stamper = (*LVM)(nil)

// stampOf reads the identity stamp among an LV's tags: (nil, nil) when it has none.
func stampOf(lv LV) (*identity.Stamp, error) {
	s, err := identity.FromLVTags(lv.Tags)
	if errors.Is(err, identity.ErrNoStamp) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if s.VolumeID != lv.Name {
		return nil, fmt.Errorf("%w: tags of LV %s name volume %s", identity.ErrTorn, lv.Name, s.VolumeID)
	}
	return &s, nil
}

// Stamp writes s as the LV's tags (plinth.dev/id.<key>=<value>) in one lvchange, removing
// the stamp tags it had that s does not hold: lvm2 commits the metadata change at once, so a
// crash leaves the old set or the new one. The LV's data is not touched. Errors:
// backend.ErrNotFound when the volume is absent, backend.ErrInvalidArgument for an invalid
// stamp.
func (l *LVM) Stamp(ctx context.Context, s identity.Stamp) error {
	tags, err := s.LVTags()
	if err != nil {
		return fmt.Errorf("stamp %s: %v: %w", s.VolumeID, err, backend.ErrInvalidArgument)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	_, lv, err := l.find(ctx, s.VolumeID)
	if err != nil {
		return err
	}
	var args []string
	for _, t := range lv.Tags {
		if strings.HasPrefix(t, identity.LVTagPrefix) && !slices.Contains(tags, t) {
			args = append(args, "--deltag", t)
		}
	}
	for _, t := range tags {
		if !slices.Contains(lv.Tags, t) {
			args = append(args, "--addtag", t)
		}
	}
	if len(args) == 0 {
		return nil
	}
	if _, err := l.run(ctx, "lvchange", append(args, l.cfg.VolumeGroup+"/"+lv.Name)...); err != nil {
		return fmt.Errorf("stamp %s: %w", s.VolumeID, err)
	}
	return nil
}

// ReadStamp returns the stamp among the LV's tags (a fresh lvs): (nil, nil) when it has
// none. Errors: backend.ErrNotFound; identity.ErrTorn, identity.ErrUnknownVersion.
func (l *LVM) ReadStamp(ctx context.Context, id string) (*identity.Stamp, error) {
	_, lv, err := l.find(ctx, id)
	if err != nil {
		return nil, err
	}
	return stampOf(lv)
}
