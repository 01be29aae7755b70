package raw

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

// The identity stamp of a raw volume lives in its disk's stamp area, because nothing of the
// GPT can hold it: a partition name holds 36 UTF-16 units (the volume id already fills them
// with the unique GUID), its attributes 64 bits, and every byte of the partition is the
// consumer's. The area is the second half of the first MiB of the disk, between the GPT's
// 128 partition entries (the GPT Ensure writes; they end at 17 KiB with 512-byte sectors,
// 24 KiB with 4 KiB ones) and the first partition, which AlignBytes puts at 1 MiB or later:
// sfdisk records the first usable LBA at 1 MiB, so no partitioning tool allocates there,
// and the raw backend refuses disks with partitions of others (Ensure). A disk with a
// partition inside the area gets no stamps (an error per volume, reported).
//
// Slot n (a GPT entry number, 1..StampSlots) is the StampSlotBytes at StampAreaOffset +
// (n-1)·StampSlotBytes: StampMagic, then identity.Stamp.Text, then zero bytes to the slot's
// end. A slot of zeros holds no stamp. A slot is written whole with one pwrite and an fsync of
// the disk: a write torn at a sector boundary leaves a mix whose checksum fails (torn, never
// adopted), and a slot left by a deleted partition names another volume (torn too, rewritten
// by the agent's next pass for the volume that owns the number now).
const (
	// StampAreaOffset is where the stamp area starts on the disk, in bytes.
	StampAreaOffset = 512 << 10
	// StampSlotBytes is one slot: a power of two holding the longest record (4096 bytes).
	StampSlotBytes = 4 << 10
	// StampSlots is the number of slots: GPT's 128 partition entries.
	StampSlots = 128
	// StampMagic starts every written slot.
	StampMagic = "plinth.dev/identity\n"
)

var _ backend.Stamper = (*Raw)(nil)

// slotOffset is the disk offset of partition number n's slot; an error when n has none or
// when the disk's layout leaves no room for the area.
func (d *disk) slotOffset(n int) (int64, error) {
	if n < 1 || n > StampSlots {
		return 0, fmt.Errorf("partition %d of %s: no stamp slot (1..%d)", n, d.declared, StampSlots)
	}
	for _, p := range d.t.Partitions {
		if p.Start*d.t.SectorSize < StampAreaOffset+StampSlots*StampSlotBytes {
			return 0, fmt.Errorf("%s: partition %d starts at byte %d, inside the stamp area", d.declared, p.Number, p.Start*d.t.SectorSize)
		}
	}
	return StampAreaOffset + int64(n-1)*StampSlotBytes, nil
}

func (r *Raw) open(dev string, flag int) (*os.File, error) {
	if r.cfg.OpenDevice != nil {
		return r.cfg.OpenDevice(dev, flag)
	}
	return os.OpenFile(dev, flag, 0)
}

// decodeSlot reads the stamp of volume id from a slot: (nil, nil) for a slot of zeros.
func decodeSlot(slot []byte, id string) (*identity.Stamp, error) {
	if i := bytes.IndexByte(slot, 0); i >= 0 {
		if bytes.Count(slot[i:], []byte{0}) != len(slot)-i {
			return nil, fmt.Errorf("%w: stamp slot of %s has bytes after its end", identity.ErrTorn, id)
		}
		slot = slot[:i]
	}
	if len(slot) == 0 {
		return nil, nil
	}
	text, ok := bytes.CutPrefix(slot, []byte(StampMagic))
	if !ok {
		return nil, fmt.Errorf("%w: stamp slot of %s does not start with %q", identity.ErrTorn, id, StampMagic)
	}
	s, err := identity.ParseText(string(text))
	if err != nil {
		return nil, err
	}
	if s.VolumeID != id {
		return nil, fmt.Errorf("%w: stamp slot of %s names volume %s (a deleted partition's)", identity.ErrTorn, id, s.VolumeID)
	}
	return &s, nil
}

// readStamps fills the stamps of the Plinth volumes of d (by partition number) with one
// read of the slots they use; a disk that cannot be opened or read leaves each volume's
// StampErr set, never a wrong stamp.
func (r *Raw) readStamps(d *disk, vols map[int]*backend.Volume) {
	if len(vols) == 0 {
		return
	}
	lo, hi := int64(-1), int64(0)
	for n, v := range vols {
		off, err := d.slotOffset(n)
		if err != nil {
			v.StampErr = err
			continue
		}
		if lo < 0 || off < lo {
			lo = off
		}
		hi = max(hi, off+StampSlotBytes)
	}
	if lo < 0 {
		return
	}
	buf := make([]byte, hi-lo)
	f, err := r.open(d.dev, os.O_RDONLY)
	if err == nil {
		_, err = f.ReadAt(buf, lo)
		f.Close()
	}
	for n, v := range vols {
		if v.StampErr != nil {
			continue
		}
		if err != nil {
			v.StampErr = fmt.Errorf("read the stamp area of %s: %w", d.declared, err)
			continue
		}
		off, _ := d.slotOffset(n)
		v.Stamp, v.StampErr = decodeSlot(buf[off-lo:off-lo+StampSlotBytes], v.ID)
	}
}

// writeSlot writes slot n of d whole (text nil: zeros) and fsyncs the disk.
func (r *Raw) writeSlot(d *disk, n int, text []byte) error {
	off, err := d.slotOffset(n)
	if err != nil {
		return err
	}
	slot := make([]byte, StampSlotBytes)
	if text != nil {
		if len(StampMagic)+len(text) > StampSlotBytes {
			return fmt.Errorf("stamp of %d bytes does not fit a slot: %w", len(text), backend.ErrInvalidArgument)
		}
		copy(slot[copy(slot, StampMagic):], text)
	}
	f, err := r.open(d.dev, os.O_RDWR)
	if err != nil {
		return err
	}
	_, err = f.WriteAt(slot, off)
	if err == nil {
		err = f.Sync()
	}
	return errors.Join(err, f.Close())
}

// Stamp writes s into the slot of its volume's partition (one 4 KiB write and an fsync of the
// disk, outside every partition: the volume's data is not touched). Nothing is written when
// the slot holds s already. Errors: backend.ErrNotFound when no partition carries the
// volume, backend.ErrInvalidArgument for an invalid stamp, an error when the disk's layout
// leaves no room for the stamp area.
func (r *Raw) Stamp(ctx context.Context, s identity.Stamp) error {
	text, err := s.Text()
	if err != nil {
		return fmt.Errorf("stamp %s: %v: %w", s.VolumeID, err, backend.ErrInvalidArgument)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	st, err := r.refresh(ctx)
	if err != nil {
		return err
	}
	d, p, ok := st.find(s.VolumeID)
	if !ok {
		return fmt.Errorf("stamp %s: %w", s.VolumeID, backend.ErrNotFound)
	}
	v := &backend.Volume{ID: s.VolumeID}
	r.readStamps(d, map[int]*backend.Volume{p.Number: v})
	if v.StampErr == nil && v.Stamp != nil && *v.Stamp == s {
		return nil
	}
	if err := r.writeSlot(d, p.Number, []byte(text)); err != nil {
		return fmt.Errorf("stamp %s: %w", s.VolumeID, err)
	}
	return nil
}

// ReadStamp returns the stamp of volume id (one sfdisk --json per disk and one read):
// (nil, nil) when it has none. Errors: backend.ErrNotFound; identity.ErrTorn,
// identity.ErrUnknownVersion; the disk's read error.
func (r *Raw) ReadStamp(ctx context.Context, id string) (*identity.Stamp, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return nil, err
	}
	st, err := r.refresh(ctx)
	if err != nil {
		return nil, err
	}
	d, p, ok := st.find(id)
	if !ok {
		return nil, fmt.Errorf("volume %s: %w", id, backend.ErrNotFound)
	}
	v := &backend.Volume{ID: id}
	r.readStamps(d, map[int]*backend.Volume{p.Number: v})
	return v.Stamp, v.StampErr
}
