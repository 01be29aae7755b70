package imagebuild

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"path"
	"sort"
	"strings"
	"time"
)

// Tree is an in-memory file tree that becomes one image layer. Paths are relative to the image
// root ("usr/bin/lvm"). Every entry is owned by root; its modification time is set only when
// the layer is written. The zero value is not usable: call NewTree.
type Tree struct {
	entries map[string]*entry
}

type entry struct {
	typ      byte // tar.TypeDir, tar.TypeReg, tar.TypeSymlink or tar.TypeLink
	mode     int64
	linkname string // symlink target as written, or the tree path of a hard link's target
	data     []byte
	origin   string // who put it there (a package name, "plinth"), for error messages
}

// NewTree returns an empty tree.
func NewTree() *Tree { return &Tree{entries: map[string]*entry{}} }

// cleanPath makes p relative to the image root ("../x" stays inside it, as "x"); it fails on
// a path that names the root itself.
func cleanPath(p string) (string, error) {
	c := path.Clean("/" + p)
	if c == "/" {
		return "", fmt.Errorf("path %q names the image root", p)
	}
	return strings.TrimPrefix(c, "/"), nil
}

// Dir adds a directory with the permission bits mode (e.g. 0o755, 0o1777).
func (t *Tree) Dir(p string, mode int64) error {
	c, err := cleanPath(p)
	if err != nil {
		return err
	}
	if e, ok := t.entries[c]; ok && e.typ != tar.TypeDir {
		return fmt.Errorf("%s: directory wanted where %s put a non-directory", c, e.origin)
	}
	t.entries[c] = &entry{typ: tar.TypeDir, mode: mode}
	return nil
}

// File adds a regular file with the permission bits mode; origin says who adds it. A second
// file at the same path is an error unless it is identical.
func (t *Tree) File(p string, mode int64, data []byte, origin string) error {
	return t.put(p, &entry{typ: tar.TypeReg, mode: mode, data: data, origin: origin})
}

// Symlink adds a symbolic link at p pointing to target (kept as written).
func (t *Tree) Symlink(p, target, origin string) error {
	return t.put(p, &entry{typ: tar.TypeSymlink, mode: 0o777, linkname: target, origin: origin})
}

func (t *Tree) put(p string, e *entry) error {
	c, err := cleanPath(p)
	if err != nil {
		return err
	}
	if old, ok := t.entries[c]; ok {
		if old.typ == e.typ && old.mode == e.mode && old.linkname == e.linkname && bytes.Equal(old.data, e.data) {
			return nil
		}
		return fmt.Errorf("%s: shipped by both %s and %s with different contents", c, old.origin, e.origin)
	}
	t.entries[c] = e
	return nil
}

// Has reports whether the tree holds an entry at p.
func (t *Tree) Has(p string) bool {
	c, err := cleanPath(p)
	if err != nil {
		return false
	}
	_, ok := t.entries[c]
	return ok
}

// Remove deletes the entry at p and, for a directory, everything below it.
func (t *Tree) Remove(p string) {
	c, err := cleanPath(p)
	if err != nil {
		return
	}
	for k := range t.entries {
		if k == c || strings.HasPrefix(k, c+"/") {
			delete(t.entries, k)
		}
	}
}

// Paths returns every path in the tree, sorted.
func (t *Tree) Paths() []string {
	ps := make([]string, 0, len(t.entries))
	for p := range t.entries {
		ps = append(ps, p)
	}
	sort.Strings(ps)
	return ps
}

// usrMerged maps the top-level folders Debian bookworm packages still ship into to where a
// merged-/usr system keeps them (Debian 12 is merged-/usr: /bin is a symlink to usr/bin).
var usrMerged = map[string]string{"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib32": "usr/lib32", "lib64": "usr/lib64", "libx32": "usr/libx32"}

// UsrMergeLinks adds the merged-/usr symlinks (/bin → usr/bin, /sbin, /lib, /lib64) that
// AddTar's path mapping assumes.
func (t *Tree) UsrMergeLinks() error {
	for _, top := range []string{"bin", "sbin", "lib", "lib64"} {
		if err := t.Symlink(top, usrMerged[top], "usrmerge"); err != nil {
			return err
		}
	}
	return nil
}

func mergeUsr(p string) string {
	top, rest, _ := strings.Cut(p, "/")
	if to, ok := usrMerged[top]; ok {
		if rest == "" {
			return to
		}
		return to + "/" + rest
	}
	return p
}

// AddTar adds the entries of the tar stream r (a Debian package's data, as `dpkg-deb
// --fsys-tarfile` writes it) as origin, with paths mapped to merged /usr. keep, if not nil,
// decides per mapped path whether the entry is taken. Directories merge; device nodes and
// FIFOs are refused (no package of the node layer ships one).
func (t *Tree) AddTar(r io.Reader, origin string, keep func(p string) bool) error {
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the files of %s: %w", origin, err)
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		if name == "" {
			continue // "./"
		}
		p := mergeUsr(name)
		if keep != nil && !keep(p) {
			continue
		}
		mode := h.Mode & 0o7777
		switch h.Typeflag {
		case tar.TypeDir:
			if _, top := usrMerged[name]; top {
				continue // /bin, /lib… are the merged-/usr symlinks
			}
			if e, ok := t.entries[p]; ok && e.typ == tar.TypeDir {
				continue
			}
			if err := t.Dir(p, mode); err != nil {
				return err
			}
		case tar.TypeReg:
			data, err := io.ReadAll(tr)
			if err != nil {
				return fmt.Errorf("reading %s of %s: %w", name, origin, err)
			}
			if err := t.File(p, mode, data, origin); err != nil {
				return err
			}
		case tar.TypeSymlink:
			if err := t.Symlink(p, h.Linkname, origin); err != nil {
				return err
			}
		case tar.TypeLink:
			target := mergeUsr(strings.TrimPrefix(path.Clean("/"+h.Linkname), "/"))
			if keep != nil && !keep(target) {
				continue
			}
			if err := t.put(p, &entry{typ: tar.TypeLink, mode: mode, linkname: target, origin: origin}); err != nil {
				return err
			}
		default:
			return fmt.Errorf("%s of %s: tar entry type %q is not supported", name, origin, h.Typeflag)
		}
	}
}

// resolve follows symlinks (at most 40, as the kernel does) to the entry a path names, with
// parent folders that are symlinks resolved too. It returns "" when the path is absent.
func (t *Tree) resolve(p string) string {
	p = strings.TrimPrefix(path.Clean("/"+p), "/")
	for range 40 {
		parts := strings.Split(p, "/")
		changed := false
		for i := 1; i <= len(parts); i++ {
			prefix := strings.Join(parts[:i], "/")
			e, ok := t.entries[prefix]
			if !ok {
				return ""
			}
			if e.typ == tar.TypeSymlink {
				target := e.linkname
				if !strings.HasPrefix(target, "/") {
					target = path.Join(path.Dir("/"+prefix), target)
				}
				p = strings.TrimPrefix(path.Clean(path.Join(append([]string{target}, parts[i:]...)...)), "/")
				changed = true
				break
			}
		}
		if !changed {
			return p
		}
	}
	return ""
}

// Layer writes the tree as an uncompressed layer tar: missing parent folders are added (0755),
// entries sorted by path, every modification time set to mtime, owner and group 0 with no
// names. A group of hard links is written as a regular file at the path that sorts first and
// links to it, so every link follows its target in the stream.
func (t *Tree) Layer(mtime time.Time) ([]byte, error) {
	for _, p := range t.Paths() {
		for d := path.Dir(p); d != "."; d = path.Dir(d) {
			if _, ok := t.entries[d]; !ok {
				t.entries[d] = &entry{typ: tar.TypeDir, mode: 0o755}
			}
		}
	}
	// Hard links: canonical path of each group = the smallest path.
	canon := map[string]string{}
	for _, p := range t.Paths() {
		e := t.entries[p]
		if e.typ != tar.TypeLink {
			continue
		}
		target, ok := t.entries[e.linkname]
		if !ok || target.typ != tar.TypeReg {
			return nil, fmt.Errorf("%s (from %s): hard link to %s, which is not a regular file in the image", p, e.origin, e.linkname)
		}
		c := e.linkname
		if prev, ok := canon[e.linkname]; ok {
			c = prev
		}
		if p < c {
			c = p
		}
		canon[e.linkname] = c
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Unix(mtime.Unix(), 0).UTC()
	for _, p := range t.Paths() {
		e := t.entries[p]
		h := &tar.Header{Name: p, Mode: e.mode, ModTime: mt}
		data := e.data
		switch e.typ {
		case tar.TypeDir:
			h.Typeflag, h.Name = tar.TypeDir, p+"/"
		case tar.TypeSymlink:
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.linkname
		case tar.TypeReg, tar.TypeLink:
			target := p
			if e.typ == tar.TypeLink {
				target = e.linkname
			}
			c, grouped := canon[target]
			h.Mode = t.entries[target].mode
			if !grouped || c == p {
				h.Typeflag, data = tar.TypeReg, t.entries[target].data
			} else {
				h.Typeflag, h.Linkname, data = tar.TypeLink, c, nil
			}
		}
		h.Size = int64(len(data))
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("writing %s: %w", p, err)
		}
		if _, err := tw.Write(data); err != nil {
			return nil, fmt.Errorf("writing %s: %w", p, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
