// Package images_test proves the archives of `make images` in a real containerd: each imports
// with its name and its programs run (shared libraries present); and two builds from the same
// inputs are byte-identical.
//
// Integration tests: they run with PLINTH_INTEGRATION=1 (make test-integration, after make
// images) and need root, Debian's containerd, runc and ctr, and the archives in bin/images
// (PLINTH_IMAGES overrides the folder). Under CI=true a missing prerequisite fails.
package images_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/plinth-storage/plinth/test/framework/cluster"
	"github.com/plinth-storage/plinth/test/framework/controlplane"
	"github.com/plinth-storage/plinth/test/framework/imagebuild"
	"github.com/plinth-storage/plinth/test/framework/process"
	"github.com/plinth-storage/plinth/test/prereq"
)

func repoRoot() string {
	wd, _ := os.Getwd()
	return filepath.Join(wd, "..", "..")
}

// imagesDir is where make images wrote the archives.
func imagesDir() string {
	if d := os.Getenv("PLINTH_IMAGES"); d != "" {
		return d
	}
	return filepath.Join(repoRoot(), "bin", "images")
}

// require stops t through test/prereq (a failure under CI=true or PLINTH_INTEGRATION=1) when a
// prerequisite is missing.
func require(t *testing.T, ok bool, what string) {
	t.Helper()
	if ok {
		return
	}
	prereq.Missing(t, "%s", what)
}

func requireIntegration(t *testing.T) {
	t.Helper()
	prereq.Env(t, "PLINTH_INTEGRATION", "an integration test: make test-integration sets it")
	require(t, os.Geteuid() == 0, "root (containerd runs containers)")
	for _, tool := range []string{"containerd", "ctr", "runc"} {
		_, err := exec.LookPath(tool)
		require(t, err == nil, tool+" (hack/install-deps.sh installs Debian's containerd and runc)")
	}
}

// archiveRef reads the image name and manifest digest from an archive's index.json.
func archiveRef(t *testing.T, file string) (string, string) {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			t.Fatalf("%s: no index.json", file)
		}
		if err != nil {
			t.Fatalf("%s: %v", file, err)
		}
		if h.Name != "index.json" {
			continue
		}
		var idx v1.IndexManifest
		if err := json.NewDecoder(tr).Decode(&idx); err != nil {
			t.Fatalf("%s: index.json: %v", file, err)
		}
		if len(idx.Manifests) != 1 {
			t.Fatalf("%s: index.json has %d manifests, want 1", file, len(idx.Manifests))
		}
		return idx.Manifests[0].Annotations[imagebuild.AnnotationImageName], idx.Manifests[0].Digest.String()
	}
}

// containerd is a real containerd of the test's own (test/framework/cluster's runner, configured as
// a kubelet node's: its own socket, root and state; restrict_oom_score_adj, since root here
// lacks CAP_SYS_RESOURCE and nothing may lower an OOM score).
type containerd struct {
	*cluster.Containerd
	ids atomic.Int32
}

func startContainerd(t *testing.T) *containerd {
	t.Helper()
	// Short path: the socket path must fit in 108 bytes.
	dir, err := os.MkdirTemp("", "plinth-ctrd-")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cd, err := cluster.StartContainerd(ctx, cluster.ContainerdOptions{Name: "images-test", Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := cd.Stop(); err != nil {
			t.Errorf("stop containerd: %v", err)
		}
		if t.Failed() {
			data, _ := os.ReadFile(cd.LogPath())
			t.Logf("containerd log (last lines):\n%s", process.Tail(data, 30))
		}
		// Snapshot mounts are gone with the containers (ctr run --rm); a leftover mount would
		// make RemoveAll fail, which is reported, not hidden.
		if err := os.RemoveAll(dir); err != nil {
			t.Errorf("remove %s: %v", dir, err)
		}
	})
	return &containerd{Containerd: cd}
}

// ctr runs ctr against this containerd in the k8s.io namespace (the kubelet's).
func (c *containerd) ctr(ctx context.Context, args ...string) (string, error) {
	out, err := c.Ctr(ctx, args...)
	return string(out), err
}

// run runs args in a new container of ref (ctr run --rm; args replace the image's entrypoint
// and command, none runs the entrypoint) and returns its output.
func (c *containerd) run(ctx context.Context, ref string, args ...string) (string, error) {
	id := fmt.Sprintf("plinth-images-%d-%d", os.Getpid(), c.ids.Add(1))
	return c.ctr(ctx, append([]string{"run", "--rm", ref, id}, args...)...)
}

// TestImagesRunInContainerd imports every archive of make images into a real containerd and
// runs each image's programs.
func TestImagesRunInContainerd(t *testing.T) {
	requireIntegration(t)
	dir := imagesDir()
	refs := map[string]string{}
	for _, im := range imagebuild.Catalogue() {
		file := filepath.Join(dir, im.Name+".tar")
		if _, err := os.Stat(file); err != nil {
			// requireIntegration made a missing prerequisite a failure: no image is left out
			// with a log line that no skip count sees.
			prereq.Missing(t, "%s (make images builds it): %v", file, err)
		}
		ref, digest := archiveRef(t, file)
		refs[im.Name] = ref
		t.Logf("%s: %s %s", im.Name, ref, digest)
	}
	c := startContainerd(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()

	require(t, len(refs) > 0, "no archive in "+dir+" (make images)")
	for _, im := range imagebuild.Catalogue() {
		if refs[im.Name] == "" {
			continue
		}
		file := filepath.Join(dir, im.Name+".tar")
		if _, err := c.ctr(ctx, "images", "import", file); err != nil {
			t.Fatalf("import %s: %v", file, err)
		}
		_, digest := archiveRef(t, file)
		out, err := c.ctr(ctx, "images", "ls", "name=="+refs[im.Name])
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, refs[im.Name]) || !strings.Contains(out, digest) {
			t.Fatalf("after importing %s, ctr images ls does not show %s at %s:\n%s", file, refs[im.Name], digest, out)
		}
	}

	cases := []struct {
		image string
		args  []string
		want  string // in the output
	}{
		{"plinth", nil, "Plinth: a GitOps storage fleet manager"}, // the ENTRYPOINT, no arguments: help
		{"plinth", []string{"/usr/bin/plinth", "version"}, "plinth v"},
		{"plinth", []string{"plinth", "agent", "--help"}, "--state-dir"},
		{"plinth", []string{"lvm", "version"}, "LVM version"},
		{"plinth", []string{"lvcreate", "--version"}, "LVM version"},
		{"plinth", []string{"thin_check", "--version"}, "0."},
		{"plinth", []string{"nvme", "version"}, "nvme version"},
		{"plinth", []string{"mkfs.ext4", "-V"}, "mke2fs"},
		{"plinth", []string{"resize2fs"}, "Usage: resize2fs"},
		{"plinth", []string{"mkfs.xfs", "-V"}, "mkfs.xfs version"},
		{"plinth", []string{"xfs_growfs", "-V"}, "xfs_growfs version"},
		{"plinth", []string{"losetup", "--version"}, "util-linux"},
		{"plinth", []string{"mount", "--version"}, "util-linux"},
		{"plinth", []string{"blkid", "--version"}, "util-linux"},
		{"plinth", []string{"wipefs", "--version"}, "util-linux"},
		{"plinth", []string{"blockdev", "--version"}, "util-linux"},
		{"plinth", []string{"modprobe", "--version"}, "kmod version"},
		{"plinth-scheduler", []string{"/usr/bin/plinth-scheduler", "--version"}, "Kubernetes v"},
		{"plinth-scheduler", []string{"plinth-scheduler", "--help"}, "--config"},
		{"csi-provisioner", []string{"/csi-provisioner", "--version"}, "csi-provisioner"},
		{"csi-attacher", []string{"/csi-attacher", "--version"}, "csi-attacher"},
		{"csi-resizer", []string{"/csi-resizer", "--version"}, "csi-resizer"},
		{"busybox", []string{"sh", "-c", "echo ok; ls /bin/sh; sha256sum /etc/passwd; df / >/dev/null && dd if=/dev/zero of=/tmp/x bs=4k count=1 2>/dev/null && cat /tmp/x | wc -c"}, "ok"},
	}
	for _, tc := range cases {
		name := tc.image + " " + strings.Join(tc.args, " ")
		if tc.args == nil {
			name = tc.image + " (entrypoint)"
		}
		t.Run(name, func(t *testing.T) {
			if refs[tc.image] == "" {
				prereq.Missing(t, "no archive of %s under bin/images (make images)", tc.image)
			}
			out, err := c.run(ctx, refs[tc.image], tc.args...)
			// resize2fs without arguments prints its usage and exits 1: only the output counts.
			usage := tc.args != nil && tc.args[0] == "resize2fs"
			if err != nil && !usage {
				t.Fatal(err)
			}
			if err == nil && !strings.Contains(out, tc.want) {
				// ctr run can lose the output of a process that exits at once (seen with ctr 1.6:
				// the task is deleted before its stdout is copied); the program ran, so run it
				// once more to read what it prints.
				t.Logf("first run printed %q; running again", out)
				if out, err = c.run(ctx, refs[tc.image], tc.args...); err != nil {
					t.Fatal(err)
				}
			}
			if !strings.Contains(out, tc.want) {
				t.Fatalf("output lacks %q:\n%s", tc.want, out)
			}
			if strings.Contains(out, "error while loading shared libraries") {
				t.Fatalf("a shared library is missing:\n%s", out)
			}
		})
	}

	t.Run("pause waits for SIGTERM", func(t *testing.T) {
		if refs["pause"] == "" {
			prereq.Missing(t, "no archive of pause under bin/images (make images)")
		}
		id := fmt.Sprintf("plinth-images-pause-%d", os.Getpid())
		if _, err := c.ctr(ctx, "run", "-d", refs["pause"], id); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _, _ = c.ctr(context.Background(), "containers", "delete", id) })
		controlplane.Eventually(t, 30*time.Second, 100*time.Millisecond, "pause task RUNNING", func() error {
			out, err := c.ctr(ctx, "tasks", "ls")
			if err != nil {
				return err
			}
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[0] == id && f[2] == "RUNNING" {
					return nil
				}
			}
			return fmt.Errorf("tasks: %s", out)
		})
		if _, err := c.ctr(ctx, "tasks", "kill", "--signal", "SIGTERM", id); err != nil {
			t.Fatal(err)
		}
		controlplane.Eventually(t, 30*time.Second, 100*time.Millisecond, "pause task STOPPED after SIGTERM", func() error {
			out, err := c.ctr(ctx, "tasks", "ls")
			if err != nil {
				return err
			}
			for _, line := range strings.Split(out, "\n") {
				if f := strings.Fields(line); len(f) == 3 && f[0] == id && f[2] != "STOPPED" {
					return fmt.Errorf("pause is %s", f[2])
				}
			}
			return nil
		})
		if _, err := c.ctr(ctx, "tasks", "delete", id); err != nil {
			t.Fatal(err)
		}
	})
}

// TestImagesReproducible builds the whole set twice from the same inputs (the binaries and
// the .deb cache make images left) and compares the archives byte for byte.
func TestImagesReproducible(t *testing.T) {
	prereq.Env(t, "PLINTH_INTEGRATION", "an integration test: make test-integration sets it")
	dir := imagesDir()
	binDir := os.Getenv(controlplane.EnvTestBin)
	if binDir == "" {
		binDir = filepath.Join(repoRoot(), "bin")
	}
	for _, f := range []string{filepath.Join(dir, ".bin", "plinth"), filepath.Join(dir, ".bin", "pause")} {
		_, err := os.Stat(f)
		require(t, err == nil, f+" (make images)")
	}
	// Images from make testbin's binaries: all of them (PLINTH_INTEGRATION=1 above makes a
	// missing one a failure, not a log line that no skip count sees).
	var only []string
	for _, im := range imagebuild.Catalogue() {
		if im.Name == "plinth" || im.Name == "pause" || im.Name == "busybox" {
			only = append(only, im.Name)
			continue
		}
		if _, err := os.Stat(filepath.Join(binDir, im.Name)); err != nil {
			prereq.Missing(t, "the input of image %s (make testbin): %v", im.Name, err)
		}
		only = append(only, im.Name)
	}
	sidecars, err := imagebuild.ReadVersions(filepath.Join(repoRoot(), "test", "tools", "versions.env"))
	if err != nil {
		t.Fatal(err)
	}
	in := imagebuild.Inputs{
		Version: "v0.0.0-test", Revision: "0123456789abcdef0123456789abcdef01234567", Source: "https://example.org/plinth",
		Created: time.Unix(1764590000, 0), Plinth: filepath.Join(dir, ".bin", "plinth"), Pause: filepath.Join(dir, ".bin", "pause"),
		BinDir: binDir, Sidecars: sidecars, DebCache: filepath.Join(dir, ".debs"), Log: io.Discard,
	}
	ctx := context.Background()
	a, b := t.TempDir(), t.TempDir()
	ra, err := imagebuild.BuildAll(ctx, in, a, only)
	if err != nil {
		t.Fatal(err)
	}
	rb, err := imagebuild.BuildAll(ctx, in, b, only)
	if err != nil {
		t.Fatal(err)
	}
	if len(ra) != len(only) || len(rb) != len(ra) {
		t.Fatalf("built %d and %d images, want %d", len(ra), len(rb), len(only))
	}
	for i := range ra {
		da, err := os.ReadFile(ra[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		db, err := os.ReadFile(rb[i].Path)
		if err != nil {
			t.Fatal(err)
		}
		if ra[i].Digest != rb[i].Digest || !bytes.Equal(da, db) {
			t.Errorf("%s: two builds differ: %s (%d bytes) vs %s (%d bytes)", ra[i].Ref, ra[i].Digest, len(da), rb[i].Digest, len(db))
		}
	}
}

// TestPlinthImageContents reads the plinth image's files from its archive (the docker-save
// view, as crane push reads it): the Debian package list is recorded, and there is no
// documentation, compiler, shell or package manager.
func TestPlinthImageContents(t *testing.T) {
	prereq.Env(t, "PLINTH_INTEGRATION", "an integration test: make test-integration sets it")
	file := filepath.Join(imagesDir(), "plinth.tar")
	_, err := os.Stat(file)
	require(t, err == nil, file+" (make images builds it)")
	img, err := tarball.ImageFromPath(file, nil)
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Config.Entrypoint, " "); got != "/usr/bin/plinth" {
		t.Errorf("entrypoint %q, want /usr/bin/plinth", got)
	}
	for _, l := range []string{"org.opencontainers.image.source", "org.opencontainers.image.version", "org.opencontainers.image.revision", "dev.plinth.debian-packages"} {
		if cfg.Config.Labels[l] == "" {
			t.Errorf("label %s is missing", l)
		}
	}
	files := map[string]string{}
	tr := tar.NewReader(mutate.Extract(img))
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data := ""
		if h.Name == "usr/share/plinth/packages.txt" {
			b, _ := io.ReadAll(tr)
			data = string(b)
		}
		files[h.Name] = data
	}
	list := files["usr/share/plinth/packages.txt"]
	for _, p := range imagebuild.NodePackages {
		if !strings.Contains(list, "\n"+p+" ") && !strings.HasPrefix(list, p+" ") {
			t.Errorf("packages.txt does not list %s:\n%s", p, list)
		}
	}
	for name := range files {
		for _, bad := range []string{"usr/share/doc/", "usr/share/man/", "usr/bin/gcc", "usr/bin/dpkg", "usr/bin/apt", "usr/bin/bash", "usr/bin/sh", "usr/bin/perl", "usr/bin/python3"} {
			if strings.HasPrefix(name, bad) {
				t.Errorf("the plinth image holds %s", name)
			}
		}
	}
	for _, want := range []string{"usr/bin/plinth", "usr/sbin/lvm", "usr/sbin/nvme", "usr/sbin/mkfs.xfs", "usr/sbin/losetup", "usr/sbin/thin_check", "usr/bin/kmod", "usr/sbin/cryptsetup"} {
		if _, ok := files[want]; !ok {
			t.Errorf("the plinth image lacks %s", want)
		}
	}
}
