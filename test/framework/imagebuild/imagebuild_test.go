package imagebuild

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"sigs.k8s.io/yaml"

	"github.com/plinth-storage/plinth/test/prereq"
)

var epoch = time.Unix(1764590000, 0)

type tarEntry struct {
	Name, Link string
	Type       byte
	Mode       int64
	Data       string
}

func readTar(t *testing.T, b []byte) []tarEntry {
	t.Helper()
	var out []tarEntry
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if !h.ModTime.Equal(epoch) || h.Uid != 0 || h.Gid != 0 || h.Uname != "" || h.Gname != "" {
			t.Errorf("%s: mtime %v uid %d gid %d uname %q gname %q; want %v, 0, 0, empty names", h.Name, h.ModTime, h.Uid, h.Gid, h.Uname, h.Gname, epoch)
		}
		data, _ := io.ReadAll(tr)
		out = append(out, tarEntry{h.Name, h.Linkname, h.Typeflag, h.Mode, string(data)})
	}
}

// debTar is a package data archive as dpkg-deb --fsys-tarfile writes it: "./" paths, files
// under /bin and /lib, a hard link, a symlink.
func debTar(t *testing.T) []byte {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	add := func(h *tar.Header, data string) {
		h.Size = int64(len(data))
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			tw.Write([]byte(data))
		}
	}
	add(&tar.Header{Name: "./", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "./bin/", Typeflag: tar.TypeDir, Mode: 0o755}, "")
	add(&tar.Header{Name: "./sbin/zz-tool", Typeflag: tar.TypeReg, Mode: 0o4755, Uid: 1000, Uname: "builder", ModTime: time.Now()}, "tool")
	add(&tar.Header{Name: "./sbin/aa-tool", Typeflag: tar.TypeLink, Linkname: "./sbin/zz-tool"}, "")
	add(&tar.Header{Name: "./lib/x86_64-linux-gnu/libx.so.1", Typeflag: tar.TypeSymlink, Linkname: "libx.so.1.2"}, "")
	add(&tar.Header{Name: "./usr/share/doc/pkg/copyright", Typeflag: tar.TypeReg, Mode: 0o644}, "doc")
	tw.Close()
	return b.Bytes()
}

func TestTreeLayer(t *testing.T) {
	tr := NewTree()
	if err := tr.UsrMergeLinks(); err != nil {
		t.Fatal(err)
	}
	if err := tr.AddTar(bytes.NewReader(debTar(t)), "pkg", func(p string) bool { return !dropped(p) }); err != nil {
		t.Fatal(err)
	}
	if err := tr.File("etc/passwd", 0o644, []byte("root\n"), "test"); err != nil {
		t.Fatal(err)
	}
	raw, err := tr.Layer(epoch)
	if err != nil {
		t.Fatal(err)
	}
	got := readTar(t, raw)
	want := []tarEntry{
		{Name: "bin", Link: "usr/bin", Type: tar.TypeSymlink, Mode: 0o777},
		{Name: "etc/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "etc/passwd", Type: tar.TypeReg, Mode: 0o644, Data: "root\n"},
		{Name: "lib", Link: "usr/lib", Type: tar.TypeSymlink, Mode: 0o777},
		{Name: "lib64", Link: "usr/lib64", Type: tar.TypeSymlink, Mode: 0o777},
		{Name: "sbin", Link: "usr/sbin", Type: tar.TypeSymlink, Mode: 0o777},
		{Name: "usr/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/lib/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/lib/x86_64-linux-gnu/", Type: tar.TypeDir, Mode: 0o755},
		{Name: "usr/lib/x86_64-linux-gnu/libx.so.1", Link: "libx.so.1.2", Type: tar.TypeSymlink, Mode: 0o777},
		{Name: "usr/sbin/", Type: tar.TypeDir, Mode: 0o755},
		// The hard link sorts before its target: the first path carries the data.
		{Name: "usr/sbin/aa-tool", Type: tar.TypeReg, Mode: 0o4755, Data: "tool"},
		{Name: "usr/sbin/zz-tool", Link: "usr/sbin/aa-tool", Type: tar.TypeLink, Mode: 0o4755},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("layer:\n got %+v\nwant %+v", got, want)
	}
	again, err := tr.Layer(epoch)
	if err != nil || !bytes.Equal(raw, again) {
		t.Errorf("a second Layer call differs (err %v)", err)
	}
	// The library check follows the merged-/usr links.
	if r := tr.resolve("/lib/x86_64-linux-gnu/../../sbin/zz-tool"); r != "usr/sbin/zz-tool" {
		t.Errorf("resolve through /lib and /sbin links = %q", r)
	}
}

func TestTreeConflict(t *testing.T) {
	tr := NewTree()
	if err := tr.File("usr/bin/x", 0o755, []byte("a"), "pkg-a"); err != nil {
		t.Fatal(err)
	}
	if err := tr.File("usr/bin/x", 0o755, []byte("a"), "pkg-b"); err != nil {
		t.Errorf("an identical second copy is an error: %v", err)
	}
	err := tr.File("/usr/bin/x", 0o755, []byte("b"), "pkg-c")
	if err == nil || !strings.Contains(err.Error(), "pkg-a") || !strings.Contains(err.Error(), "pkg-c") {
		t.Errorf("a different second copy: error %v, want one naming pkg-a and pkg-c", err)
	}
}

func TestParseStanza(t *testing.T) {
	p, err := parseStanza([]byte(`Package: xfsprogs
Version: 6.1.0-1
Architecture: amd64
Depends: libblkid1 (>= 2.17.2), libc6 (>= 2.34), python3:any, mawk | gawk [amd64]
Pre-Depends: libuuid1
Description: utilities
 long text: with a colon
SHA256: abc
Size: 123
`))
	if err != nil {
		t.Fatal(err)
	}
	want := Package{Name: "xfsprogs", Version: "6.1.0-1", Architecture: "amd64", SHA256: "abc", Size: 123,
		Depends: [][]string{{"libuuid1"}, {"libblkid1"}, {"libc6"}, {"python3"}, {"mawk", "gawk"}}}
	if !reflect.DeepEqual(p, want) {
		t.Errorf("got %+v\nwant %+v", p, want)
	}
	if got := (Package{Name: "busybox-static", Version: "1:1.35.0-4", Architecture: "amd64"}).DebFile(); got != "busybox-static_1%3a1.35.0-4_amd64.deb" {
		t.Errorf("DebFile = %s", got)
	}
	if _, err := parseStanza([]byte("Package: x\nVersion: 1\n")); err == nil {
		t.Error("a stanza without Architecture and SHA256 is accepted")
	}
}

func needApt(t *testing.T) {
	t.Helper()
	for _, tool := range []string{"apt-cache", "apt-get", "dpkg-deb"} {
		if _, err := exec.LookPath(tool); err != nil {
			prereq.Missing(t, "%s (Debian's apt and dpkg)", tool)
		}
	}
}

// TestResolveMissingPackage: a package the apt metadata lacks stops the build with its name.
func TestResolveMissingPackage(t *testing.T) {
	needApt(t)
	_, err := Resolve(context.Background(), []string{"kmod", "no-such-package-plinth"}, nil)
	if err == nil || !strings.Contains(err.Error(), `"no-such-package-plinth"`) {
		t.Fatalf("Resolve: error %v, want one naming no-such-package-plinth", err)
	}
}

// TestResolveClosure: the closure of kmod holds its libraries, never an excluded package.
func TestResolveClosure(t *testing.T) {
	needApt(t)
	pkgs, err := Resolve(context.Background(), []string{"kmod"}, map[string]string{"libssl3": "test"})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, p := range pkgs {
		names[p.Name] = true
	}
	for _, n := range []string{"kmod", "libkmod2", "libc6", "liblzma5"} {
		if !names[n] {
			t.Errorf("closure of kmod lacks %s: %v", n, names)
		}
	}
	if names["libssl3"] {
		t.Error("the excluded libssl3 is in the closure")
	}
}

// TestFetchFailedDownload: a package that cannot be downloaded stops with its name and leaves
// no file under the cache name.
func TestFetchFailedDownload(t *testing.T) {
	needApt(t)
	dir := t.TempDir()
	p := Package{Name: "kmod", Version: "0.0-no-such-version", Architecture: "amd64", SHA256: "00"}
	_, err := Fetch(context.Background(), dir, []Package{p}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "kmod 0.0-no-such-version") {
		t.Fatalf("Fetch: error %v, want one naming kmod 0.0-no-such-version", err)
	}
	if _, err := os.Stat(filepath.Join(dir, p.DebFile())); !os.IsNotExist(err) {
		t.Errorf("a file is left under the cache name: %v", err)
	}
}

func smallImage(t *testing.T, data string) v1.Image {
	t.Helper()
	tr := NewTree()
	if err := tr.File("hello", 0o755, []byte(data), "test"); err != nil {
		t.Fatal(err)
	}
	img, err := Build(Spec{Ref: "example.org/test/hello:v1", Layers: []Layer{{Tree: tr, CreatedBy: "test"}},
		Entrypoint: []string{"/hello"}, Labels: map[string]string{"a": "b"}}, epoch)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

// TestWriteArchive: the archive is an OCI layout naming the image and a docker-save archive
// of the same image; writing it twice gives the same bytes.
func TestWriteArchive(t *testing.T) {
	dir := t.TempDir()
	ref := "example.org/test/hello:v1"
	res, err := WriteArchive(filepath.Join(dir, "hello.tar"), ref, smallImage(t, "hi"), epoch)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := os.ReadFile(res.Path)
	if err != nil {
		t.Fatal(err)
	}
	res2, err := WriteArchive(filepath.Join(dir, "again.tar"), ref, smallImage(t, "hi"), epoch)
	if err != nil {
		t.Fatal(err)
	}
	raw2, _ := os.ReadFile(res2.Path)
	if !bytes.Equal(raw, raw2) || res.Digest != res2.Digest {
		t.Errorf("two writes differ: %s %s", res.Digest, res2.Digest)
	}
	if other, _ := WriteArchive(filepath.Join(dir, "other.tar"), ref, smallImage(t, "ho"), epoch); other.Digest == res.Digest {
		t.Error("another file content gives the same digest")
	}

	// docker-save view (what docker load and crane push read): the same manifest digest.
	img, err := tarball.ImageFromPath(res.Path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if d, err := img.Digest(); err != nil || d != res.Digest {
		t.Errorf("docker-save view: digest %s (%v), want %s", d, err, res.Digest)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if !cfg.Created.Time.Equal(epoch) || cfg.Config.Entrypoint[0] != "/hello" || cfg.Config.Labels["a"] != "b" || cfg.OS != "linux" || cfg.Architecture != "amd64" {
		t.Errorf("config: %+v", cfg)
	}

	// OCI layout view (what ctr images import reads): the index names the image.
	entries := readTar(t, raw)
	layoutDir := t.TempDir()
	for _, e := range entries {
		p := filepath.Join(layoutDir, e.Name)
		if e.Type == tar.TypeDir {
			os.MkdirAll(p, 0o755)
			continue
		}
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte(e.Data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	idx, err := layout.ImageIndexFromPath(layoutDir)
	if err != nil {
		t.Fatal(err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		t.Fatal(err)
	}
	if len(im.Manifests) != 1 || im.Manifests[0].Digest != res.Digest ||
		im.Manifests[0].Annotations[AnnotationImageName] != ref || im.Manifests[0].Annotations[AnnotationRefName] != "v1" {
		t.Errorf("index.json: %+v", im.Manifests)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name)
	}
	for _, n := range []string{"oci-layout", "index.json", "manifest.json"} {
		if !strings.Contains(strings.Join(names, " "), n) {
			t.Errorf("archive lacks %s: %v", n, names)
		}
	}
	var m tarball.Manifest
	for _, e := range entries {
		if e.Name == "manifest.json" {
			if err := json.Unmarshal([]byte(e.Data), &m); err != nil {
				t.Fatal(err)
			}
		}
	}
	if len(m) != 1 || len(m[0].RepoTags) != 1 || m[0].RepoTags[0] != ref {
		t.Errorf("manifest.json: %+v", m)
	}
	leftovers, _ := filepath.Glob(filepath.Join(dir, ".*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary files left: %v", leftovers)
	}
}

// TestWriteArchiveBadInput: a bad name is refused and nothing is written.
func TestWriteArchiveBadInput(t *testing.T) {
	dir := t.TempDir()
	for _, ref := range []string{"hello:v1", "example.org/Hello:v1", "example.org/hello"} {
		if _, err := WriteArchive(filepath.Join(dir, "x.tar"), ref, smallImage(t, "hi"), epoch); err == nil {
			t.Errorf("%s: accepted", ref)
		}
	}
	if files, _ := os.ReadDir(dir); len(files) != 0 {
		t.Errorf("files written: %v", files)
	}
}

func TestStaticBinary(t *testing.T) {
	if _, err := staticBinary("/bin/sh"); err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Errorf("/bin/sh: %v, want a dynamically-linked error", err)
	}
	if _, err := staticBinary(filepath.Join(t.TempDir(), "missing")); err == nil {
		t.Error("a missing binary is accepted")
	}
}

func TestReadVersions(t *testing.T) {
	v, err := ReadVersions("../../../test/tools/versions.env")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range Sidecars {
		if !strings.HasPrefix(v[s.Name], "v") {
			t.Errorf("%s: version %q", s.Name, v[s.Name])
		}
	}
}

// TestImagesComponent: kustomize/components/images names exactly what make images builds for
// Plinth and its sidecars, at the Makefile's VERSION and the versions file's sidecar versions.
func TestImagesComponent(t *testing.T) {
	mk, err := os.ReadFile("../../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^VERSION := (\S+)$`).FindSubmatch(mk)
	if m == nil {
		t.Fatal("Makefile: no VERSION := line")
	}
	version := string(m[1])
	sidecars, err := ReadVersions("../../../test/tools/versions.env")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{
		"plinth":           PlinthImage + ":" + version,
		"plinth-scheduler": SchedulerImage + ":" + version,
	}
	for _, s := range Sidecars {
		want[s.Name] = s.Image + ":" + sidecars[s.Name]
	}
	data, err := os.ReadFile("../../../kustomize/components/images/kustomization.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var comp struct {
		Images []struct {
			Name    string `json:"name"`
			NewName string `json:"newName"`
			NewTag  string `json:"newTag"`
		} `json:"images"`
	}
	if err := yaml.Unmarshal(data, &comp); err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, im := range comp.Images {
		got[im.Name] = im.NewName + ":" + im.NewTag
	}
	for n, ref := range want {
		if got[n] != ref {
			t.Errorf("images component: %s is %q, make images builds %q", n, got[n], ref)
		}
	}
}
