package nvmet

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strings"
	"syscall"
)

// FS is the set of configfs operations the target uses. Paths are absolute.
// The production implementation (OSFS) issues exactly one syscall per call, as
// configfs requires: an attribute is stored by a single write(2), a group is
// created by mkdir(2) and removed by rmdir(2), a link is created by
// symlink(2) and removed by unlink(2).
type FS interface {
	// Mkdir creates a configfs group (mkdir(2)).
	Mkdir(path string) error
	// Rmdir removes a configfs group (rmdir(2)).
	Rmdir(path string) error
	// ReadAttr returns an attribute's value without the trailing newline.
	ReadAttr(path string) (string, error)
	// WriteAttr stores an attribute with one write(2) on an existing file
	// (never O_CREAT: configfs attributes cannot be created).
	WriteAttr(path, value string) error
	// Symlink creates link pointing at target (symlink(2)).
	Symlink(target, link string) error
	// Unlink removes a link (unlink(2)).
	Unlink(path string) error
	// ReadDir lists the names in a directory.
	ReadDir(path string) ([]string, error)
	// Readlink returns a link's target.
	Readlink(path string) (string, error)
	// Exists reports whether path exists, without following a final link.
	Exists(path string) (bool, error)
}

// OSFS is the FS of the running kernel.
type OSFS struct{}

var _ FS = OSFS{}

// Mkdir implements FS.
func (OSFS) Mkdir(path string) error { return wrap("mkdir", path, syscall.Mkdir(path, 0o755)) }

// Rmdir implements FS.
func (OSFS) Rmdir(path string) error { return wrap("rmdir", path, syscall.Rmdir(path)) }

// ReadAttr implements FS.
func (OSFS) ReadAttr(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", wrap("read", path, err)
	}
	return strings.TrimSuffix(string(b), "\n"), nil
}

// WriteAttr implements FS.
func (OSFS) WriteAttr(path, value string) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return wrap("write", path, err)
	}
	_, err = f.Write([]byte(value))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return wrap("write", path, err)
}

// Symlink implements FS.
func (OSFS) Symlink(target, link string) error {
	return wrap("symlink", link, syscall.Symlink(target, link))
}

// Unlink implements FS.
func (OSFS) Unlink(path string) error { return wrap("unlink", path, syscall.Unlink(path)) }

// ReadDir implements FS.
func (OSFS) ReadDir(path string) ([]string, error) {
	ents, err := os.ReadDir(path)
	if err != nil {
		return nil, wrap("readdir", path, err)
	}
	names := make([]string, 0, len(ents))
	for _, e := range ents {
		names = append(names, e.Name())
	}
	return names, nil
}

// Readlink implements FS.
func (OSFS) Readlink(path string) (string, error) {
	t, err := os.Readlink(path)
	return t, wrap("readlink", path, err)
}

// Exists implements FS.
func (OSFS) Exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return err == nil, wrap("lstat", path, err)
}

// ConfigfsError is a failed configfs operation: the operation, the configfs
// path and the underlying error (usually a syscall.Errno, so errors.Is(err,
// syscall.EBUSY) works).
type ConfigfsError struct {
	Op   string
	Path string
	Err  error
}

func (e *ConfigfsError) Error() string {
	return fmt.Sprintf("nvmet configfs %s %s: %v", e.Op, e.Path, e.Err)
}

func (e *ConfigfsError) Unwrap() error { return e.Err }

// wrap turns err into a *ConfigfsError carrying the bare errno (a *PathError
// would repeat the path).
func wrap(op, path string, err error) error {
	if err == nil {
		return nil
	}
	var ce *ConfigfsError
	if errors.As(err, &ce) {
		return err
	}
	var pe *fs.PathError
	if errors.As(err, &pe) {
		err = pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		err = le.Err
	}
	return &ConfigfsError{Op: op, Path: path, Err: err}
}
