package imagebuild

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Annotations of index.json that name the image: containerd's `ctr images import` (and the
// CRI) takes the full name from the first, docker load from either; the second holds the tag,
// as the OCI image layout specification describes it.
const (
	AnnotationImageName = "io.containerd.image.name"
	AnnotationRefName   = "org.opencontainers.image.ref.name"
)

// Layer is one layer of a Spec: a tree and the history line that says what it holds.
type Layer struct {
	Tree      *Tree
	CreatedBy string
}

// Spec describes one linux/amd64 image.
type Spec struct {
	// Ref is the image's full name with registry and tag ("ghcr.io/plinth-storage/plinth:v0.1.0",
	// "docker.io/library/busybox:plinth"), as runtimes record it after an import.
	Ref        string
	Layers     []Layer
	Entrypoint []string
	Cmd        []string
	Env        []string
	// User is the config's user ("" = root, as the runtime's default).
	User       string
	WorkingDir string
	Labels     map[string]string
}

// Build makes the image of s: an empty base, the config (created at the given time), then one
// gzip-compressed layer per Spec layer, each file stamped with that time. Media types are
// Docker schema 2, which containerd, Docker, CRI-O and registries all accept and which a
// docker-save reader recomputes to the same digest.
func Build(s Spec, created time.Time) (v1.Image, error) {
	if _, err := ParseRef(s.Ref); err != nil {
		return nil, err
	}
	created = time.Unix(created.Unix(), 0).UTC()
	cfg := &v1.ConfigFile{
		Architecture: "amd64",
		OS:           "linux",
		Created:      v1.Time{Time: created},
		Config: v1.Config{
			Entrypoint: s.Entrypoint,
			Cmd:        s.Cmd,
			Env:        s.Env,
			User:       s.User,
			WorkingDir: s.WorkingDir,
			Labels:     s.Labels,
		},
		RootFS: v1.RootFS{Type: "layers"},
	}
	img, err := mutate.ConfigFile(empty.Image, cfg)
	if err != nil {
		return nil, err
	}
	var adds []mutate.Addendum
	for _, l := range s.Layers {
		raw, err := l.Tree.Layer(created)
		if err != nil {
			return nil, fmt.Errorf("image %s, layer %q: %w", s.Ref, l.CreatedBy, err)
		}
		layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(raw)), nil
		}, tarball.WithCompressionLevel(gzip.BestCompression), tarball.WithCompressedCaching)
		if err != nil {
			return nil, fmt.Errorf("image %s, layer %q: %w", s.Ref, l.CreatedBy, err)
		}
		adds = append(adds, mutate.Addendum{Layer: layer, History: v1.History{Created: v1.Time{Time: created}, CreatedBy: l.CreatedBy}})
	}
	return mutate.Append(img, adds...)
}

// ParseRef checks that ref is a full image name with an explicit registry and tag, and returns
// the parsed tag.
func ParseRef(ref string) (name.Tag, error) {
	t, err := name.NewTag(ref, name.StrictValidation)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image name %q: %w", ref, err)
	}
	first, _, _ := strings.Cut(ref, "/")
	if !strings.ContainsAny(first, ".:") && first != "localhost" {
		return name.Tag{}, fmt.Errorf("image name %q: name the registry (docker.io/library/…), as runtimes record the full name", ref)
	}
	return t, nil
}

// Result says what WriteArchive wrote.
type Result struct {
	Ref    string
	Digest v1.Hash // of the image manifest
	// Size is the sum of the compressed layers, the config and the manifest in bytes: what a
	// registry stores and a pull transfers.
	Size int64
	Path string
}

// WriteArchive writes img, named ref, to the file path as a tar holding an OCI image layout
// (oci-layout, index.json with the name annotations, blobs/sha256/…) and a docker-save
// manifest.json pointing at the same blobs. Entries are sorted and stamped with mtime. The tar
// is written to a temporary file beside path and renamed to path only when complete, so path
// never holds half an archive.
func WriteArchive(path, ref string, img v1.Image, mtime time.Time) (Result, error) {
	res := Result{Ref: ref, Path: path}
	tag, err := ParseRef(ref)
	if err != nil {
		return res, err
	}
	dir, err := os.MkdirTemp(filepath.Dir(path), ".layout-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return res, fmt.Errorf("writing the layout of %s: %w", ref, err)
	}
	if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
		AnnotationImageName: ref,
		AnnotationRefName:   tag.TagStr(),
	})); err != nil {
		return res, fmt.Errorf("writing the layout of %s: %w", ref, err)
	}

	m, err := img.Manifest()
	if err != nil {
		return res, err
	}
	if res.Digest, err = img.Digest(); err != nil {
		return res, err
	}
	rawManifest, err := img.RawManifest()
	if err != nil {
		return res, err
	}
	res.Size = int64(len(rawManifest)) + m.Config.Size
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }
	docker := tarball.Manifest{{Config: blob(m.Config.Digest), RepoTags: []string{ref}}}
	for _, l := range m.Layers {
		docker[0].Layers = append(docker[0].Layers, blob(l.Digest))
		res.Size += l.Size
	}
	dockerJSON, err := json.Marshal(docker)
	if err != nil {
		return res, err
	}

	// The archive is a tree of its own: the layout's files plus manifest.json.
	t := NewTree()
	err = filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		if d.IsDir() {
			return t.Dir(filepath.ToSlash(rel), 0o755)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return t.File(filepath.ToSlash(rel), 0o644, data, "layout")
	})
	if err != nil {
		return res, fmt.Errorf("reading the layout of %s: %w", ref, err)
	}
	if err := t.File("manifest.json", 0o644, dockerJSON, "docker-save manifest"); err != nil {
		return res, err
	}
	data, err := t.Layer(mtime)
	if err != nil {
		return res, err
	}
	return res, writeFileAtomic(path, data)
}

// writeFileAtomic writes data to a temporary file in path's folder, syncs it and renames it
// to path.
func writeFileAtomic(path string, data []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-")
	if err != nil {
		return err
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, 0o644)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}
