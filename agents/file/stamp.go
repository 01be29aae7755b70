package file

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/plinth-storage/plinth/agents/backend"
	"github.com/plinth-storage/plinth/internal/identity"
)

// stampSuffix names a volume's identity record beside its image: <volume id>.id
// (identity.Stamp.Text, docs/design.md "Volume identity stamp").
const stampSuffix = ".id"

var _ backend.Stamper = (*File)(nil)

// Stamp writes the identity record of volume s.VolumeID: a temp file, fsync, rename, fsync
// of the directory, so a crash leaves the old record or the new one, never half of one.
// The image is not opened. Errors: backend.ErrNotFound when the image is absent,
// backend.ErrInvalidArgument for an invalid stamp.
func (f *File) Stamp(ctx context.Context, s identity.Stamp) error {
	path, err := f.path(s.VolumeID)
	if err != nil {
		return err
	}
	text, err := s.Text()
	if err != nil {
		return fmt.Errorf("stamp %s: %v: %w", s.VolumeID, err, backend.ErrInvalidArgument)
	}
	defer f.volumeOp(s.VolumeID)()
	if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("stamp %s: %w", s.VolumeID, backend.ErrNotFound)
	}
	return writeAtomic(filepath.Join(f.cfg.Directory, s.VolumeID+stampSuffix), []byte(text))
}

func writeAtomic(path string, data []byte) (err error) {
	tmp := path + ".tmp"
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			os.Remove(tmp)
		}
	}()
	if _, err = fh.Write(data); err == nil {
		err = fh.Sync()
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err = os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(filepath.Dir(path))
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// ReadStamp returns the identity record of volume id: (nil, nil) when it has none.
func (f *File) ReadStamp(ctx context.Context, id string) (*identity.Stamp, error) {
	if err := backend.ValidateVolumeID(id); err != nil {
		return nil, err
	}
	return f.readStamp(id)
}

// readStamp reads the record of volume id: (nil, nil) when it has none.
func (f *File) readStamp(id string) (*identity.Stamp, error) {
	fh, err := os.Open(filepath.Join(f.cfg.Directory, id+stampSuffix))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer fh.Close()
	b, err := io.ReadAll(io.LimitReader(fh, 8192))
	if err != nil {
		return nil, err
	}
	s, err := identity.ParseText(string(b))
	if err != nil {
		return nil, err
	}
	if s.VolumeID != id {
		return nil, fmt.Errorf("%w: record of %s names volume %s", identity.ErrTorn, id, s.VolumeID)
	}
	return &s, nil
}

// removeStamp deletes the record of volume id (absent: nothing to do).
func (f *File) removeStamp(id string) error {
	record := filepath.Join(f.cfg.Directory, id+stampSuffix)
	// the temp file of a write a crash cut short goes too: nothing else would remove it
	for _, p := range []string{record + ".tmp", record} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}
