package registry_test

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/imagebuild"
	"github.com/plinth-storage/plinth/test/framework/registry"
	"github.com/plinth-storage/plinth/test/prereq"
)

// An image keeps its repository path and tag; only the registry changes.
func TestTarget(t *testing.T) {
	for _, c := range []struct{ ref, registry, want, err string }{
		{"ghcr.io/plinth-storage/plinth:v0.1.0", "127.0.0.1:5000", "127.0.0.1:5000/plinth-storage/plinth:v0.1.0", ""},
		{"registry.k8s.io/sig-storage/csi-provisioner:v6.4.0", "registry.example.com", "registry.example.com/sig-storage/csi-provisioner:v6.4.0", ""},
		{"registry.k8s.io/pause:3.10", "localhost:5000", "localhost:5000/pause:3.10", ""},
		{"docker.io/library/busybox:plinth", "10.0.2.2:5000", "10.0.2.2:5000/library/busybox:plinth", ""},
		{"plinth:v1", "127.0.0.1:5000", "", `image name "plinth:v1"`},
		{"ghcr.io/plinth-storage/plinth:v0.1.0", "registry.example.com:5000/mirror", "registry.example.com:5000/mirror/plinth-storage/plinth:v0.1.0", ""},
		{"ghcr.io/plinth-storage/plinth:v0.1.0", "127.0.0.1:5000/", "", `registry "127.0.0.1:5000/"`},
		{"ghcr.io/plinth-storage/plinth:v0.1.0", "127.0.0.1:5000@sha256:00", "", `registry "127.0.0.1:5000@sha256:00"`},
		{"ghcr.io/plinth-storage/plinth:v0.1.0", "127.0.0.1:5000/Mirror", "", `in registry "127.0.0.1:5000/Mirror"`},
		{"ghcr.io/plinth-storage/plinth:v0.1.0", "", "", `registry ""`},
	} {
		got, err := registry.Target(c.ref, c.registry, false)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("Target(%q, %q) = %v, %v; want an error with %q", c.ref, c.registry, got, err, c.err)
			}
			continue
		}
		if err != nil || got.String() != c.want {
			t.Errorf("Target(%q, %q) = %v, %v; want %s", c.ref, c.registry, got, err, c.want)
		}
	}
	// Plain HTTP: go-containerregistry's own rule for loopback, and insecure for other hosts.
	for _, c := range []struct {
		registry string
		insecure bool
		scheme   string
	}{{"127.0.0.1:5000", false, "http"}, {"localhost:5000", false, "http"}, {"registry.example.com", false, "https"}, {"registry.example.com", true, "http"}} {
		tag, err := registry.Target("ghcr.io/plinth-storage/plinth:v0.1.0", c.registry, c.insecure)
		if err != nil {
			t.Fatal(err)
		}
		if got := tag.Scheme(); got != c.scheme {
			t.Errorf("Target to %s (insecure %v): scheme %s, want %s", c.registry, c.insecure, got, c.scheme)
		}
	}
}

// writeImage writes a one-layer image named ref into dir/<file> as `make images` does.
func writeImage(t *testing.T, dir, file, ref, content string) imagebuild.Result {
	t.Helper()
	tree := imagebuild.NewTree()
	if err := tree.File("etc/plinth-test", 0o644, []byte(content), "test"); err != nil {
		t.Fatal(err)
	}
	created := time.Unix(1764590000, 0)
	img, err := imagebuild.Build(imagebuild.Spec{Ref: ref, Layers: []imagebuild.Layer{{Tree: tree, CreatedBy: "test"}}}, created)
	if err != nil {
		t.Fatal(err)
	}
	res, err := imagebuild.WriteArchive(filepath.Join(dir, file), ref, img, created)
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// Archives that are not one named image in an OCI layout are refused with the archive's name
// and what is wrong, before anything is pushed.
func TestOpenArchiveRefuses(t *testing.T) {
	dir := t.TempDir()
	tarOf := func(name string, entries map[string]string) string {
		var b bytes.Buffer
		tw := tar.NewWriter(&b)
		for n, data := range entries {
			if err := tw.WriteHeader(&tar.Header{Name: n, Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}); err != nil {
				t.Fatal(err)
			}
			tw.Write([]byte(data)) //nolint:errcheck // bytes.Buffer
		}
		tw.Close() //nolint:errcheck // bytes.Buffer
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
		return p
	}
	notTar := filepath.Join(dir, "not.tar")
	if err := os.WriteFile(notTar, []byte("this is not a tar archive, it is long enough to be read as a header block...."), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ file, err string }{
		{tarOf("escape.tar", map[string]string{"../evil": "x"}), `member "../evil" lies outside`},
		{tarOf("abs.tar", map[string]string{"/etc/evil": "x"}), `member "/etc/evil" lies outside`},
		{tarOf("nolayout.tar", map[string]string{"manifest.json": "[]"}), "not an OCI image layout"},
		{tarOf("empty-index.tar", map[string]string{"oci-layout": `{"imageLayoutVersion":"1.0.0"}`, "index.json": `{"schemaVersion":2,"manifests":[]}`}), "lists 0 manifests"},
		{notTar, "reading the tar"},
		{filepath.Join(dir, "missing.tar"), "no such file"},
	} {
		a, err := registry.OpenArchive(c.file)
		if err == nil {
			a.Close()
			t.Errorf("OpenArchive(%s): no error, want %q", filepath.Base(c.file), c.err)
			continue
		}
		if !strings.Contains(err.Error(), c.file) || !strings.Contains(err.Error(), c.err) {
			t.Errorf("OpenArchive(%s): %v; want the archive's path and %q", filepath.Base(c.file), err, c.err)
		}
	}
}

// checkInRegistry reads the manifest of each pushed image back from the registry and wants
// the archive's digest, and the archive's manifest bytes.
func checkInRegistry(t *testing.T, pushed []registry.Pushed) {
	t.Helper()
	for _, p := range pushed {
		desc, err := remote.Get(p.Target, remote.WithContext(t.Context()))
		if err != nil {
			t.Errorf("%s: read back %s: %v", p.Archive, p.Target, err)
			continue
		}
		if desc.Digest != p.Digest {
			t.Errorf("%s: %s has digest %s in the registry, the archive %s", p.Archive, p.Target, desc.Digest, p.Digest)
		}
		a, err := registry.OpenArchive(p.Archive)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := a.Image.RawManifest()
		a.Close()
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(raw, desc.Manifest) {
			t.Errorf("%s: the registry's manifest of %s differs from the archive's", p.Archive, p.Target)
		}
		// By digest too: what a kubelet pulls when a pod names the image by digest.
		byDigest, err := name.NewDigest(p.Target.Context().Name()+"@"+p.Digest.String(), name.StrictValidation)
		if err != nil {
			t.Fatal(err)
		}
		img, err := remote.Image(byDigest, remote.WithContext(t.Context()))
		if err != nil {
			t.Errorf("%s: pull %s: %v", p.Archive, byDigest, err)
			continue
		}
		layers, err := img.Layers()
		if err != nil {
			t.Errorf("%s: layers of %s: %v", p.Archive, byDigest, err)
		}
		for _, l := range layers {
			rc, err := l.Compressed()
			if err != nil {
				t.Errorf("%s: layer of %s: %v", p.Archive, byDigest, err)
				continue
			}
			rc.Close()
		}
	}
}

// Archives pushed to a real docker-registry are there under their targets with the archives'
// digests: two small images, pushed twice (the second push finds every blob there).
func TestPushToDockerRegistry(t *testing.T) {
	s := registry.ForTest(t)
	dir := t.TempDir()
	a := writeImage(t, dir, "a.tar", "ghcr.io/plinth-storage/plinth-test:v1", "a")
	b := writeImage(t, dir, "b.tar", "registry.k8s.io/sig-storage/other:v2", "b")
	for round := range 2 {
		pushed, err := registry.Push(t.Context(), s.Addr, false, a.Path, b.Path)
		if err != nil {
			t.Fatalf("round %d: %v", round, err)
		}
		if len(pushed) != 2 {
			t.Fatalf("round %d: %d pushed, want 2", round, len(pushed))
		}
		if got, want := pushed[0].Target.String(), s.Addr+"/plinth-storage/plinth-test:v1"; got != want {
			t.Errorf("target %s, want %s", got, want)
		}
		if pushed[0].Digest != a.Digest || pushed[1].Digest != b.Digest {
			t.Errorf("pushed digests %s %s, archives' %s %s", pushed[0].Digest, pushed[1].Digest, a.Digest, b.Digest)
		}
		checkInRegistry(t, pushed)
	}
	// An archive that fails stops the push and is named; the ones before it are pushed.
	bad := filepath.Join(dir, "bad.tar")
	if err := os.WriteFile(bad, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	pushed, err := registry.Push(t.Context(), s.Addr, false, a.Path, bad, b.Path)
	if err == nil || !strings.Contains(err.Error(), bad) || len(pushed) != 1 {
		t.Errorf("push with a bad archive: %d pushed, %v; want 1 and an error naming %s", len(pushed), err, bad)
	}
}

// Every image of `make images` goes into a real docker-registry with `make push`'s code and
// comes back with the archive's digest.
func TestPushEveryImage(t *testing.T) {
	var names []string
	for _, im := range imagebuild.Catalogue() {
		names = append(names, im.Name)
	}
	if !prereq.Strict() {
		dir := os.Getenv(controlplane.EnvImages)
		if bin, err := controlplane.TestBinDir(); dir == "" && err == nil {
			dir = filepath.Join(bin, "images")
		}
		if _, err := os.Stat(filepath.Join(dir, names[0]+".tar")); err != nil {
			prereq.Missing(t, "the image archives of make images: %v", err)
		}
	}
	archives := controlplane.ImageArchives(t, names...)
	s := registry.ForTest(t)
	pushed, err := registry.Push(t.Context(), s.Addr, false, archives...)
	if err != nil {
		t.Fatal(err)
	}
	if len(pushed) != len(names) {
		t.Fatalf("%d images pushed, want %d", len(pushed), len(names))
	}
	checkInRegistry(t, pushed)
	for _, p := range pushed {
		t.Logf("%-52s → %s %s", p.Source, p.Target, p.Digest)
	}
}
