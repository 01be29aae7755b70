// Package registry puts the image archives of `make images` into an OCI registry, and runs
// Debian's docker-registry (CNCF distribution) on loopback for the tests and test clusters
// that pull from one.
//
// An image keeps its repository path and tag and changes only its registry:
// ghcr.io/plinth-storage/plinth:v0.1.0 pushed to 127.0.0.1:5000 is
// 127.0.0.1:5000/plinth-storage/plinth:v0.1.0, registry.k8s.io/pause:3.10 is
// 127.0.0.1:5000/pause:3.10 (see Target). The manifest is pushed byte for byte as the archive
// holds it, so its digest in the registry is the archive's.
package registry

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/plinth-storage/plinth/test/framework/imagebuild"
)

// Target returns where the image named ref ("ghcr.io/plinth-storage/plinth:v0.1.0", a full
// name with registry and tag) goes in registry ("host", "host:port", or either with a path
// prefix: "host:port/mirror"): ref's repository path and tag under registry. insecure allows
// plain HTTP to registry (go-containerregistry speaks HTTP to localhost and 127.0.0.1 without
// it). The error names ref or registry when either is not a valid image name.
func Target(ref, registry string, insecure bool) (name.Tag, error) {
	src, err := imagebuild.ParseRef(ref)
	if err != nil {
		return name.Tag{}, err
	}
	if registry == "" || strings.Contains(registry, "@") || strings.HasSuffix(registry, "/") || strings.HasPrefix(registry, "/") {
		return name.Tag{}, fmt.Errorf("registry %q: want host, host:port or host:port/prefix", registry)
	}
	opts := []name.Option{name.StrictValidation}
	if insecure {
		opts = append(opts, name.Insecure)
	}
	t, err := name.NewTag(registry+"/"+src.RepositoryStr()+":"+src.TagStr(), opts...)
	if err != nil {
		return name.Tag{}, fmt.Errorf("image %s in registry %q: %w", ref, registry, err)
	}
	return t, nil
}

// Archive is an image archive of `make images` (imagebuild.WriteArchive: a tar of an OCI
// image layout whose index.json names one image), unpacked into a temporary folder until
// Close.
type Archive struct {
	// Path is the archive's file.
	Path string
	// Ref is the image's full name (index.json's io.containerd.image.name annotation).
	Ref string
	// Digest is the image manifest's digest as index.json records it.
	Digest v1.Hash
	// Image reads the manifest, config and layers from the unpacked layout, byte for byte.
	Image v1.Image

	dir string
}

// OpenArchive unpacks the archive at path and reads its one image. The error names the
// archive: not a tar, a member outside the archive's folder, no or several images in
// index.json, an image without a name annotation.
func OpenArchive(file string) (*Archive, error) {
	dir, err := os.MkdirTemp("", "plinth-push-")
	if err != nil {
		return nil, err
	}
	a := &Archive{Path: file, dir: dir}
	if err := a.open(); err != nil {
		a.Close()
		return nil, fmt.Errorf("image archive %s: %w", file, err)
	}
	return a, nil
}

func (a *Archive) open() error {
	if err := untar(a.Path, a.dir); err != nil {
		return err
	}
	idx, err := layout.ImageIndexFromPath(a.dir)
	if err != nil {
		return fmt.Errorf("not an OCI image layout: %w", err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return err
	}
	if len(im.Manifests) != 1 {
		return fmt.Errorf("index.json lists %d manifests, want one image", len(im.Manifests))
	}
	desc := im.Manifests[0]
	a.Ref = desc.Annotations[imagebuild.AnnotationImageName]
	if a.Ref == "" {
		return fmt.Errorf("index.json: the image has no %s annotation", imagebuild.AnnotationImageName)
	}
	if _, err := imagebuild.ParseRef(a.Ref); err != nil {
		return err
	}
	a.Digest = desc.Digest
	if a.Image, err = idx.Image(desc.Digest); err != nil {
		return fmt.Errorf("image %s: %w", desc.Digest, err)
	}
	return nil
}

// Close removes the unpacked layout.
func (a *Archive) Close() error { return os.RemoveAll(a.dir) }

// untar writes the regular files and folders of the tar at file into dir.
func untar(file, dir string) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the tar: %w", err)
		}
		rel := path.Clean(h.Name)
		if rel == "." || path.IsAbs(rel) || rel == ".." || strings.HasPrefix(rel, "../") {
			return fmt.Errorf("member %q lies outside the archive's folder", h.Name)
		}
		dst := filepath.Join(dir, filepath.FromSlash(rel))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(dst, 0o755); err != nil {
				return err
			}
		case tar.TypeReg:
			if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
				return err
			}
			out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o644)
			if err != nil {
				return err
			}
			_, err = io.Copy(out, tr)
			if cerr := out.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return fmt.Errorf("member %s: %w", h.Name, err)
			}
		default:
			return fmt.Errorf("member %q: type %q, want files and folders only", h.Name, h.Typeflag)
		}
	}
}

// Pushed says what Push did with one archive.
type Pushed struct {
	// Archive is the archive's file; Source the image's name in it.
	Archive, Source string
	// Target is where the image now is (Target of Source).
	Target name.Tag
	// Digest is the manifest's digest, the archive's and the registry's.
	Digest v1.Hash
}

// Push pushes the image of each archive (files of `make images`, bin/images/<name>.tar) to
// registry under Target of its name, with the credentials of the Docker config
// (~/.docker/config.json, as crane and docker login keep them) when it has some. insecure
// allows plain HTTP to a registry that is not on loopback. Blobs the registry has already are
// not sent again. It stops at the first archive that fails, with an error naming it, and
// returns what it pushed before.
func Push(ctx context.Context, registry string, insecure bool, archives ...string) ([]Pushed, error) {
	var out []Pushed
	for _, file := range archives {
		p, err := pushOne(ctx, registry, insecure, file)
		if err != nil {
			return out, err
		}
		out = append(out, p)
	}
	return out, nil
}

func pushOne(ctx context.Context, registry string, insecure bool, file string) (Pushed, error) {
	a, err := OpenArchive(file)
	if err != nil {
		return Pushed{}, err
	}
	defer a.Close()
	dst, err := Target(a.Ref, registry, insecure)
	if err != nil {
		return Pushed{}, fmt.Errorf("image archive %s: %w", file, err)
	}
	if err := remote.Write(dst, a.Image, remote.WithContext(ctx), remote.WithAuthFromKeychain(authn.DefaultKeychain)); err != nil {
		return Pushed{}, fmt.Errorf("push %s (%s) to %s: %w", file, a.Ref, dst, err)
	}
	return Pushed{Archive: file, Source: a.Ref, Target: dst, Digest: a.Digest}, nil
}
